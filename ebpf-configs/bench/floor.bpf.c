// The floor of `make bench-ebpf`: empty programs on the three tracepoints block_io runs on for
// every read (a bio, a request issued, a request completed). What they measure per run is the
// cost of running any program there (dispatch, and bpf_stats' own two clock reads): the part of
// block_io's time per I/O that no change inside its programs can remove.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

// ebpf_exporter wants a metric in every config: this one is never written.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} bench_floor_total SEC(".maps");

SEC("tp_btf/block_bio_queue")
int BPF_PROG(block_bio_queue, struct bio *bio)
{
    return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue, struct request *rq)
{
    return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
    return 0;
}

char LICENSE[] SEC("license") = "GPL";

// block_io's immediate counting (Linux 5.10+), what block_io_immediate.bpf.c builds: each
// observation goes straight into the exported maps, two per-CPU hash updates (bucket and sum), and
// each bio two more for its cgroup. No lag between an I/O and its counts, no bpf_loop() and no
// timer, so it loads from 5.10; ~1.5x the BPF time per I/O of the batched counting
// (block_batched.bpf.h), which loads from 5.17.
//
// What block_io.bpf.c provides before including this: the exported maps, observe_now() and the
// bucket ranges; block_cgroups.bpf.h unless BLOCK_IO_NO_CGROUPS. What it defines:
// observe_bio_size(), observe_request(), observe_service() and observe_cgroup_bio(), as
// block_batched.bpf.h does.
#ifndef BLOCKSTACK_BLOCK_IMMEDIATE_BPF_H
#define BLOCKSTACK_BLOCK_IMMEDIATE_BPF_H

static __always_inline void observe_bio_size(u32 dev, u8 op, u64 bytes)
{
    observe_now(&block_bio_size_bytes, dev, op, 0, bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
}

// queued: whether queue_ns is a sample (devices with an I/O scheduler)
static __always_inline void observe_request(u32 dev, u8 op, u64 bytes, bool queued, u64 queue_ns)
{
    observe_now(&block_rq_size_bytes, dev, op, 0, bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
    if (queued)
        observe_now(&block_rq_latency_seconds, dev, op, LATENCY_QUEUE, queue_ns, LATENCY_BUCKET_MIN,
                    LATENCY_BUCKET_MAX);
}

static __always_inline void observe_service(u32 dev, u8 op, u64 service_ns)
{
    observe_now(&block_rq_latency_seconds, dev, op, LATENCY_SERVICE, service_ns, LATENCY_BUCKET_MIN,
                LATENCY_BUCKET_MAX);
}

#ifndef BLOCK_IO_NO_CGROUPS
// A bio of `bytes` of cgroup cg to device dev: counted under the cgroup if it holds one of the
// device's slots (block_cgroups.bpf.h), else under "other".
static __always_inline void observe_cgroup_bio(u32 dev, u8 op, struct cgroup *cg, u64 bytes)
{
    u32 slot;
    u64 id = cgroup_account(dev, cg, bytes, &slot);

    cgroup_add(&block_cgroup_bios_total, dev, op, id, 1);
    cgroup_add(&block_cgroup_bio_bytes_total, dev, op, id, bytes);
}
#endif

#endif // BLOCKSTACK_BLOCK_IMMEDIATE_BPF_H

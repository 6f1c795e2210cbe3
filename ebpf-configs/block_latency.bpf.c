// Block request latency per device and operation, in two stages:
//   queue   = block_rq_insert -> block_rq_issue   (time in the scheduler / software queues)
//   service = block_rq_issue  -> block_rq_complete (time in the driver and the device)
// Requests that the block layer hands straight to the driver (no scheduler, driver not busy)
// are never inserted, so they have a service sample but no queue sample.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "block.bpf.h"

// Devices we expect on a host; every (device, operation, stage) uses LATENCY_SLOTS keys.
#define MAX_DEVICES 256

// Operations: enum op_class in block.bpf.h.
#define MAX_OPS 5

// queue and service.
#define MAX_STAGES 2

// Nanosecond buckets: 2^10 ns (~1 us, everything faster counts here) to 2^36 ns (~68.7 s, and
// everything slower). Must match bucket_min / bucket_max in block_latency.yaml.
#define LATENCY_BUCKET_MIN 10
#define LATENCY_BUCKET_MAX 36
// Buckets plus the sum slot.
#define LATENCY_SLOTS (LATENCY_BUCKET_MAX - LATENCY_BUCKET_MIN + 2)

// Timestamps of requests in flight live in a direct-mapped table indexed by a hash of the request
// address, each slot tagged with the request it belongs to. An array lookup is a few instructions
// (the verifier inlines it) where a hash map update + lookup + delete per request cost ~200 ns,
// which at the 250k+ IOPS of a fast device is several percent of a CPU. When a request takes a
// slot still held by another request in flight, the earlier one's sample is dropped: with k
// requests in flight about k / INFLIGHT_SLOTS of samples (0.8 % at k = 128, 6 % at k = 1024),
// the longest-running ones a little more often. 2^14 slots of 16 bytes: 256 KiB, cache-friendly.
#define INFLIGHT_SLOTS_BITS 14
#define INFLIGHT_SLOTS (1 << INFLIGHT_SLOTS_BITS)

// 2^64 / golden ratio: Fibonacci hashing spreads pointers that differ in a few middle bits
// (requests are carved out of one allocation at a fixed stride) over all slots.
#define GOLDEN_RATIO_64 0x9E3779B97F4A7C15ULL

enum latency_stage {
    LATENCY_QUEUE = 0,
    LATENCY_SERVICE = 1,
};

// One slot: the request that owns it and one timestamp. Request addresses are at least 8-byte
// aligned, so the low bit of `tag` says which event the timestamp is from.
#define TAG_INSERTED 1ULL

struct inflight {
    u64 tag; // request address (issued) or address | TAG_INSERTED (inserted); 0 if free
    u64 ts;  // bpf_ktime_get_ns() of that event
};

struct latency_key {
    u32 dev;
    u8 op;
    u8 stage;
    u8 pad[2];
    u64 bucket;
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, INFLIGHT_SLOTS);
    __type(key, u32);
    __type(value, struct inflight);
} inflight SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * MAX_OPS * MAX_STAGES * LATENCY_SLOTS));
    __type(key, struct latency_key);
    __type(value, u64);
} block_rq_latency_seconds SEC(".maps");

// The request's address as a number. The verifier forbids arithmetic on a typed kernel pointer,
// so the address is copied out of the tracepoint's argument array (ctx[0]) as plain bytes.
static __always_inline u64 request_id(u64 *ctx)
{
    u64 id = 0;

    bpf_probe_read_kernel(&id, sizeof(id), &ctx[0]);
    return id;
}

static __always_inline struct inflight *slot_of(u64 id)
{
    u32 index = (id * GOLDEN_RATIO_64) >> (64 - INFLIGHT_SLOTS_BITS);

    return bpf_map_lookup_elem(&inflight, &index);
}

static __always_inline void observe(struct request *rq, u8 stage, u64 delta_ns)
{
    struct latency_key key = {};

    key.dev = request_dev(rq);
    if (!key.dev)
        return;
    key.op = op_class(rq->cmd_flags);
    key.stage = stage;
    histogram_observe(&block_rq_latency_seconds, key, delta_ns, LATENCY_BUCKET_MIN, LATENCY_BUCKET_MAX);
}

// TP_PROTO(struct request *rq) since 5.11 (commit a54895fa057c, "block: remove the request_queue
// argument to the block_rq_insert/issue tracepoints").
SEC("tp_btf/block_rq_insert")
int BPF_PROG(block_rq_insert, struct request *rq)
{
    u64 id = request_id(ctx);
    struct inflight *slot = slot_of(id);

    if (!slot)
        return 0;
    slot->tag = id | TAG_INSERTED;
    slot->ts = bpf_ktime_get_ns();
    return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue, struct request *rq)
{
    u64 id = request_id(ctx);
    struct inflight *slot = slot_of(id);
    u64 now = bpf_ktime_get_ns();

    if (!slot)
        return 0;
    if (slot->tag == (id | TAG_INSERTED))
        observe(rq, LATENCY_QUEUE, now - slot->ts);
    slot->tag = id;
    slot->ts = now;
    return 0;
}

// blk_update_request() fires this for every chunk it completes; the sample ends with the chunk
// that finishes the request (nr_bytes covers what is left of it). The slot is only read here, not
// cleared: issue and completion often run on different CPUs, and a write would pull the slot's
// cache line back and forth once more per request. A later request reusing the slot overwrites it.
SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
    u64 id = request_id(ctx);
    struct inflight *slot = slot_of(id);

    if (!slot || slot->tag != id || nr_bytes < rq->__data_len)
        return 0;
    observe(rq, LATENCY_SERVICE, bpf_ktime_get_ns() - slot->ts);
    return 0;
}

// A request merged into another one in the scheduler is freed without being issued.
SEC("tp_btf/block_rq_merge")
int BPF_PROG(block_rq_merge, struct request *rq)
{
    u64 id = request_id(ctx);
    struct inflight *slot = slot_of(id);

    if (slot && (slot->tag & ~TAG_INSERTED) == id)
        slot->tag = 0;
    return 0;
}

char LICENSE[] SEC("license") = "GPL";

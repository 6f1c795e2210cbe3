// The block layer's requests and bios per device and operation, one program per tracepoint (each
// program run costs a fixed ~70 ns of dispatch, so one config instead of one per metric family):
//   block_bio_size_bytes          bios as submitted to a device         (block_bio_queue)
//   block_rq_size_bytes           requests as issued to its driver      (block_rq_issue)
//   block_rq_latency_seconds      queue: request made -> issued          (block_rq_issue)
//                                 service: issued -> completed           (block_rq_issue, block_rq_complete)
//   block_bio_merges_total        bios merged into a waiting request    (block_bio_backmerge/frontmerge)
//   block_rq_missed_merges_total  requests issued next to one they waited with and could have joined
//   block_bio_splits_total        pieces split off bios to fit the device's limits (block_split)
// A bio-based device (dm-N, md) has bios only; a request-based one (nvme, sd, loop) has both,
// and bytes per bio / bytes per request is how much merging (>1) or splitting (<1) happened.
// README.md in this directory gives the exact semantics and the kernel paths they rely on.
//
// The three histograms (and the bios per cgroup) are counted by one of two strategies, each in a
// header of its own: block_batched.bpf.h counts per CPU first and adds into the exported maps
// within 0.5 s, exactly (bpf_loop: Linux 5.17+); block_immediate.bpf.h, built with
// -DBLOCK_IO_IMMEDIATE (block_io_immediate.bpf.c), updates the exported maps at each event (Linux
// 5.10+, ~1.5x the BPF time per I/O). Same metrics, same YAML.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "block.bpf.h"

// Capacity of the metric maps: entries are allocated when a (device, operation, bucket) is first
// seen (BPF_F_NO_PREALLOC), so a cap costs only the hash table's bucket array up front (16 bytes
// per entry of the cap rounded up to a power of two). A key not seen before is dropped once its
// map is full, so the caps are sized for 10,000 devices doing reads and writes with a typical
// spread: 12 keys per device and operation in a size histogram (a dozen sizes and the sum),
// 24 in the latency histogram (queue and service stages), 2 operations. About 18 MiB of bucket
// arrays in all (256 KiB with the 256 devices of before); entries take ~100 bytes each when used.
#define MAX_DEVICES 10240
#define TYPICAL_OPS 2
#define TYPICAL_SIZE_KEYS 12
#define TYPICAL_LATENCY_KEYS 24

// Byte buckets: 2^9 = 512 B (one sector; smaller and empty flush requests count here) to
// 2^27 = 128 MiB (and everything larger). Must match bucket_min / bucket_max in block_io.yaml.
#define SIZE_BUCKET_MIN 9
#define SIZE_BUCKET_MAX 27

// Nanosecond buckets: 2^10 ns (~1 us, everything faster counts here) to 2^36 ns (~68.7 s, and
// everything slower). Must match the latency histogram in block_io.yaml.
#define LATENCY_BUCKET_MIN 10
#define LATENCY_BUCKET_MAX 36

// 512-byte sectors (include/linux/blk_types.h SECTOR_SHIFT).
#define SECTOR_SHIFT 9

// Issue times of requests in flight live in a direct-mapped table indexed by a hash of the request
// address, each slot tagged with the request it belongs to. An array lookup is a few instructions
// (the verifier inlines it) where a hash map update + lookup + delete per request cost ~200 ns.
// When a request takes a slot still held by another request in flight, the earlier one's sample
// is dropped: with k requests in flight about k / INFLIGHT_SLOTS of samples (0.2 % at k = 128,
// 1.5 % at k = 1024, 15 % at k = 10,000: 10,000 devices with one request in flight each), the
// longest-running ones a little more often. 2^16 slots of 16 bytes: 1 MiB.
#define INFLIGHT_SLOTS_BITS 16
#define INFLIGHT_SLOTS (1 << INFLIGHT_SLOTS_BITS)

// The last read or write request each CPU issued to a device, for missed merges: a per-CPU table
// indexed by a hash of the device id (an array lookup the verifier inlines; per CPU, so issuing
// never pulls a cache line from another CPU). Two devices sharing a slot take turns and only
// lose pairs (a missed merge not counted), never invent one: the device id is compared. 2^12
// slots of 32 bytes per CPU (128 KiB each): devices issuing from one CPU at the same time rarely
// share one below a few hundred.
#define LAST_RQ_SLOTS_BITS 12
#define LAST_RQ_SLOTS (1 << LAST_RQ_SLOTS_BITS)

// 2^32 / golden ratio: Fibonacci hashing spreads ids that differ in a few middle bits (requests
// are carved out of one allocation at a fixed stride) over all slots.
#define GOLDEN_RATIO_32 0x9E3779B9U

enum latency_stage {
    LATENCY_QUEUE = 0,
    LATENCY_SERVICE = 1,
};

enum merge_type {
    MERGE_BACK = 0,
    MERGE_FRONT = 1,
};

// The key of all three histograms: the size histograms have no stage, and their YAML reads that
// byte as padding, so it is always 0 there.
struct hist_key {
    u32 dev;
    u8 op;
    u8 stage;
    u8 pad[2];
    u64 bucket;
};

struct op_key {
    u32 dev;
    u8 op;
    u8 pad[3];
};

struct merge_key {
    u32 dev;
    u8 op;
    u8 type;
    u8 pad[2];
};

struct inflight {
    u32 id;     // request_id() of the request issued, 0 if free
    u32 dev;    // its device, so that completion need not walk rq->q->disk again
    u64 issued; // bpf_ktime_get_ns() at block_rq_issue
};

struct last_rq {
    u32 dev;
    u8 op;
    u8 mergeable; // no REQ_NOMERGE, REQ_PREFLUSH or REQ_FUA: merging could have extended it
    u16 segments; // nr_phys_segments
    u64 start;    // first sector
    u64 end;      // sector after the last
    u64 issued;   // bpf_ktime_get_ns() at block_rq_issue (CLOCK_MONOTONIC, like rq->start_time_ns)
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * TYPICAL_OPS * TYPICAL_SIZE_KEYS));
    __type(key, struct hist_key);
    __type(value, u64);
} block_bio_size_bytes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * TYPICAL_OPS * TYPICAL_SIZE_KEYS));
    __type(key, struct hist_key);
    __type(value, u64);
} block_rq_size_bytes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * TYPICAL_OPS * TYPICAL_LATENCY_KEYS));
    __type(key, struct hist_key);
    __type(value, u64);
} block_rq_latency_seconds SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * TYPICAL_OPS));
    __type(key, struct op_key);
    __type(value, u64);
} block_rq_missed_merges_total SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * TYPICAL_OPS));
    __type(key, struct op_key);
    __type(value, u64);
} block_bio_splits_total SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * TYPICAL_OPS * 2));
    __type(key, struct merge_key);
    __type(value, u64);
} block_bio_merges_total SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, INFLIGHT_SLOTS);
    __type(key, u32);
    __type(value, struct inflight);
} inflight SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, LAST_RQ_SLOTS);
    __type(key, u32);
    __type(value, struct last_rq);
} last_rq SEC(".maps");

// Per-cgroup attribution (block_cgroups.bpf.h); built with -DBLOCK_IO_NO_CGROUPS, as `make
// bench-ebpf` does to weigh it, the programs count per device only.
#ifdef BLOCK_IO_NO_CGROUPS
static __always_inline void cgroup_bio(u32 dev, u8 op, struct bio *bio)
{
}
static __always_inline void cgroup_missed_merge(u32 dev, u8 op, struct request *rq)
{
}
static __always_inline void cgroup_split(u32 dev, u8 op, struct bio *bio)
{
}
#else
#include "block_cgroups.bpf.h"
#endif

// The request's address as a number: its low 32 bits, never 0 (requests are at least 8-byte
// aligned, so the low bit is free to mark the id in use). The verifier forbids arithmetic on a
// typed kernel pointer; a 32-bit move of one yields a plain number for programs loaded with
// CAP_PERFMON (the verifier's allow_ptr_leaks), as ebpf_exporter is. A move, not a
// bpf_probe_read_kernel() helper call per event. Two requests in flight exactly a multiple of
// 4 GiB apart in the same slot would share an id; their samples would blur like a collision.
static __always_inline u32 request_id(struct request *rq)
{
    u32 id;

    asm volatile("%[id] = %[rq]" : [id] "=w"(id) : [rq] "w"((u32) (unsigned long) rq));
    return id | 1;
}

static __always_inline struct inflight *inflight_slot(u32 id)
{
    u32 index = (id * GOLDEN_RATIO_32) >> (32 - INFLIGHT_SLOTS_BITS);

    return bpf_map_lookup_elem(&inflight, &index);
}

// One observation straight into an exported histogram map: two per-CPU hash updates (bucket, sum).
// All of block_immediate.bpf.h's counting, and block_batched.bpf.h's when its flush is in the slot.
static __always_inline void observe_now(void *map, u32 dev, u8 op, u8 stage, u64 value, u32 min, u32 max)
{
    struct hist_key key = { .dev = dev, .op = op, .stage = stage };

    histogram_observe(map, key, value, min, max);
}

// The counting strategy: observe_bio_size(), observe_request(), observe_service() and
// observe_cgroup_bio(), batched per CPU (Linux 5.17+) or immediate (block_io_immediate.bpf.c).
#ifdef BLOCK_IO_IMMEDIATE
#include "block_immediate.bpf.h"
#else
#include "block_batched.bpf.h"
#endif

#ifndef BLOCK_IO_NO_CGROUPS
static __always_inline void cgroup_bio(u32 dev, u8 op, struct bio *bio)
{
    observe_cgroup_bio(dev, op, bio_cgroup(bio), bio->bi_iter.bi_size);
}
#endif

// Fires once per bio submitted to a device (submit_bio_noacct_nocheck, before any split), for
// bio-based and request-based devices alike; a dm clone sent to the device beneath fires again
// with that device. TP_PROTO(struct bio *bio) since 5.11 (TP_ARG0 in block.bpf.h: before that (q, bio)).
SEC("tp_btf/block_bio_queue")
int BPF_PROG(block_bio_queue)
{
    struct bio *bio = TP_ARG0(ctx, block_bio_queue);
    u32 dev = bio_dev(bio);
    u8 op;

    if (!dev)
        return 0;
    op = op_class(bio->bi_opf);
    observe_bio_size(dev, op, bio->bi_iter.bi_size);
    cgroup_bio(dev, op, bio);
    return 0;
}

// Request flags that forbid merging (include/linux/blk_types.h REQ_NOMERGE_FLAGS): REQ_NOMERGE
// (set, among others, on every piece split off a bio), REQ_PREFLUSH and REQ_FUA. Bit numbers from
// the running kernel's BTF (enum req_flag_bits).
static __always_inline u32 nomerge_flags(void)
{
    return (1U << bpf_core_enum_value(enum req_flag_bits, __REQ_NOMERGE)) |
           (1U << bpf_core_enum_value(enum req_flag_bits, __REQ_PREFLUSH)) |
           (1U << bpf_core_enum_value(enum req_flag_bits, __REQ_FUA));
}

// When the request was made for its first bio, or 0 if unknown. rq->start_time_ns is set from
// blk_mq_bio_to_request() (blk_account_io_start() since 6.12, blk_mq_rq_time_init() before) with
// blk_time_get_ns(): CLOCK_MONOTONIC, like bpf_ktime_get_ns(), cached per plug (so never later
// than the real time). It is kept only where the queue keeps I/O statistics (queue/iostats = 1,
// the default), which RQF_IO_STAT says; since 6.12 it is left stale otherwise. Kernels before
// enum rqf_flags (a #define then) zeroed it when unused.
static __always_inline u64 rq_created_ns(struct request *rq)
{
    if (bpf_core_enum_value_exists(enum rqf_flags, __RQF_IO_STAT) &&
        !(rq->rq_flags & (1U << bpf_core_enum_value(enum rqf_flags, __RQF_IO_STAT))))
        return 0;
    return rq->start_time_ns;
}

// Whether the pair (the last request issued on this device by this CPU, then rq) would have fit
// in one request under the device's limits, as ll_merge_requests_fn() (blk-merge.c) checks:
// at most max_sectors (queue/max_sectors_kb) and max_segments, not across a chunk boundary.
static __always_inline bool pair_fits(struct request *rq, struct last_rq *last, u64 start, u32 sectors)
{
    struct request_queue *q = rq->q;
    u64 first = start < last->start ? start : last->start;
    u32 total = sectors + (u32) (last->end - last->start);
    u32 chunk = q->limits.chunk_sectors;

    if (total > q->limits.max_sectors)
        return false;
    if ((u32) rq->nr_phys_segments + last->segments > q->limits.max_segments)
        return false;
    if (chunk && first % chunk + total > chunk)
        return false;
    return true;
}

// A missed merge: rq, a read or write going to the driver, is contiguous with the request issued
// just before it on the same device, same operation, by this CPU; rq already existed when that
// one was issued (so both were waiting together: in one plug, or in the scheduler or software
// queue, dispatched one after the other); neither carries a flag that forbids merging; and the
// two would have fit in one request. Requests issued one by one as they are submitted never
// count, however adjacent: each was issued before the next existed. Updates `last` to rq.
static __always_inline bool rq_missed_merge(struct request *rq, u32 dev, u8 op, u64 created, u64 now,
                                            struct last_rq *last)
{
    u64 start = rq->__sector;
    u32 sectors = rq->__data_len >> SECTOR_SHIFT;
    u64 end = start + sectors;
    bool mergeable = !(rq->cmd_flags & nomerge_flags());
    bool missed = false;

    if (last->dev == dev && last->op == op && sectors && mergeable && last->mergeable &&
        (start == last->end || end == last->start))
        missed = created && created < last->issued && pair_fits(rq, last, start, sectors);
    last->dev = dev;
    last->op = op;
    last->mergeable = mergeable;
    last->segments = rq->nr_phys_segments;
    last->start = start;
    last->end = end;
    last->issued = now;
    return missed;
}

// A request going to the driver (blk_mq_start_request): its final size after merging and
// splitting, how long it waited since it was made (the queue stage: plug, I/O scheduler, software
// queue), its issue time for the service stage, and whether it is a missed merge.
// TP_PROTO(struct request *rq) since 5.11 (commit a54895fa057c; TP_ARG0 in block.bpf.h).
SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue)
{
    struct request *rq = TP_ARG0(ctx, block_rq_issue);
    struct inflight *slot;
    struct last_rq *last;
    u32 id = request_id(rq);
    u32 index, dev = request_dev(rq);
    u64 now = bpf_ktime_get_ns();
    u64 created;
    u8 op;

    if (!dev)
        return 0;
    op = op_class(rq->cmd_flags);

    // The queue stage on devices with an I/O scheduler, where requests wait to be dispatched; on
    // the others (scheduler none) requests go from the submitter's plug to the driver at once.
    created = rq_created_ns(rq);
    observe_request(dev, op, rq->__data_len, created && created <= now && rq->q->elevator, now - created);

    slot = inflight_slot(id);
    if (slot) {
        slot->id = id;
        slot->dev = dev;
        slot->issued = now;
    }

    if (op != OPC_READ && op != OPC_WRITE)
        return 0;
    index = (dev * GOLDEN_RATIO_32) >> (32 - LAST_RQ_SLOTS_BITS);
    last = bpf_map_lookup_elem(&last_rq, &index);
    if (last && rq_missed_merge(rq, dev, op, created, now, last)) {
        struct op_key okey = { .dev = dev, .op = op };

        map_add(&block_rq_missed_merges_total, &okey, 1);
        cgroup_missed_merge(dev, op, rq);
    }
    return 0;
}

// blk_update_request() fires this for every chunk it completes; the sample ends with the chunk
// that finishes the request (nr_bytes covers what is left of it). The slot is only read here, not
// cleared: issue and completion often run on different CPUs, and a write would pull the slot's
// cache line back and forth once more per request. A later request reusing the slot overwrites it.
SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
    u32 id = request_id(rq);
    struct inflight *slot = inflight_slot(id);

    if (!slot || slot->id != id || nr_bytes < rq->__data_len)
        return 0;
    observe_service(slot->dev, op_class(rq->cmd_flags), bpf_ktime_get_ns() - slot->issued);
    return 0;
}

static __always_inline int count_merge(struct bio *bio, u8 type)
{
    struct merge_key key = {};

    key.dev = bio_dev(bio);
    if (!key.dev)
        return 0;
    key.op = op_class(bio->bi_opf);
    key.type = type;
    map_add(&block_bio_merges_total, &key, 1);
    return 0;
}

// TP_PROTO(struct bio *bio) since 5.11 (commit e8a676d61c07, "block: remove the request_queue
// argument from the block_bio_* tracepoints"; before it (q, rq, bio), the bio third): the bio
// joins the end / the front of a request.
SEC("tp_btf/block_bio_backmerge")
int BPF_PROG(block_bio_backmerge)
{
    return count_merge(TP_MERGED_BIO(ctx, block_bio_backmerge), MERGE_BACK);
}

SEC("tp_btf/block_bio_frontmerge")
int BPF_PROG(block_bio_frontmerge)
{
    return count_merge(TP_MERGED_BIO(ctx, block_bio_frontmerge), MERGE_FRONT);
}

// A bio too large (or with too many segments, or crossing a chunk boundary) for the device's
// limits: the block layer splits off a piece that fits and resubmits the rest (blk-merge.c
// bio_submit_split; md and bcache call it too). Fires once per piece split off, so a bio cut
// into n pieces counts n - 1: the extra requests the split created. TP_PROTO(struct bio *bio,
// unsigned int new_sector) since 5.11 (commit e8a676d61c07); `bio` is the piece split off.
SEC("tp_btf/block_split")
int BPF_PROG(block_split)
{
    struct bio *bio = TP_ARG0(ctx, block_split);
    struct op_key key = {};

    key.dev = bio_dev(bio);
    if (!key.dev)
        return 0;
    key.op = op_class(bio->bi_opf);
    map_add(&block_bio_splits_total, &key, 1);
    cgroup_split(key.dev, key.op, bio);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";

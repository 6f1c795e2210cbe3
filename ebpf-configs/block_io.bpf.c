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
// The three histograms are counted per CPU in a direct-mapped table first (an array slot per
// device and operation: a few stores per event, where a per-CPU hash update costs ~40-60 ns and
// each observation took two) and added into the exported maps when a slot has 255 observations,
// when another device takes the slot, and by `flush_pending`, a perf_event program that runs on
// every CPU FLUSH_HZ times a second: an observation reaches the exported maps within 1 / FLUSH_HZ
// seconds, exactly (nothing is sampled or dropped). Built with -DBLOCK_IO_IMMEDIATE
// (block_io_immediate.bpf.c) the histograms are updated in the exported maps at each event: no
// lag, ~1.5x the BPF time per I/O, and no bpf_loop() (Linux 5.17+) needed, so it loads from 5.10.
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

// --- the histograms: observe_bio_size(), observe_request(), observe_service() ---------------------
#ifdef BLOCK_IO_IMMEDIATE

// Each observation goes straight into the exported maps: two per-CPU hash updates (bucket, sum).
static __always_inline void observe(void *map, u32 dev, u8 op, u8 stage, u64 value, u32 min, u32 max)
{
    struct hist_key key = { .dev = dev, .op = op, .stage = stage };

    histogram_observe(map, key, value, min, max);
}

static __always_inline void observe_bio_size(u32 dev, u8 op, u64 bytes)
{
    observe(&block_bio_size_bytes, dev, op, 0, bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
}

// queued: whether queue_ns is a sample (devices with an I/O scheduler)
static __always_inline void observe_request(u32 dev, u8 op, u64 bytes, bool queued, u64 queue_ns)
{
    observe(&block_rq_size_bytes, dev, op, 0, bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
    if (queued)
        observe(&block_rq_latency_seconds, dev, op, LATENCY_QUEUE, queue_ns, LATENCY_BUCKET_MIN, LATENCY_BUCKET_MAX);
}

static __always_inline void observe_service(u32 dev, u8 op, u64 service_ns)
{
    observe(&block_rq_latency_seconds, dev, op, LATENCY_SERVICE, service_ns, LATENCY_BUCKET_MIN, LATENCY_BUCKET_MAX);
}

#ifndef BLOCK_IO_NO_CGROUPS
// A bio of cgroup `id` (slot `slot` of its device, block_cgroups.bpf.h): two hash updates.
static __always_inline void observe_cgroup_bio(u32 dev, u8 op, u32 slot, u64 id, u64 bytes)
{
    cgroup_add(&block_cgroup_bios_total, dev, op, id, 1);
    cgroup_add(&block_cgroup_bio_bytes_total, dev, op, id, bytes);
}
#endif

#else

// Pending observations, per CPU, in a direct-mapped table indexed by a hash of (device,
// operation), each slot tagged with the pair it holds. 2^11 slots: a pair that finds its slot
// held by another pair flushes the other's counts first and takes it over, which costs what an
// immediate update costs; with d pairs active on one CPU about d / 2048 of them share a slot.
// 3 tables of 2,048 slots (48, 48 and 88 bytes): 376 KiB per CPU.
#define PENDING_SLOTS_BITS 11
#define PENDING_SLOTS (1 << PENDING_SLOTS_BITS)

// Bucket counts are bytes, so a slot is flushed when it holds this many observations.
#define PENDING_MAX 255

// Counts per pending histogram: the wider range of the two (latency: 2^10 .. 2^36 ns).
#define PENDING_BUCKETS (LATENCY_BUCKET_MAX - LATENCY_BUCKET_MIN + 1)
_Static_assert(SIZE_BUCKET_MAX - SIZE_BUCKET_MIN < PENDING_BUCKETS, "size buckets must fit a pending histogram");

// flush_pending runs on every CPU this often (a software cpu-clock perf event, whose frequency
// the kernel turns into a fixed period of 1 s / FLUSH_HZ): the bound on how long an observation
// waits before it is in the exported maps.
#define FLUSH_HZ 2
#define STRINGIFY(x) #x
#define PERF_SECTION(type, config, hz)                                                                                 \
    "perf_event/type=" STRINGIFY(type) ",config=" STRINGIFY(config) ",frequency=" STRINGIFY(hz)

struct pending_hist {
    u64 sum;
    u8 counts[PENDING_BUCKETS]; // bucket min + i
};

struct pending_slot {
    u32 dev;
    u8 op;
    u8 busy; // a program of this table is updating the slot: flush_pending leaves it alone
    u8 n;    // observations since the last flush
    u8 pad;
    struct pending_hist hist[2]; // the tables of one histogram hold hist[0] only
};

#define PENDING_SLOT_SIZE(histograms)                                                                                  \
    (__builtin_offsetof(struct pending_slot, hist) + (histograms) * sizeof(struct pending_hist))

// One table per program, so that a slot is written by one program only: block_rq_complete often
// runs in an interrupt on the CPU where block_rq_issue was interrupted, and the kernel never runs
// a program inside itself on one CPU.
enum pending_table {
    PENDING_BIO = 0,      // block_bio_queue: hist[0] bio size
    PENDING_ISSUE = 1,    // block_rq_issue: hist[0] request size, hist[1] queue latency
    PENDING_COMPLETE = 2, // block_rq_complete: hist[0] service latency
    PENDING_CGROUP = 3,   // block_bio_queue: bios and bytes per cgroup (struct cgroup_pending)
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, PENDING_SLOTS);
    __uint(key_size, sizeof(u32));
    __uint(value_size, PENDING_SLOT_SIZE(1));
} bio_pending SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, PENDING_SLOTS);
    __uint(key_size, sizeof(u32));
    __uint(value_size, PENDING_SLOT_SIZE(2));
} issue_pending SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, PENDING_SLOTS);
    __uint(key_size, sizeof(u32));
    __uint(value_size, PENDING_SLOT_SIZE(1));
} complete_pending SEC(".maps");

// Which slots have observations pending, per CPU: a bit per slot of each table, set by the first
// observation after a flush, cleared by flush_pending when it has emptied the slot, so that it
// visits only those (a walk of all 3 x 2,048 slots measured 45-80 us per run, ~47 ns per read in
// `make bench-ebpf`).
#define DIRTY_WORDS (PENDING_SLOTS / 64)
#ifdef BLOCK_IO_NO_CGROUPS
#define PENDING_TABLES 3
#else
#define PENDING_TABLES 4
#endif

// words[table * DIRTY_WORDS + index / 64], bit index % 64. flush_pending keeps its place in the
// walk here, not on its stack: the verifier then does not track it step by step (it would check
// the flush once per word).
struct dirty {
    u64 words[PENDING_TABLES * DIRTY_WORDS];
    u32 next; // the next word to read
    u64 bits; // the bits of the word read last not visited yet
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct dirty);
} pending_dirty SEC(".maps");

static __always_inline struct dirty *dirty_bits(void)
{
    u32 zero = 0;

    return bpf_map_lookup_elem(&pending_dirty, &zero);
}

// Adds a pending histogram into its exported map and empties it. The keys exist already
// (pending_add() made them), so this adds without allocating; if a key is missing all the same
// (the map was full when it was made), flush_pending, which runs in a timer interrupt where the
// map's allocator may have nothing at hand, keeps its count for the next tick (retry), and a
// flush from a program drops it, as an immediate update into a full map would.
static __always_inline bool flush_hist(void *map, struct pending_slot *p, u8 stage, struct pending_hist *h, u32 min,
                                       u32 max, bool retry)
{
    struct hist_key key = { .dev = p->dev, .op = p->op, .stage = stage };
    bool flushed = true;
    u32 i;

    for (i = 0; i <= max - min; i++) {
        if (!h->counts[i])
            continue;
        key.bucket = min + i;
        if (map_add(map, &key, h->counts[i]) || !retry)
            h->counts[i] = 0;
        else
            flushed = false;
    }
    if (h->sum) {
        key.bucket = max + 1;
        if (map_add(map, &key, h->sum) || !retry)
            h->sum = 0;
        else
            flushed = false;
    }
    return flushed;
}

static __always_inline void pending_flush(struct pending_slot *p, enum pending_table table, bool retry)
{
    bool flushed;

    if (!p->n)
        return;
    if (table == PENDING_BIO) {
        flushed = flush_hist(&block_bio_size_bytes, p, 0, &p->hist[0], SIZE_BUCKET_MIN, SIZE_BUCKET_MAX, retry);
    } else if (table == PENDING_ISSUE) {
        flushed = flush_hist(&block_rq_size_bytes, p, 0, &p->hist[0], SIZE_BUCKET_MIN, SIZE_BUCKET_MAX, retry);
        flushed &= flush_hist(&block_rq_latency_seconds, p, LATENCY_QUEUE, &p->hist[1], LATENCY_BUCKET_MIN,
                              LATENCY_BUCKET_MAX, retry);
    } else {
        flushed = flush_hist(&block_rq_latency_seconds, p, LATENCY_SERVICE, &p->hist[0], LATENCY_BUCKET_MIN,
                             LATENCY_BUCKET_MAX, retry);
    }
    // n stays while counts wait for a retry: every count stays <= n <= PENDING_MAX
    if (flushed)
        p->n = 0;
}

// flush_pending runs in a timer interrupt and may interrupt a program of the same table on its
// CPU: `busy` tells it to leave that slot to the next tick. A compiler barrier is enough, the
// interrupt being on the same CPU.
static __always_inline void set_busy(u8 *flag, u8 busy)
{
    asm volatile("" ::: "memory");
    *(volatile u8 *) flag = busy;
    asm volatile("" ::: "memory");
}

static __always_inline u32 pending_index(u32 dev, u8 op)
{
    return ((dev ^ ((u32) op << 28)) * GOLDEN_RATIO_32) >> (32 - PENDING_SLOTS_BITS);
}

// The slot `index` of `map`, marked busy and made (dev, op)'s, with what another pair left there
// flushed.
static __always_inline struct pending_slot *pending_begin(void *map, enum pending_table table, u32 index, u32 dev,
                                                          u8 op)
{
    struct pending_slot *p = bpf_map_lookup_elem(map, &index);

    if (!p)
        return NULL;
    set_busy(&p->busy, 1);
    if (p->dev != dev || p->op != op) {
        pending_flush(p, table, false);
        p->dev = dev;
        p->op = op;
    }
    return p;
}

// Marks slot `index` of `table` for flush_pending. A flush interrupting the |= below may find its
// own clearing of another bit undone: that slot is visited once more for nothing; no bit set here
// is lost.
static __always_inline void mark_dirty(enum pending_table table, u32 index)
{
    u32 w = table * DIRTY_WORDS + index / 64;
    struct dirty *d = dirty_bits();

    if (d && w < PENDING_TABLES * DIRTY_WORDS)
        d->words[w] |= 1ULL << (index % 64);
}

// Counts the observation just added.
static __always_inline void pending_end(struct pending_slot *p, enum pending_table table, u32 index)
{
    p->n++;
    if (p->n == 1) {
        mark_dirty(table, index);
    } else if (p->n == PENDING_MAX) {
        pending_flush(p, table, false);
    }
    set_busy(&p->busy, 0);
}

// One observation of `value` in the pending histogram h of slot p, whose exported map is `map`.
// The first count of a bucket (and of the sum) since the last flush makes sure the exported map
// has its key: one hash lookup per bucket per flush, and the flush itself never allocates.
static __always_inline void pending_add(void *map, struct pending_slot *p, u8 stage, struct pending_hist *h, u64 value,
                                        u32 min, u32 max)
{
    struct hist_key key = { .dev = p->dev, .op = p->op, .stage = stage };
    u32 i = exp2_bucket(value, min, max) - min;

    if (i >= PENDING_BUCKETS)
        return;
    if (!h->counts[i]) {
        key.bucket = min + i;
        map_add(map, &key, 0);
    }
    if (!h->sum) {
        key.bucket = max + 1;
        map_add(map, &key, 0);
    }
    h->counts[i]++;
    h->sum += value;
}

static __always_inline void observe_bio_size(u32 dev, u8 op, u64 bytes)
{
    u32 index = pending_index(dev, op);
    struct pending_slot *p = pending_begin(&bio_pending, PENDING_BIO, index, dev, op);

    if (!p)
        return;
    pending_add(&block_bio_size_bytes, p, 0, &p->hist[0], bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
    pending_end(p, PENDING_BIO, index);
}

// queued: whether queue_ns is a sample (devices with an I/O scheduler)
static __always_inline void observe_request(u32 dev, u8 op, u64 bytes, bool queued, u64 queue_ns)
{
    u32 index = pending_index(dev, op);
    struct pending_slot *p = pending_begin(&issue_pending, PENDING_ISSUE, index, dev, op);

    if (!p)
        return;
    pending_add(&block_rq_size_bytes, p, 0, &p->hist[0], bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
    if (queued)
        pending_add(&block_rq_latency_seconds, p, LATENCY_QUEUE, &p->hist[1], queue_ns, LATENCY_BUCKET_MIN,
                    LATENCY_BUCKET_MAX);
    pending_end(p, PENDING_ISSUE, index);
}

static __always_inline void observe_service(u32 dev, u8 op, u64 service_ns)
{
    u32 index = pending_index(dev, op);
    struct pending_slot *p = pending_begin(&complete_pending, PENDING_COMPLETE, index, dev, op);

    if (!p)
        return;
    pending_add(&block_rq_latency_seconds, p, LATENCY_SERVICE, &p->hist[0], service_ns, LATENCY_BUCKET_MIN,
                LATENCY_BUCKET_MAX);
    pending_end(p, PENDING_COMPLETE, index);
}

#ifndef BLOCK_IO_NO_CGROUPS
// Bios and bytes per block cgroup pending per CPU, a slot per (device, operation) as for the
// histograms, with a count for each of the device's cgroup slots and "other" (block_cgroups.bpf.h),
// each tagged with the cgroup it counts for. Two hash updates per bio cost ~90 ns per bio in `make
// bench-ebpf`; this a few stores, the updates once per flush. 2,048 slots of 112 bytes per CPU.
struct cgroup_pending {
    u32 dev;
    u8 op;
    u8 busy; // as in struct pending_slot
    u8 n;    // bios since the last flush
    u8 pad;
    u64 id[CGROUP_SLOTS + 1];
    u64 bytes[CGROUP_SLOTS + 1];
    u8 bios[CGROUP_SLOTS + 1];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, PENDING_SLOTS);
    __type(key, u32);
    __type(value, struct cgroup_pending);
} cgroup_pending SEC(".maps");

// Adds a slot's counts into the exported maps and empties it (a key missing there, whose making
// failed when the count began, drops its count, as block_cgroups.bpf.h's cgroup_add() does).
static __always_inline void cgroup_pending_flush(struct cgroup_pending *p)
{
    u32 i;

    for (i = 0; i <= CGROUP_SLOTS; i++) {
        if (!p->bios[i])
            continue;
        cgroup_add(&block_cgroup_bios_total, p->dev, p->op, p->id[i], p->bios[i]);
        cgroup_add(&block_cgroup_bio_bytes_total, p->dev, p->op, p->id[i], p->bytes[i]);
        p->bios[i] = 0;
        p->bytes[i] = 0;
    }
    p->n = 0;
}

// A bio of cgroup `id`, slot `slot` of its device. The first count of a cgroup since the last
// flush makes its keys in the exported maps, so that the flush, in a timer interrupt, need not.
static __always_inline void observe_cgroup_bio(u32 dev, u8 op, u32 slot, u64 id, u64 bytes)
{
    u32 index = pending_index(dev, op);
    struct cgroup_pending *p = bpf_map_lookup_elem(&cgroup_pending, &index);

    if (!p || slot > CGROUP_SLOTS)
        return;
    set_busy(&p->busy, 1);
    if (p->dev != dev || p->op != op || (p->bios[slot] && p->id[slot] != id)) {
        cgroup_pending_flush(p);
        p->dev = dev;
        p->op = op;
    }
    if (!p->bios[slot]) {
        p->id[slot] = id;
        cgroup_add(&block_cgroup_bios_total, dev, op, id, 0);
        cgroup_add(&block_cgroup_bio_bytes_total, dev, op, id, 0);
    }
    p->bios[slot]++;
    p->bytes[slot] += bytes;
    p->n++;
    if (p->n == 1)
        mark_dirty(PENDING_CGROUP, index);
    else if (p->n == PENDING_MAX)
        cgroup_pending_flush(p);
    set_busy(&p->busy, 0);
}

static __always_inline bool cgroup_flush_idle(u32 index)
{
    struct cgroup_pending *p = bpf_map_lookup_elem(&cgroup_pending, &index);

    if (!p)
        return true;
    if (p->n && !p->busy)
        cgroup_pending_flush(p);
    return !p->n;
}
#endif

// Flushes slot `index` of `table` unless a program is updating it; returns whether it is empty.
static __always_inline bool flush_idle(void *map, u32 index, enum pending_table table)
{
    struct pending_slot *p = bpf_map_lookup_elem(map, &index);

    if (!p)
        return true;
    if (p->n && !p->busy)
        pending_flush(p, table, true);
    return !p->n;
}

// One step of the walk: read the next dirty word if the last one is done (1, stop, after the
// last), else flush the slot of its lowest bit left. So a run takes a step per word and one per
// slot with observations pending, and the verifier checks the flush once.
static long flush_step(u32 i, void *ctx)
{
    struct dirty *d = dirty_bits();
    u32 w, table, index;
    bool empty;
    u64 low;

    if (!d)
        return 1;
    if (!d->bits) {
        w = d->next;
        if (w >= PENDING_TABLES * DIRTY_WORDS)
            return 1;
        d->bits = d->words[w];
        d->next = w + 1;
        return 0;
    }
    w = d->next - 1;
    low = d->bits & -d->bits;
    d->bits &= ~low;
    table = w / DIRTY_WORDS;
    index = (w % DIRTY_WORDS) * 64 + log2_ceil(low); // log2_ceil(2^k) == k
    if (table == PENDING_BIO)
        empty = flush_idle(&bio_pending, index, PENDING_BIO);
    else if (table == PENDING_ISSUE)
        empty = flush_idle(&issue_pending, index, PENDING_ISSUE);
#ifndef BLOCK_IO_NO_CGROUPS
    else if (table == PENDING_CGROUP)
        empty = cgroup_flush_idle(index);
#endif
    else
        empty = flush_idle(&complete_pending, index, PENDING_COMPLETE);
    d = dirty_bits(); // the flush's calls left the verifier without d
    if (empty && d && w < PENDING_TABLES * DIRTY_WORDS)
        d->words[w] &= ~low;
    return 0;
}

// Every 1 / FLUSH_HZ s on every CPU (type 1 = PERF_TYPE_SOFTWARE, config 0 =
// PERF_COUNT_SW_CPU_CLOCK, an hrtimer that fires on idle CPUs too; ebpf_exporter opens one per
// online CPU): adds this CPU's pending observations into the exported maps, in bpf_loop() (Linux
// 5.17+) steps. One loop, not a bpf_loop() per dirty word inside it: Linux 6.1's verifier rejects
// that nesting ("infinite loop detected").
SEC(PERF_SECTION(1, 0, FLUSH_HZ))
int flush_pending(void *ctx)
{
    struct dirty *d = dirty_bits();

    if (!d)
        return 0;
    d->next = 0;
    d->bits = 0;
    bpf_loop(PENDING_TABLES * (DIRTY_WORDS + PENDING_SLOTS), flush_step, NULL, 0);
    return 0;
}

#endif // BLOCK_IO_IMMEDIATE

#ifndef BLOCK_IO_NO_CGROUPS
static __always_inline void cgroup_bio(u32 dev, u8 op, struct bio *bio)
{
    u64 bytes = bio->bi_iter.bi_size;
    u32 slot;
    u64 id = cgroup_account(dev, bio_cgroup(bio), bytes, &slot);

    observe_cgroup_bio(dev, op, slot, id, bytes);
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

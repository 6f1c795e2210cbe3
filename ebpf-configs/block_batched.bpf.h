// block_io's batched counting (Linux 5.17+: bpf_loop): the three histograms and the per-cgroup
// bios and bytes are counted per CPU in a direct-mapped table first (an array slot per device and
// operation: a few stores per event, where a per-CPU hash update costs ~40-60 ns and each
// observation took two), and added into the exported maps:
//   - when a slot has 255 observations (its bucket counts are bytes),
//   - when another (device, operation) takes the slot,
//   - by flush_pending(), a BPF timer callback, FLUSH_NS after the first observation a CPU made
//     since its last flush.
// So an observation reaches the exported maps within FLUSH_NS, exactly (nothing is sampled or
// dropped). The timer is armed from the tracepoint programs on the CPU that counted (one timer per
// CPU, in an array indexed by CPU number: a per-CPU map may not hold one), so it costs nothing on
// idle CPUs and needs no perf event: it loads under CAP_BPF and CAP_PERFMON whatever
// kernel.perf_event_paranoid is (Debian's 3 refuses a CPU-wide perf event without CAP_SYS_ADMIN),
// and a CPU brought online later is covered. BPF_PROG_TYPE_TRACING (tp_btf) programs may use
// bpf_timer since 5.15; tracepoint, kprobe and perf_event programs may not.
//
// What block_io.bpf.c provides before including this: the exported maps, struct hist_key,
// observe_now(), the bucket ranges and GOLDEN_RATIO_32; block_cgroups.bpf.h unless
// BLOCK_IO_NO_CGROUPS. What it defines: observe_bio_size(), observe_request(), observe_service()
// and observe_cgroup_bio(), as block_immediate.bpf.h does.
#ifndef BLOCKSTACK_BLOCK_BATCHED_BPF_H
#define BLOCKSTACK_BLOCK_BATCHED_BPF_H

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

// The bound on how long an observation waits before it is in the exported maps.
#define FLUSH_NS 500000000ULL

// CPUs with a flush timer: Debian's and Ubuntu's NR_CPUS. A CPU numbered above it (none on those
// kernels) flushes each slot at its first observation instead, as an immediate update would.
#define FLUSH_CPUS 8192

#ifndef CLOCK_MONOTONIC
#define CLOCK_MONOTONIC 1
#endif
// bpf_timer_start()'s BPF_F_TIMER_CPU_PIN (Linux 6.7): the timer fires on the CPU that armed it
// even if that CPU is idle by then. Older kernels refuse the flag (EINVAL) and get 0, with which an
// hrtimer armed on a busy CPU stays there (get_nohz_timer_target() moves only an idle CPU's).
#define FLUSH_TIMER_PIN 2

struct pending_hist {
    u64 sum;
    u8 counts[PENDING_BUCKETS]; // bucket min + i
};

struct pending_slot {
    u32 dev;
    u8 op;
    u8 busy; // a program or the flush is in the slot: whoever interrupts it keeps out
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
// observation after a flush, cleared by the flush before it empties the slot (and set again if it
// could not), so that it visits only those (a walk of all 3 x 2,048 slots measured 45-80 us per
// run, ~47 ns per read in `make bench-ebpf`). Set and cleared with atomic or/and: the flush runs
// in a softirq that a program in process context can be interrupted by, and that a program in a
// hard interrupt can interrupt.
#define DIRTY_WORDS (PENDING_SLOTS / 64)
#ifdef BLOCK_IO_NO_CGROUPS
#define PENDING_TABLES 3
#else
#define PENDING_TABLES 4
#endif

// words[table * DIRTY_WORDS + index / 64], bit index % 64. The flush keeps its place in the walk
// here, not on its stack: the verifier then does not track it step by step (it would check the
// flush once per word).
struct dirty {
    u64 words[PENDING_TABLES * DIRTY_WORDS];
    u32 next; // the next word to read
    u32 left; // a slot the walk could not empty (busy, or a key missing): flush again later
    u64 bits; // the bits of the word read last not visited yet
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct dirty);
} pending_dirty SEC(".maps");

struct flush_timer {
    struct bpf_timer timer;
    u32 ready; // bpf_timer_init() and the callback done
    u32 armed; // started and not yet fired
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, FLUSH_CPUS);
    __type(key, u32);
    __type(value, struct flush_timer);
} flush_timers SEC(".maps");

// What the flushes cost, per CPU: runs and nanoseconds. A timer callback's run time is not in the
// kernel's per-program statistics (kernel.bpf_stats_enabled), which count the tracepoint programs
// only; `make bench-ebpf` adds this to them.
struct flush_cost {
    u64 runs;
    u64 ns;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct flush_cost);
} flush_cost SEC(".maps");

static __always_inline struct dirty *dirty_bits(void)
{
    u32 zero = 0;

    return bpf_map_lookup_elem(&pending_dirty, &zero);
}

// Adds a pending histogram into its exported map and empties it. The keys exist already
// (pending_add() made them), so this adds without allocating; if a key is missing all the same
// (the map was full when it was made), the timer's flush keeps its count for the next flush
// (retry), and a flush from a program drops it, as an immediate update into a full map would.
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

// Whoever is in a slot marks it busy; one that interrupts it on the same CPU (the flush
// interrupting a program, or a program in an interrupt interrupting the flush) finds it busy and
// keeps out. Check, then mark: an interrupter runs to its end before the interrupted goes on, so
// a compiler barrier is enough.
static __always_inline bool take_slot(u8 *busy)
{
    if (*(volatile u8 *) busy)
        return false;
    asm volatile("" ::: "memory");
    *(volatile u8 *) busy = 1;
    asm volatile("" ::: "memory");
    return true;
}

static __always_inline void leave_slot(u8 *busy)
{
    asm volatile("" ::: "memory");
    *(volatile u8 *) busy = 0;
}

static __always_inline u32 pending_index(u32 dev, u8 op)
{
    return ((dev ^ ((u32) op << 28)) * GOLDEN_RATIO_32) >> (32 - PENDING_SLOTS_BITS);
}

// The slot `index` of `map`, taken and made (dev, op)'s, with what another pair left there
// flushed; NULL while the flush is in it (the caller then counts at once, in the exported map).
static __always_inline struct pending_slot *pending_begin(void *map, enum pending_table table, u32 index, u32 dev,
                                                          u8 op)
{
    struct pending_slot *p = bpf_map_lookup_elem(map, &index);

    if (!p || !take_slot(&p->busy))
        return NULL;
    if (p->dev != dev || p->op != op) {
        pending_flush(p, table, false);
        p->dev = dev;
        p->op = op;
    }
    return p;
}

static long flush_step(u32 i, void *ctx);

// The timer's callback: adds this CPU's pending observations into the exported maps, in
// bpf_loop() (Linux 5.17+) steps. One loop, not a bpf_loop() per dirty word inside it: Linux
// 6.1's verifier rejects that nesting ("infinite loop detected"). Started again if a slot was
// left (busy: a program on this CPU was in it; or a key the map could not take).
static int flush_pending(void *map, u32 *cpu, struct flush_timer *t)
{
    u64 start = bpf_ktime_get_ns();
    struct dirty *d = dirty_bits();
    struct flush_cost *cost;
    u32 zero = 0;

    t->armed = 0;
    if (!d)
        return 0;
    d->next = 0;
    d->bits = 0;
    d->left = 0;
    bpf_loop(PENDING_TABLES * (DIRTY_WORDS + PENDING_SLOTS), flush_step, NULL, 0);
    d = dirty_bits();
    if (d && d->left && !t->armed) {
        t->armed = 1;
        if (bpf_timer_start(&t->timer, FLUSH_NS, FLUSH_TIMER_PIN) && bpf_timer_start(&t->timer, FLUSH_NS, 0))
            t->armed = 0;
    }
    cost = bpf_map_lookup_elem(&flush_cost, &zero);
    if (cost) {
        cost->runs++;
        cost->ns += bpf_ktime_get_ns() - start;
    }
    return 0;
}

// Makes sure this CPU's flush timer is running; false if it cannot (a CPU beyond FLUSH_CPUS, or
// the kernel refused the timer), and the caller then flushes at once.
static __always_inline bool arm_flush(void)
{
    u32 cpu = bpf_get_smp_processor_id();
    struct flush_timer *t = bpf_map_lookup_elem(&flush_timers, &cpu);

    if (!t)
        return false;
    if (t->armed)
        return true;
    if (!t->ready) {
        bpf_timer_init(&t->timer, &flush_timers, CLOCK_MONOTONIC);
        if (bpf_timer_set_callback(&t->timer, flush_pending))
            return false;
        t->ready = 1;
    }
    t->armed = 1;
    if (bpf_timer_start(&t->timer, FLUSH_NS, FLUSH_TIMER_PIN) && bpf_timer_start(&t->timer, FLUSH_NS, 0)) {
        t->armed = 0;
        return false;
    }
    return true;
}

// Marks slot `index` of `table` for the flush and makes sure the flush will come; false if it
// will not (see arm_flush()).
static __always_inline bool mark_dirty(enum pending_table table, u32 index)
{
    u32 w = table * DIRTY_WORDS + index / 64;
    struct dirty *d = dirty_bits();

    if (d && w < PENDING_TABLES * DIRTY_WORDS)
        __sync_fetch_and_or(&d->words[w], 1ULL << (index % 64));
    return arm_flush();
}

// Counts the observation just added and leaves the slot.
static __always_inline void pending_end(struct pending_slot *p, enum pending_table table, u32 index)
{
    p->n++;
    if ((p->n == 1 && !mark_dirty(table, index)) || p->n == PENDING_MAX)
        pending_flush(p, table, false);
    leave_slot(&p->busy);
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

    if (!p) {
        observe_now(&block_bio_size_bytes, dev, op, 0, bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
        return;
    }
    pending_add(&block_bio_size_bytes, p, 0, &p->hist[0], bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
    pending_end(p, PENDING_BIO, index);
}

// queued: whether queue_ns is a sample (devices with an I/O scheduler)
static __always_inline void observe_request(u32 dev, u8 op, u64 bytes, bool queued, u64 queue_ns)
{
    u32 index = pending_index(dev, op);
    struct pending_slot *p = pending_begin(&issue_pending, PENDING_ISSUE, index, dev, op);

    if (!p) {
        observe_now(&block_rq_size_bytes, dev, op, 0, bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
        if (queued)
            observe_now(&block_rq_latency_seconds, dev, op, LATENCY_QUEUE, queue_ns, LATENCY_BUCKET_MIN,
                        LATENCY_BUCKET_MAX);
        return;
    }
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

    if (!p) {
        observe_now(&block_rq_latency_seconds, dev, op, LATENCY_SERVICE, service_ns, LATENCY_BUCKET_MIN,
                    LATENCY_BUCKET_MAX);
        return;
    }
    pending_add(&block_rq_latency_seconds, p, LATENCY_SERVICE, &p->hist[0], service_ns, LATENCY_BUCKET_MIN,
                LATENCY_BUCKET_MAX);
    pending_end(p, PENDING_COMPLETE, index);
}

#ifndef BLOCK_IO_NO_CGROUPS
// Bios and bytes per block cgroup pending per CPU, a slot per (device, operation) as for the
// histograms, with a count for each of the device's cgroup slots and "other" (block_cgroups.bpf.h),
// each tagged with the cgroup it counts for. Two hash updates per bio cost ~90 ns per bio in `make
// bench-ebpf`; this a few stores, the updates once per flush.
//
// The first bio of a cgroup since the flush competes for the device's slots (cgroup_account(): a
// hash lookup of the device's table, shared by all CPUs, and its score raised there); the next
// ones of a cgroup that got a named slot only count here, their bytes kept in `unscored` and added
// to its score by the flush: that is ~1/3 of the attribution's cost saved per bio (the table's
// cache line no longer written by every CPU at every bio). A cgroup evicted meanwhile by another
// CPU has its pending counts go to "other" at the flush, where its bios after the eviction
// belong. 2,048 slots of 152 bytes per CPU.
struct cgroup_pending {
    u32 dev;
    u8 op;
    u8 busy; // as in struct pending_slot
    u8 n;    // bios since the last flush
    u8 pad;
    u64 id[CGROUP_SLOTS + 1];
    u64 bytes[CGROUP_SLOTS + 1];
    u64 unscored[CGROUP_SLOTS]; // bytes not yet added to the slot's score
    u8 bios[CGROUP_SLOTS + 1];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, PENDING_SLOTS);
    __type(key, u32);
    __type(value, struct cgroup_pending);
} cgroup_pending SEC(".maps");

// Adds a slot's counts into the exported maps and its bytes to the scores, and empties it (a key
// missing there, whose making failed when the count began, drops its count, as
// block_cgroups.bpf.h's cgroup_add() does).
static __always_inline void cgroup_pending_flush(struct cgroup_pending *p)
{
    u64 id;
    u32 i;

    for (i = 0; i <= CGROUP_SLOTS; i++) {
        if (!p->bios[i])
            continue;
        id = p->id[i];
        if (i < CGROUP_SLOTS && !cgroup_score(p->dev, id, p->unscored[i]))
            id = CGROUP_OTHER;
        cgroup_add(&block_cgroup_bios_total, p->dev, p->op, id, p->bios[i]);
        cgroup_add(&block_cgroup_bio_bytes_total, p->dev, p->op, id, p->bytes[i]);
        p->bios[i] = 0;
        p->bytes[i] = 0;
        if (i < CGROUP_SLOTS)
            p->unscored[i] = 0;
    }
    p->n = 0;
}

// Slot i of p if cgroup `id` has bios pending there under a named slot, else CGROUP_SLOTS.
static __always_inline u32 cgroup_pending_slot(struct cgroup_pending *p, u32 dev, u8 op, u64 id)
{
    u32 i;

    if (p->dev != dev || p->op != op || !id)
        return CGROUP_SLOTS;
    for (i = 0; i < CGROUP_SLOTS; i++)
        if (p->bios[i] && p->id[i] == id)
            return i;
    return CGROUP_SLOTS;
}

// A bio of `bytes` of cgroup cg to device dev. The first count of a cgroup since the last flush
// makes its keys in the exported maps, so that the flush, in a softirq, need not.
static __always_inline void observe_cgroup_bio(u32 dev, u8 op, struct cgroup *cg, u64 bytes)
{
    u32 index = pending_index(dev, op), slot;
    struct cgroup_pending *p = bpf_map_lookup_elem(&cgroup_pending, &index);
    u64 id = cgroup_id_of(cg);

    if (!p || !take_slot(&p->busy)) {
        id = cgroup_account(dev, cg, bytes, &slot);
        cgroup_add(&block_cgroup_bios_total, dev, op, id, 1);
        cgroup_add(&block_cgroup_bio_bytes_total, dev, op, id, bytes);
        return;
    }
    slot = cgroup_pending_slot(p, dev, op, id);
    if (slot < CGROUP_SLOTS) {
        p->unscored[slot] += bytes;
    } else {
        id = cgroup_account(dev, cg, bytes, &slot);
        if (slot > CGROUP_SLOTS) {
            leave_slot(&p->busy);
            return;
        }
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
    }
    p->bios[slot]++;
    p->bytes[slot] += bytes;
    p->n++;
    if ((p->n == 1 && !mark_dirty(PENDING_CGROUP, index)) || p->n == PENDING_MAX)
        cgroup_pending_flush(p);
    leave_slot(&p->busy);
}

static __always_inline bool cgroup_flush_idle(u32 index)
{
    struct cgroup_pending *p = bpf_map_lookup_elem(&cgroup_pending, &index);

    if (!p)
        return true;
    if (p->n && take_slot(&p->busy)) {
        cgroup_pending_flush(p);
        leave_slot(&p->busy);
    }
    return !p->n;
}
#endif

// Flushes slot `index` of `table` unless a program is in it; returns whether it is empty.
static __always_inline bool flush_idle(void *map, u32 index, enum pending_table table)
{
    struct pending_slot *p = bpf_map_lookup_elem(map, &index);

    if (!p)
        return true;
    if (p->n && take_slot(&p->busy)) {
        pending_flush(p, table, true);
        leave_slot(&p->busy);
    }
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
    if (w >= PENDING_TABLES * DIRTY_WORDS)
        return 1;
    // The bit is cleared before the slot is flushed: an observation that lands in the slot after
    // the flush emptied it (a program in an interrupt) marks it again.
    __sync_fetch_and_and(&d->words[w], ~low);
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
    if (!empty) {
        d = dirty_bits(); // the flush's calls left the verifier without d
        if (!d || w >= PENDING_TABLES * DIRTY_WORDS)
            return 1;
        __sync_fetch_and_or(&d->words[w], low);
        d->left = 1;
    }
    return 0;
}

#endif // BLOCKSTACK_BLOCK_BATCHED_BPF_H

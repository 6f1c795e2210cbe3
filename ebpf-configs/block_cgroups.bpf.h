// Who is hurt: block_io's per-device evidence split by the block cgroup each bio is charged to,
// for the busiest few cgroups of each device, with a fixed series budget.
//
//   block_cgroup_bios_total           bios submitted to the device               (block_bio_queue)
//   block_cgroup_bio_bytes_total      their bytes                                (block_bio_queue)
//   block_cgroup_missed_merges_total  block_rq_missed_merges_total's requests    (block_rq_issue)
//   block_cgroup_splits_total         block_bio_splits_total's pieces            (block_split)
//   block_cgroup_admissions_total     1 while a cgroup holds one of the device's named slots: its
//                                     labels name it (cgroup, parent); cgroup_id 0 is "other"
//   block_cgroup_evictions_total      cgroups that lost their slot to a busier one
//
// The cgroup is the bio's block cgroup (bio->bi_blkg->blkcg), the one the kernel charges the I/O
// to, never the task that happens to be running: writeback carries the cgroup that dirtied the
// pages (cgroup v2 with the io and memory controllers), a dm clone or split piece keeps its
// parent's, a kworker's own I/O is the root's. On cgroup v1 it is the blkio hierarchy's cgroup
// of the submitting task, and writeback is charged to the root. The names are read from the
// cgroup's kernfs node when it takes a slot (its directory name and its parent's, such as
// postgresql.service in system.slice), so they need no cgroupfs mount and outlive the cgroup.
//
// The budget: each device has CGROUP_SLOTS named slots plus "other". A cgroup takes a free slot
// at its first bio. When all are taken, a cgroup without one counts as "other" and competes as
// the device's challenger (one Misra-Gries counter: another cgroup's bytes wear it down); it
// takes the slot with the least recent bytes (each slot's bytes halve every window, below) once
// it has done more, at most once per window per device. So a device exports at most
// CGROUP_SLOTS + 1 cgroups per counter and operation, and a stream of short-lived cgroups
// replaces at most one named cgroup per window: the series churn is bounded by time, not by
// how many cgroups come and go. An evicted cgroup's counters are deleted (its series end).
//
// Slots are shared by all CPUs and updated without atomics (Linux 5.10 has no BPF
// compare-and-exchange): a race may lose some bytes of a score or let two CPUs fill one slot,
// which costs a scoring error or a wasted slot, never a count under another cgroup's name (a
// count goes to the cgroup found in a slot by the event itself, or to "other").
#ifndef BLOCKSTACK_BLOCK_CGROUPS_BPF_H
#define BLOCKSTACK_BLOCK_CGROUPS_BPF_H

#define CGROUP_SLOTS 5
// The window: 2^12 jiffies, 16.4 s at Debian's HZ=250 (4.1 s at HZ=1000). Jiffies, not
// bpf_ktime_get_ns(): reading the clock cost ~50 ns per bio in `make bench-ebpf` here (a VM's
// clock), jiffies nothing measurable.
#define CGROUP_WINDOW_SHIFT 12
#define CGROUP_NAME_LEN 96
#define CGROUP_OTHER 0
// Operations a cgroup counter has keys for (enum op_class): deleted for each on eviction.
#define CGROUP_OPS (OPC_OTHER + 1)
// Devices with cgroup tables: each costs ~1 KiB when used (BPF_F_NO_PREALLOC).
#define CGROUP_DEVICES 4096

// The key of block_cgroup_admissions_total: its labels name the cgroup.
struct cgroup_name {
    u32 dev;
    u32 pad;
    u64 id;
    char name[CGROUP_NAME_LEN];
    char parent[CGROUP_NAME_LEN];
};

struct cgroup_key {
    u32 dev;
    u8 op;
    u8 pad[3];
    u64 id;
};

// What every bio reads first (ids, scores, the window), in two cache lines; the names after.
struct cgroup_table {
    u64 id[CGROUP_SLOTS];    // the cgroup holding each slot, 0: free
    u64 score[CGROUP_SLOTS]; // its bytes, halved every window
    u64 window;              // bpf_jiffies64() >> CGROUP_WINDOW_SHIFT of the scores
    u64 challenger;          // cgroup id, 0 if none
    u64 challenger_score;
    u64 evicted;                           // window of the last eviction + 1, 0 if none
    struct cgroup_name slot[CGROUP_SLOTS]; // each slot's admissions key (its names)
    struct cgroup_name other;              // "other", the key of the device's catch-all
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, CGROUP_DEVICES);
    __type(key, u32);
    __type(value, struct cgroup_table);
} cgroup_tables SEC(".maps");

// A table of zeros to create a device's table from (a value this large cannot be on the stack).
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct cgroup_table);
} cgroup_table_zero SEC(".maps");

#define CGROUP_COUNTER_MAP(map_name)                                                                                   \
    struct {                                                                                                           \
        __uint(type, BPF_MAP_TYPE_PERCPU_HASH);                                                                        \
        __uint(map_flags, BPF_F_NO_PREALLOC);                                                                          \
        __uint(max_entries, CGROUP_DEVICES *(CGROUP_SLOTS + 1) * TYPICAL_OPS);                                         \
        __type(key, struct cgroup_key);                                                                                \
        __type(value, u64);                                                                                            \
    } map_name SEC(".maps")

CGROUP_COUNTER_MAP(block_cgroup_bios_total);
CGROUP_COUNTER_MAP(block_cgroup_bio_bytes_total);
CGROUP_COUNTER_MAP(block_cgroup_missed_merges_total);
CGROUP_COUNTER_MAP(block_cgroup_splits_total);

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, CGROUP_DEVICES *(CGROUP_SLOTS + 1));
    __type(key, struct cgroup_name);
    __type(value, u64);
} block_cgroup_admissions_total SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, CGROUP_DEVICES);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, u32);
    __type(value, u64);
} block_cgroup_evictions_total SEC(".maps");

// The cgroup a bio is charged to: bio->bi_blkg (set by bio_associate_blkg() before
// block_bio_queue; kept by clones and split pieces) -> its blkcg -> the cgroup. NULL without
// CONFIG_BLK_CGROUP. On cgroup v2 the blkcg is the nearest cgroup with the io controller enabled.
static __always_inline struct cgroup *bio_cgroup(struct bio *bio)
{
    struct blkcg_gq *blkg;

    if (!bpf_core_field_exists(bio->bi_blkg))
        return NULL;
    blkg = bio->bi_blkg;
    if (!blkg)
        return NULL;
    return blkg->blkcg->css.cgroup;
}

// A cgroup's id is its kernfs node's id (cgroup_id(); the inode number of its directory).
static __always_inline u64 cgroup_id_of(struct cgroup *cg)
{
    return cg ? cg->kn->id : 0;
}

// A kernfs node's name, "/" for the hierarchy's root (whose name is empty) and for no node.
static __always_inline void read_name(char *to, struct kernfs_node *kn)
{
    const char *name = kn ? kn->name : NULL;

    if (!name || bpf_probe_read_kernel_str(to, CGROUP_NAME_LEN, name) <= 1) {
        to[0] = '/';
        to[1] = 0;
    }
}

static __always_inline struct cgroup_table *cgroup_table(u32 dev)
{
    struct cgroup_table *t = bpf_map_lookup_elem(&cgroup_tables, &dev);
    u32 zero = 0;
    u64 one = 1;
    void *empty;

    if (t)
        return t;
    empty = bpf_map_lookup_elem(&cgroup_table_zero, &zero);
    if (!empty || bpf_map_update_elem(&cgroup_tables, &dev, empty, BPF_NOEXIST))
        return bpf_map_lookup_elem(&cgroup_tables, &dev); // full, or another CPU made it first
    t = bpf_map_lookup_elem(&cgroup_tables, &dev);
    if (!t)
        return NULL;
    t->window = bpf_jiffies64() >> CGROUP_WINDOW_SHIFT;
    t->other.dev = dev;
    __builtin_memcpy(t->other.name, "other", 6);
    bpf_map_update_elem(&block_cgroup_admissions_total, &t->other, &one, BPF_ANY);
    return t;
}

// Ages the scores to window w: halved once per window gone by.
static __always_inline void cgroup_roll(struct cgroup_table *t, u64 w)
{
    u64 gone = w - t->window;
    u32 i;

    if (gone > 63)
        gone = 63;
    for (i = 0; i < CGROUP_SLOTS; i++)
        t->score[i] >>= gone;
    t->challenger_score >>= gone;
    t->window = w;
}

static __always_inline void cgroup_delete_counters(u32 dev, u64 id)
{
    struct cgroup_key key = { .dev = dev, .id = id };
    u32 op;

    for (op = 0; op < CGROUP_OPS; op++) {
        key.op = op;
        bpf_map_delete_elem(&block_cgroup_bios_total, &key);
        bpf_map_delete_elem(&block_cgroup_bio_bytes_total, &key);
        bpf_map_delete_elem(&block_cgroup_missed_merges_total, &key);
        bpf_map_delete_elem(&block_cgroup_splits_total, &key);
    }
}

// A kernfs node's parent: kernfs_node->parent, renamed __parent in 6.15 ("kernfs: Use RCU to access
// kernfs_node::parent"). Read through CO-RE so one object loads on both sides of the rename.
struct kernfs_node___old {
    struct kernfs_node *parent;
} __attribute__((preserve_access_index));

static __always_inline struct kernfs_node *kernfs_parent(struct kernfs_node *kn)
{
    struct kernfs_node___old *old = (void *) kn;

    if (bpf_core_field_exists(old->parent))
        return old->parent;
    return kn->__parent;
}

// Gives slot i to cgroup cg (id), with its names, ending its previous holder's series.
static __always_inline void cgroup_admit(struct cgroup_table *t, u32 i, u32 dev, u64 id, struct cgroup *cg)
{
    struct cgroup_name *s;
    struct kernfs_node *kn = cg->kn;
    struct kernfs_node *parent = kernfs_parent(kn);
    u64 one = 1;

    if (i >= CGROUP_SLOTS)
        return;
    s = &t->slot[i];
    if (s->id) {
        bpf_map_delete_elem(&block_cgroup_admissions_total, s);
        cgroup_delete_counters(dev, s->id);
    }
    t->id[i] = id;
    s->dev = dev;
    s->id = id;
    read_name(s->name, parent ? kn : NULL);
    read_name(s->parent, parent);
    bpf_map_update_elem(&block_cgroup_admissions_total, s, &one, BPF_ANY);
}

static __always_inline void cgroup_count_eviction(u32 dev)
{
    u64 zero = 0, *n = bpf_map_lookup_elem(&block_cgroup_evictions_total, &dev);

    if (!n) {
        bpf_map_update_elem(&block_cgroup_evictions_total, &dev, &zero, BPF_NOEXIST);
        n = bpf_map_lookup_elem(&block_cgroup_evictions_total, &dev);
        if (!n)
            return;
    }
    __sync_fetch_and_add(n, 1);
}

// The id a bio of `bytes` to device dev is counted under: its cgroup's if that holds a slot of the
// device (taking a free one, or the least busy one as described at the top), else CGROUP_OTHER;
// *slot is the slot's index, CGROUP_SLOTS for "other".
static __always_inline u64 cgroup_account(u32 dev, struct cgroup *cg, u64 bytes, u32 *slot)
{
    struct cgroup_table *t;
    u64 id = cgroup_id_of(cg), w, least = ~0ULL;
    u32 i, free = CGROUP_SLOTS, min = 0;

    *slot = CGROUP_SLOTS;
    if (!id)
        return CGROUP_OTHER;
    t = cgroup_table(dev);
    if (!t)
        return CGROUP_OTHER;
    w = bpf_jiffies64() >> CGROUP_WINDOW_SHIFT;
    if (w != t->window)
        cgroup_roll(t, w);
    for (i = 0; i < CGROUP_SLOTS; i++) {
        if (t->id[i] == id) {
            t->score[i] += bytes;
            *slot = i;
            return id;
        }
        if (!t->id[i]) {
            if (free == CGROUP_SLOTS)
                free = i;
        } else if (t->score[i] < least) {
            least = t->score[i];
            min = i;
        }
    }
    if (free < CGROUP_SLOTS) {
        cgroup_admit(t, free, dev, id, cg);
        t->score[free] = bytes;
        *slot = free;
        return id;
    }
    if (t->challenger != id) {
        if (t->challenger_score > bytes) {
            t->challenger_score -= bytes;
            return CGROUP_OTHER;
        }
        t->challenger = id;
        t->challenger_score = 0;
    }
    t->challenger_score += bytes;
    if (t->challenger_score <= least || t->evicted == w + 1)
        return CGROUP_OTHER;
    cgroup_admit(t, min, dev, id, cg);
    if (min < CGROUP_SLOTS)
        t->score[min] = t->challenger_score;
    t->challenger = 0;
    t->challenger_score = 0;
    t->evicted = w + 1;
    cgroup_count_eviction(dev);
    *slot = min;
    return id;
}

// Whether cgroup `id` holds a slot of device dev.
static __always_inline bool cgroup_holds(u32 dev, u64 id)
{
    struct cgroup_table *t = bpf_map_lookup_elem(&cgroup_tables, &dev);
    u32 i;

    if (!t)
        return false;
    for (i = 0; i < CGROUP_SLOTS; i++)
        if (t->id[i] == id)
            return true;
    return false;
}

// Whether cgroup `id` holds a slot of device dev, adding `bytes` to that slot's score if so (the
// batched counting's bytes of a cgroup's later bios, block_batched.bpf.h).
static __always_inline bool cgroup_score(u32 dev, u64 id, u64 bytes)
{
    struct cgroup_table *t = bpf_map_lookup_elem(&cgroup_tables, &dev);
    u32 i;

    if (!t)
        return false;
    for (i = 0; i < CGROUP_SLOTS; i++)
        if (t->id[i] == id) {
            t->score[i] += bytes;
            return true;
        }
    return false;
}

// The id an event of cgroup cg on device dev is counted under, without competing for a slot.
static __always_inline u64 cgroup_named(u32 dev, struct cgroup *cg)
{
    u64 id = cgroup_id_of(cg);

    return id && cgroup_holds(dev, id) ? id : CGROUP_OTHER;
}

// Adds to a cgroup counter. A key made here for a cgroup evicted meanwhile (another CPU took its
// slot between the lookup that found it and now) is deleted again, so no series outlives its slot:
// the evicting CPU writes the slot before it deletes, and this one makes the key before it looks.
static __always_inline void cgroup_add(void *map, u32 dev, u8 op, u64 id, u64 delta)
{
    struct cgroup_key key = { .dev = dev, .op = op, .id = id };
    u64 zero = 0, *value = bpf_map_lookup_elem(map, &key);

    if (!value) {
        bpf_map_update_elem(map, &key, &zero, BPF_NOEXIST);
        if (id != CGROUP_OTHER && !cgroup_holds(dev, id)) {
            bpf_map_delete_elem(map, &key);
            return;
        }
        value = bpf_map_lookup_elem(map, &key);
        if (!value)
            return;
    }
    *value += delta;
}

// What block_io's programs call for a missed merge and a piece split off (a bio submitted is
// counted by block_io.bpf.c's observe_cgroup_bio(), batched per CPU like its histograms).
// A request's cgroup is its first bio's: bios of different block cgroups merge (blk_cgroup_mergeable()
// refuses it only for those with I/O priorities since 6.0), but rarely.
static __always_inline void cgroup_missed_merge(u32 dev, u8 op, struct request *rq)
{
    struct bio *bio = rq->bio;

    cgroup_add(&block_cgroup_missed_merges_total, dev, op, bio ? cgroup_named(dev, bio_cgroup(bio)) : CGROUP_OTHER, 1);
}

static __always_inline void cgroup_split(u32 dev, u8 op, struct bio *bio)
{
    cgroup_add(&block_cgroup_splits_total, dev, op, cgroup_named(dev, bio_cgroup(bio)), 1);
}

#endif // BLOCKSTACK_BLOCK_CGROUPS_BPF_H

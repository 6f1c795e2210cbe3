/* The histogram shared by both variants of jbd2 credit wait (jbd2_credit_wait and
 * jbd2_credit_wait_fexit): same map, same key, same buckets, so dashboards and alerts read one
 * metric, ebpf_exporter_jbd2_credit_wait_seconds{device}, whichever variant the host loads. */
#ifndef BLOCKSTACK_JBD2_BPF_H
#define BLOCKSTACK_JBD2_BPF_H

#include "maps.bpf.h"
#include "block.bpf.h"

// Capacity: 10,240 filesystems with a journal, a dozen distinct wait buckets (and the sum) each.
// Entries are allocated when first seen (BPF_F_NO_PREALLOC); the cap costs the hash table's
// bucket array, 16 bytes per entry rounded up to a power of two (2 MiB). Raw tracepoint programs
// (jbd2_credit_wait_legacy) may use preallocated maps only: Linux 5.10 warns (WARN_ONCE "trace
// type BPF program uses run-time allocation", kernel/bpf/verifier.c) on a non-preallocated one,
// so there the maps are preallocated, per CPU, for 1,024 journals (12,288 entries of 8 bytes a CPU,
// and 1,024 for jbd2_checkpoint_waits_total).
#ifndef JBD2_RAW_TRACEPOINTS
#define MAX_JOURNALS 10240
#define WAIT_MAP_FLAGS BPF_F_NO_PREALLOC
#else
#define MAX_JOURNALS 1024
#define WAIT_MAP_FLAGS 0
#endif
#define TYPICAL_WAIT_KEYS 12

// Nanosecond buckets: 2^10 ns (~1 us) .. 2^36 ns (~68.7 s). Must match jbd2_credit_wait*.yaml.
#define WAIT_BUCKET_MIN 10
#define WAIT_BUCKET_MAX 36

struct wait_key {
    u32 dev;
    u32 pad;
    u64 bucket;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, WAIT_MAP_FLAGS);
    __uint(max_entries, (MAX_JOURNALS * TYPICAL_WAIT_KEYS));
    __type(key, struct wait_key);
    __type(value, u64);
} jbd2_credit_wait_seconds SEC(".maps");

// Handle starts that found the journal full: the task checkpointed it to free log space
// (add_transaction_credits() -> __jbd2_log_wait_for_space() -> jbd2_log_do_checkpoint(), the
// path of the ext4 incident's sick case; its healthy case never took it). Tasks that queued on
// j_checkpoint_mutex behind the one checkpointing, and found room after it, are not counted: a
// lower bound of the handles that waited for log space. jbd2_log_do_checkpoint() also runs for
// a journal flush (unmount, freeze, FIEMAP); those are not inside a handle start, not counted.
struct journal_key {
    u32 dev;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, WAIT_MAP_FLAGS);
    __uint(max_entries, MAX_JOURNALS);
    __type(key, struct journal_key);
    __type(value, u64);
} jbd2_checkpoint_waits_total SEC(".maps");

// What a task starting a handle is doing: since when it waits (0: not waiting) and whether it
// checkpointed the journal meanwhile.
struct wait_state {
    u64 start;
    u64 checkpointed;
};

#ifndef JBD2_RAW_TRACEPOINTS
// When the current task started waiting; task-local, so no hash keyed by pid and nothing
// left behind when a task exits. BPF_MAP_TYPE_TASK_STORAGE and bpf_get_current_task_btf() came in
// 5.11 (commits 4cf1bc1f1045 and 3ca1032ab7ab); jbd2_credit_wait_legacy uses the hash below.
struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct wait_state);
} wait_start SEC(".maps");

static __always_inline struct wait_state *wait_slot(bool create)
{
    return bpf_task_storage_get(&wait_start, bpf_get_current_task_btf(), 0,
                                create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}
#else
// When each waiting task (by thread id) started: an LRU hash (always preallocated), so a task
// that exits while it waits leaves an entry that newer ones push out. 10,240 tasks starting
// handles at once.
#define MAX_WAITING_TASKS 10240

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, MAX_WAITING_TASKS);
    __type(key, u32);
    __type(value, struct wait_state);
} wait_start SEC(".maps");

static __always_inline struct wait_state *wait_slot(bool create)
{
    u32 tid = (u32) bpf_get_current_pid_tgid();
    struct wait_state zero = {};

    if (create)
        bpf_map_update_elem(&wait_start, &tid, &zero, BPF_ANY);
    return bpf_map_lookup_elem(&wait_start, &tid);
}
#endif

static __always_inline void wait_begin(void)
{
    struct wait_state *state = wait_slot(true);

    if (state) {
        state->start = bpf_ktime_get_ns();
        state->checkpointed = 0;
    }
}

// jbd2_checkpoint fired: if the current task is starting a handle, it is checkpointing the full
// journal to make room.
static __always_inline void wait_checkpoint(void)
{
    struct wait_state *state = wait_slot(false);

    if (state && state->start)
        state->checkpointed = 1;
}

// kernel_dev: the kernel's dev_t of the journal's filesystem device (journal->j_fs_dev->bd_dev).
static __always_inline void wait_end(u32 kernel_dev)
{
    struct wait_key key = {};
    struct journal_key journal = {};
    struct wait_state *state;
    u64 delta;

    state = wait_slot(false);
    if (!state || !state->start)
        return;
    delta = bpf_ktime_get_ns() - state->start;
    state->start = 0;
    key.dev = encode_kernel_dev(kernel_dev);
    histogram_observe(&jbd2_credit_wait_seconds, key, delta, WAIT_BUCKET_MIN, WAIT_BUCKET_MAX);
    if (state->checkpointed) {
        journal.dev = key.dev;
        map_add(&jbd2_checkpoint_waits_total, &journal, 1);
    }
}

#endif /* BLOCKSTACK_JBD2_BPF_H */

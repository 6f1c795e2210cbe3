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
// so there the map is preallocated, per CPU, for 1,024 journals (12,288 entries of 8 bytes a CPU).
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

#ifndef JBD2_RAW_TRACEPOINTS
// When the current task started waiting; task-local, so no hash keyed by pid and nothing
// left behind when a task exits. BPF_MAP_TYPE_TASK_STORAGE and bpf_get_current_task_btf() came in
// 5.11 (commits 4cf1bc1f1045 and 3ca1032ab7ab); jbd2_credit_wait_legacy uses the hash below.
struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, u64);
} wait_start SEC(".maps");

static __always_inline u64 *wait_slot(bool create)
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
    __type(value, u64);
} wait_start SEC(".maps");

static __always_inline u64 *wait_slot(bool create)
{
    u32 tid = (u32) bpf_get_current_pid_tgid();
    u64 zero = 0;

    if (create)
        bpf_map_update_elem(&wait_start, &tid, &zero, BPF_ANY);
    return bpf_map_lookup_elem(&wait_start, &tid);
}
#endif

static __always_inline void wait_begin(void)
{
    u64 *start = wait_slot(true);

    if (start)
        *start = bpf_ktime_get_ns();
}

// kernel_dev: the kernel's dev_t of the journal's filesystem device (journal->j_fs_dev->bd_dev).
static __always_inline void wait_end(u32 kernel_dev)
{
    struct wait_key key = {};
    u64 *start, delta;

    start = wait_slot(false);
    if (!start || !*start)
        return;
    delta = bpf_ktime_get_ns() - *start;
    *start = 0;
    key.dev = encode_kernel_dev(kernel_dev);
    histogram_observe(&jbd2_credit_wait_seconds, key, delta, WAIT_BUCKET_MIN, WAIT_BUCKET_MAX);
}

#endif /* BLOCKSTACK_JBD2_BPF_H */

/* The histogram shared by both variants of jbd2 credit wait (jbd2_credit_wait and
 * jbd2_credit_wait_fexit): same map, same key, same buckets, so dashboards and alerts read one
 * metric, ebpf_exporter_jbd2_credit_wait_seconds{device}, whichever variant the host loads. */
#ifndef BLOCKSTACK_JBD2_BPF_H
#define BLOCKSTACK_JBD2_BPF_H

#include "maps.bpf.h"
#include "block.bpf.h"

// Capacity: 10,240 filesystems with a journal, a dozen distinct wait buckets (and the sum) each.
// Entries are allocated when first seen (BPF_F_NO_PREALLOC); the cap costs the hash table's
// bucket array, 16 bytes per entry rounded up to a power of two (2 MiB).
#define MAX_JOURNALS 10240
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
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_JOURNALS * TYPICAL_WAIT_KEYS));
    __type(key, struct wait_key);
    __type(value, u64);
} jbd2_credit_wait_seconds SEC(".maps");

// When the current task started waiting; task-local, so no hash keyed by pid and nothing
// left behind when a task exits.
struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, u64);
} wait_start SEC(".maps");

static __always_inline void wait_begin(void)
{
    u64 *start;

    start = bpf_task_storage_get(&wait_start, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (start)
        *start = bpf_ktime_get_ns();
}

// kernel_dev: the kernel's dev_t of the journal's filesystem device (journal->j_fs_dev->bd_dev).
static __always_inline void wait_end(u32 kernel_dev)
{
    struct wait_key key = {};
    u64 *start, delta;

    start = bpf_task_storage_get(&wait_start, bpf_get_current_task_btf(), 0, 0);
    if (!start || !*start)
        return;
    delta = bpf_ktime_get_ns() - *start;
    *start = 0;
    key.dev = encode_kernel_dev(kernel_dev);
    histogram_observe(&jbd2_credit_wait_seconds, key, delta, WAIT_BUCKET_MIN, WAIT_BUCKET_MAX);
}

#endif /* BLOCKSTACK_JBD2_BPF_H */

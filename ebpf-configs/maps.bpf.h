/* Map helpers shared by the programs here: counters and exp2 histograms with an exact sum.
 *
 * Histogram maps follow ebpf_exporter's layout: a u64 per key, the key's last field is the
 * bucket index, and for `bucket_type: exp2` bucket i counts values v with 2^(i-1) < v <= 2^i
 * (the exporter turns index i into the upper bound `le = 2^i * bucket_multiplier`). The index
 * bucket_max + 1 holds the sum of all observed values; ebpf_exporter exports it as `_sum`
 * (exporter/histogram.go, "Optional sum key"). Buckets below bucket_min are never exported,
 * so values that small are counted in bucket_min.
 *
 * Metric maps are BPF_MAP_TYPE_PERCPU_HASH: each CPU adds to its own copy (no cache line
 * bouncing between CPUs that issue and complete I/O), and ebpf_exporter sums the copies when it
 * reads the map. They are BPF_F_NO_PREALLOC: an entry is allocated when a (device, operation,
 * bucket) is first seen, so max_entries is a cap, not memory taken up front for every CPU.
 */
#ifndef BLOCKSTACK_MAPS_BPF_H
#define BLOCKSTACK_MAPS_BPF_H

#include <bpf/bpf_helpers.h>

/* ceil(log2(v)) for v >= 1, and 0 for v <= 1: the smallest i with v <= 2^i.
 * BPF has no count-leading-zeros instruction, so a branch-free binary search on floor(log2). */
static __always_inline u32 log2_ceil(u64 v)
{
    u64 x;
    u32 r = 0, shift;

    if (v <= 1)
        return 0;
    x = v - 1; /* floor(log2(v - 1)) + 1 == ceil(log2(v)) for v >= 2 */
    shift = (x > 0xFFFFFFFFULL) << 5;
    x >>= shift;
    r |= shift;
    shift = (x > 0xFFFF) << 4;
    x >>= shift;
    r |= shift;
    shift = (x > 0xFF) << 3;
    x >>= shift;
    r |= shift;
    shift = (x > 0xF) << 2;
    x >>= shift;
    r |= shift;
    shift = (x > 0x3) << 1;
    x >>= shift;
    r |= shift;
    r |= (x >> 1);
    return r + 1;
}

/* exp2 bucket index of v, clamped to [min, max]. */
static __always_inline u32 exp2_bucket(u64 v, u32 min, u32 max)
{
    u32 b = log2_ceil(v);

    if (b < min)
        return min;
    if (b > max)
        return max;
    return b;
}

/* Adds `delta` to the u64 at `key` of a per-CPU map, creating the entry at 0 first. Returns 0 if
 * the map is full. BPF_NOEXIST makes a racing creator harmless: the loser uses the winner's entry.
 *
 * A plain add, not an atomic one: the value is this CPU's copy, tracepoint probes run with
 * preemption disabled, and the kernel does not run a program inside itself on one CPU
 * (__bpf_trace_run skips a nested run, counting it in the program's `misses`). Each key of a map
 * here is written by one program only, so nothing else can interleave with the read-modify-write. */
static __always_inline int map_add(void *map, const void *key, u64 delta)
{
    u64 zero = 0, *value;

    value = bpf_map_lookup_elem(map, key);
    if (!value) {
        bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
        value = bpf_map_lookup_elem(map, key);
        if (!value)
            return 0;
    }
    *value += delta;
    return 1;
}

/* Observes `value` in an exp2 histogram map whose key struct `key` has a u64 `bucket` field last:
 * one count in its bucket and `value` added to the sum slot (max + 1). */
#define histogram_observe(map, key, value, min, max)                                                                   \
    do {                                                                                                               \
        (key).bucket = exp2_bucket((value), (min), (max));                                                             \
        map_add((map), &(key), 1);                                                                                     \
        (key).bucket = (max) + 1;                                                                                      \
        map_add((map), &(key), (value));                                                                               \
    } while (0)

#endif /* BLOCKSTACK_MAPS_BPF_H */

// Request sizes per device and operation at the two ends of the block layer, and the merges
// that happen (or would have happened) between them:
//   block_bio_size_bytes          bios as submitted to a device      (block_bio_queue)
//   block_rq_size_bytes           requests as issued to its driver   (block_rq_issue)
//   block_bio_merges_total        bios merged into a queued request  (block_bio_backmerge/frontmerge)
//   block_rq_missed_merges_total  small requests issued right next to the previous one
// A bio-based device (dm-N, md) has bios only; a request-based one (nvme, sd, loop) has both,
// and bytes per bio / bytes per request is how much merging (>1) or splitting (<1) happened.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "block.bpf.h"

// Devices we expect on a host.
#define MAX_DEVICES 256

// Operations: enum op_class in block.bpf.h.
#define MAX_OPS 5

// Byte buckets: 2^9 = 512 B (one sector; smaller and empty flush requests count here) to
// 2^27 = 128 MiB (and everything larger). Must match bucket_min / bucket_max in block_sizes.yaml.
#define SIZE_BUCKET_MIN 9
#define SIZE_BUCKET_MAX 27
// Buckets plus the sum slot.
#define SIZE_SLOTS (SIZE_BUCKET_MAX - SIZE_BUCKET_MIN + 2)

// "Small" for missed merges: at most 32 KiB. Merged streams and readahead come in requests of
// 64 KiB and more (128 KiB readahead by default; merging stops only at max_sectors_kb), while the
// requests that merging exists to combine are one or a few pages: 4 KiB filesystem blocks and
// direct I/O, 8-32 KiB database pages. With nomerges=2 such requests reach the driver one by one.
#define SMALL_RQ_BYTES (32 << 10)

// 512-byte sectors (include/linux/blk_types.h SECTOR_SHIFT).
#define SECTOR_SHIFT 9

enum merge_type {
    MERGE_BACK = 0,
    MERGE_FRONT = 1,
};

struct size_key {
    u32 dev;
    u8 op;
    u8 pad[3];
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

// The last request issued on a device, for missed merges, in a direct-mapped table indexed by a
// hash of the device id (an array lookup is inlined by the verifier; a hash map lookup costs more
// at every request). Two devices sharing a slot take turns and only blur each other's count.
#define LAST_RQ_SLOTS_BITS 10
#define LAST_RQ_SLOTS (1 << LAST_RQ_SLOTS_BITS)
// 2^32 / golden ratio (Fibonacci hashing).
#define GOLDEN_RATIO_32 0x9E3779B9U

struct last_rq {
    u32 dev;
    u8 op;
    u8 pad[3];
    u64 start; // first sector
    u64 end;   // sector after the last
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * MAX_OPS * SIZE_SLOTS));
    __type(key, struct size_key);
    __type(value, u64);
} block_bio_size_bytes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * MAX_OPS * SIZE_SLOTS));
    __type(key, struct size_key);
    __type(value, u64);
} block_rq_size_bytes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * MAX_OPS));
    __type(key, struct op_key);
    __type(value, u64);
} block_rq_missed_merges_total SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, (MAX_DEVICES * MAX_OPS * 2));
    __type(key, struct merge_key);
    __type(value, u64);
} block_bio_merges_total SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, LAST_RQ_SLOTS);
    __type(key, u32);
    __type(value, struct last_rq);
} last_rq SEC(".maps");

// Fires once per bio submitted to a device (submit_bio_noacct_nocheck, before any split), for
// bio-based and request-based devices alike; a dm clone sent to the device beneath fires again
// with that device.
SEC("tp_btf/block_bio_queue")
int BPF_PROG(block_bio_queue, struct bio *bio)
{
    struct size_key key = {};

    key.dev = bio_dev(bio);
    if (!key.dev)
        return 0;
    key.op = op_class(bio->bi_opf);
    histogram_observe(&block_bio_size_bytes, key, bio->bi_iter.bi_size, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);
    return 0;
}

// A request going to the driver: its final size after merging and splitting.
SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue, struct request *rq)
{
    struct size_key key = {};
    struct last_rq *last;
    u32 slot;
    u32 bytes = rq->__data_len;
    u64 start = rq->__sector;
    u64 end = start + (bytes >> SECTOR_SHIFT);

    key.dev = request_dev(rq);
    if (!key.dev)
        return 0;
    key.op = op_class(rq->cmd_flags);
    histogram_observe(&block_rq_size_bytes, key, bytes, SIZE_BUCKET_MIN, SIZE_BUCKET_MAX);

    if (key.op != OPC_READ && key.op != OPC_WRITE)
        return 0;

    // Adjacent on either side: requests from one plug may reach the driver in either order.
    // Updated without a lock: two CPUs issuing to one device at the same instant may each
    // compare against a stale neighbour, which only blurs a rate.
    slot = (key.dev * GOLDEN_RATIO_32) >> (32 - LAST_RQ_SLOTS_BITS);
    last = bpf_map_lookup_elem(&last_rq, &slot);
    if (!last)
        return 0;
    if (last->dev == key.dev && last->op == key.op && bytes && bytes <= SMALL_RQ_BYTES &&
        (start == last->end || end == last->start)) {
        struct op_key okey = { .dev = key.dev, .op = key.op };

        map_add(&block_rq_missed_merges_total, &okey, 1);
    }
    last->dev = key.dev;
    last->op = key.op;
    last->start = start;
    last->end = end;
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
// argument from the block_bio_* tracepoints"): the bio joins the end / the front of a request.
SEC("tp_btf/block_bio_backmerge")
int BPF_PROG(block_bio_backmerge, struct bio *bio)
{
    return count_merge(bio, MERGE_BACK);
}

SEC("tp_btf/block_bio_frontmerge")
int BPF_PROG(block_bio_frontmerge, struct bio *bio)
{
    return count_merge(bio, MERGE_FRONT);
}

char LICENSE[] SEC("license") = "GPL";

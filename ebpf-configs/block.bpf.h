/* Block-layer helpers shared by block_latency and block_sizes: device ids and operation classes.
 *
 * Device ids are encoded like the kernel's new_encode_dev() (include/linux/kdev_t.h), the format
 * of stat(2)'s st_rdev, which ebpf_exporter's `majorminor` decoder looks up in /proc/partitions.
 * The name it yields (loop0, nvme1n1, dm-3) is the one in /proc/diskstats and node_exporter.
 */
#ifndef BLOCKSTACK_BLOCK_BPF_H
#define BLOCKSTACK_BLOCK_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

/* All programs here are tp_btf (BTF-typed raw tracepoints): their arguments are typed kernel
 * pointers, so fields are read directly (a plain load, relocated by CO-RE through vmlinux.h's
 * preserve_access_index) rather than with bpf_probe_read_kernel() per field as BPF_CORE_READ does.
 * A load through a NULL or bad pointer reads 0 instead of faulting. */

/* Values of the `operation` label; the YAML static_map turns them into names. */
enum op_class {
    OPC_READ = 0,
    OPC_WRITE = 1,
    OPC_DISCARD = 2,
    OPC_FLUSH = 3,
    OPC_OTHER = 4,
};

/* The low REQ_OP_BITS bits of cmd_flags / bi_opf hold the enum req_op value
 * (include/linux/blk_types.h: `#define REQ_OP_BITS 8`; a macro, so it is not in BTF). */
#define REQ_OP_MASK ((1U << 8) - 1)

/* new_encode_dev(MKDEV(major, minor)) from include/linux/kdev_t.h. */
static __always_inline u32 encode_dev(u32 major, u32 minor)
{
    return (minor & 0xff) | (major << 8) | ((minor & ~0xffU) << 12);
}

/* Kernel-internal dev_t (major << 20 | minor, include/linux/kdev_t.h MINORBITS = 20) to the above. */
static __always_inline u32 encode_kernel_dev(u32 dev)
{
    return encode_dev(dev >> 20, dev & ((1U << 20) - 1));
}

/* The whole disk's id. Partitions are folded into their disk: a partition is a sector offset
 * (blk_partition_remap), not a layer with a queue of its own, and requests belong to the disk. */
static __always_inline u32 disk_dev(struct gendisk *disk)
{
    if (!disk)
        return 0;
    return encode_dev(disk->major, disk->first_minor);
}

/* Linux before 5.17 kept the disk in request->rq_disk; commit f3fa33acca9f ("block: remove the
 * ->rq_disk field in struct request") moved readers to request->q->disk (added by d152c682f03c).
 * Both are read through CO-RE so one object loads on either side of the change. */
struct request___old {
    struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk *request_disk(struct request *rq)
{
    struct request___old *old = (void *) rq;

    if (bpf_core_field_exists(old->rq_disk))
        return old->rq_disk;
    return rq->q->disk;
}

static __always_inline u32 request_dev(struct request *rq)
{
    return disk_dev(request_disk(rq));
}

/* A bio's disk: bio->bi_bdev->bd_disk since 5.12 (commit 309dca309fc3, "block: store a
 * block_device pointer in struct bio"), bio->bi_disk before it. */
struct bio___old {
    struct gendisk *bi_disk;
} __attribute__((preserve_access_index));

static __always_inline u32 bio_dev(struct bio *bio)
{
    struct bio___old *old = (void *) bio;

    if (bpf_core_field_exists(old->bi_disk))
        return disk_dev(old->bi_disk);
    return disk_dev(bio->bi_bdev->bd_disk);
}

/* The block tracepoints lost their first argument, the request_queue, in 5.11: commit
 * e8a676d61c07 ("block: remove the request_queue argument from the block_bio_* tracepoints":
 * block_bio_queue, block_bio_backmerge/frontmerge, block_split) and commit a54895fa057c ("block:
 * remove the request_queue to argument request based tracepoints": block_rq_issue). Stable
 * kernels took the second alone: Debian 11's 5.10.262 has block_rq_issue(rq) beside
 * block_bio_queue(q, bio). So each tracepoint's prototype is matched on its own against the
 * running kernel's BTF (bpf_core_type_matches: libbpf 1.0+, clang 15+), as libbpf-tools'
 * core_fixes.bpf.h does; to the verifier the answer is a constant, and it checks only the branch
 * taken (an argument a tracepoint does not have is refused). */
typedef void (*btf_trace_block_bio_queue___q)(void *, struct request_queue *, struct bio *);
typedef void (*btf_trace_block_split___q)(void *, struct request_queue *, struct bio *, unsigned int);
typedef void (*btf_trace_block_bio_backmerge___q)(void *, struct request_queue *, struct request *, struct bio *);
typedef void (*btf_trace_block_bio_frontmerge___q)(void *, struct request_queue *, struct request *, struct bio *);
typedef void (*btf_trace_block_rq_issue___q)(void *, struct request_queue *, struct request *);

#define TP_QUEUE_FIRST(tp) bpf_core_type_matches(btf_trace_##tp##___q)

/* Argument `n` of a tracepoint program's context, loaded by an instruction of its own: from two
 * plain loads clang makes one at a computed offset, and the verifier accepts only fixed offsets
 * into a program's context. OFF is n * 8, a literal. */
#define TP_CTX(ctx, OFF)                                                                                               \
    ({                                                                                                                 \
        void *__arg;                                                                                                   \
        asm volatile("%[arg] = *(u64 *)(%[c] + " #OFF ")" : [arg] "=r"(__arg) : [c] "r"(ctx));                         \
        __arg;                                                                                                         \
    })

/* Tracepoint tp's first argument as numbered since 5.11, and the merged bio of
 * block_bio_backmerge/frontmerge (third before 5.11, first since). */
#define TP_ARG0(ctx, tp) (TP_QUEUE_FIRST(tp) ? TP_CTX(ctx, 8) : TP_CTX(ctx, 0))
#define TP_MERGED_BIO(ctx, tp) (TP_QUEUE_FIRST(tp) ? TP_CTX(ctx, 16) : TP_CTX(ctx, 0))

/* The operations as named before 6.0, when enum req_opf became enum req_op ("treewide: Rename
 * enum req_opf into enum req_op", v6.0-rc1); libbpf matches names without the ___old suffix. */
enum req_opf___old {
    REQ_OP_READ___old,
    REQ_OP_WRITE___old,
    REQ_OP_FLUSH___old,
    REQ_OP_DISCARD___old,
    REQ_OP_SECURE_ERASE___old,
};

/* enum req_op values come from the running kernel's BTF (bpf_core_enum_value), not from here. */
#define REQ_OP_VALUE(name)                                                                                             \
    (bpf_core_type_exists(enum req_op) ? bpf_core_enum_value(enum req_op, name)                                        \
                                       : bpf_core_enum_value(enum req_opf___old, name##___old))

static __always_inline u8 op_class(u32 opf)
{
    u32 op = opf & REQ_OP_MASK;

    if (op == REQ_OP_VALUE(REQ_OP_READ))
        return OPC_READ;
    if (op == REQ_OP_VALUE(REQ_OP_WRITE))
        return OPC_WRITE;
    if (op == REQ_OP_VALUE(REQ_OP_DISCARD) || op == REQ_OP_VALUE(REQ_OP_SECURE_ERASE))
        return OPC_DISCARD;
    if (op == REQ_OP_VALUE(REQ_OP_FLUSH))
        return OPC_FLUSH;
    return OPC_OTHER;
}

#endif /* BLOCKSTACK_BLOCK_BPF_H */

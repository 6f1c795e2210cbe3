/* Block-layer helpers shared by block_latency and block_sizes: device ids and operation classes.
 *
 * Device ids are encoded like the kernel's new_encode_dev() (include/linux/kdev_t.h), the format
 * of stat(2)'s st_rdev, which ebpf_exporter's `majorminor` decoder looks up in /proc/partitions.
 * The name it yields (loop0, nvme1n1, dm-3) is the one in /proc/diskstats and node_exporter.
 */
#ifndef BLOCKSTACK_BLOCK_BPF_H
#define BLOCKSTACK_BLOCK_BPF_H

#include <bpf/bpf_core_read.h>

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

/* bio->bi_bdev exists since 5.12 (commit 309dca309fc3, "block: store a block_device pointer in
 * struct bio"); these programs target kernels with it. */
static __always_inline u32 bio_dev(struct bio *bio)
{
    return disk_dev(bio->bi_bdev->bd_disk);
}

/* enum req_op values come from the running kernel's BTF (bpf_core_enum_value), not from here. */
static __always_inline u8 op_class(u32 opf)
{
    u32 op = opf & REQ_OP_MASK;

    if (op == bpf_core_enum_value(enum req_op, REQ_OP_READ))
        return OPC_READ;
    if (op == bpf_core_enum_value(enum req_op, REQ_OP_WRITE))
        return OPC_WRITE;
    if (op == bpf_core_enum_value(enum req_op, REQ_OP_DISCARD) ||
        op == bpf_core_enum_value(enum req_op, REQ_OP_SECURE_ERASE))
        return OPC_DISCARD;
    if (op == bpf_core_enum_value(enum req_op, REQ_OP_FLUSH))
        return OPC_FLUSH;
    return OPC_OTHER;
}

#endif /* BLOCKSTACK_BLOCK_BPF_H */

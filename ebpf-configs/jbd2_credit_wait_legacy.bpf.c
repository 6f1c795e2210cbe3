// jbd2_credit_wait for kernels before 6.2, from the same two points: ext4 starting a handle, then
// jbd2_handle_start once start_this_handle() has its credits (see jbd2_credit_wait.bpf.c). Two
// differences that CO-RE cannot bridge, so a variant of its own:
// - ext4 fired one tracepoint, ext4_journal_start, until commit a8ef9335b606 ("ext4: split
//   ext4_journal_start trace for debug", 6.2) made it ext4_journal_start_sb and _inode;
// - Linux 5.10 has neither task storage (5.11) nor BTF for modules (5.11, commit 36e68442d1af), and
//   ext4 and jbd2 are modules on distribution kernels, so their tracepoints cannot be tp_btf. Raw
//   tracepoints need no BTF of the tracepoint: arguments are plain u64s. The start times live in
//   a hash keyed by thread id, and the maps are preallocated (jbd2.bpf.h, JBD2_RAW_TRACEPOINTS).
// Loads on 5.10 to 6.1; select-configs.sh takes it where neither fexit nor the 6.2+ tracepoints
// load. Same metric, same YAML. Built with -DJBD2_SPLIT_START (jbd2_credit_wait_raw.bpf.c) it
// attaches to 6.2's ext4_journal_start_sb and _inode instead: the raw tracepoint variant for 6.2+,
// where libbpf cannot open the ext4 and jbd2 modules' BTF for tp_btf (it needs CAP_SYS_ADMIN,
// which ebpf_exporter's production identity does not have).
#define JBD2_RAW_TRACEPOINTS
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "jbd2.bpf.h"

// A nested start (current->journal_info set) fires no jbd2_handle_start, so it is skipped.
static __always_inline int journal_start(void)
{
    struct task_struct *task = (void *) bpf_get_current_task();

    if (BPF_CORE_READ(task, journal_info))
        return 0;
    wait_begin();
    return 0;
}

#ifndef JBD2_SPLIT_START
// TP_PROTO(struct super_block *sb, int blocks, int rsv_blocks, int revoke_creds, unsigned long IP)
// (5.10; no argument is read).
SEC("raw_tp/ext4_journal_start")
int BPF_PROG(ext4_journal_start)
{
    return journal_start();
}
#else
// TP_PROTO(struct super_block *sb, int blocks, int rsv_blocks, int revoke_creds, int type,
// unsigned long IP) and the same with struct inode *inode first (6.2+; no argument is read).
SEC("raw_tp/ext4_journal_start_sb")
int BPF_PROG(ext4_journal_start_sb)
{
    return journal_start();
}

SEC("raw_tp/ext4_journal_start_inode")
int BPF_PROG(ext4_journal_start_inode)
{
    return journal_start();
}
#endif

// TP_PROTO(dev_t dev, tid_t tid, unsigned int type, unsigned int line_no, int requested_blocks)
SEC("raw_tp/jbd2_handle_start")
int BPF_PROG(jbd2_handle_start, dev_t dev)
{
    wait_end(dev);
    return 0;
}

// jbd2_log_do_checkpoint(): the journal is full (see jbd2_checkpoint_waits_total).
SEC("raw_tp/jbd2_checkpoint")
int BPF_PROG(jbd2_checkpoint)
{
    wait_checkpoint();
    return 0;
}

char LICENSE[] SEC("license") = "GPL";

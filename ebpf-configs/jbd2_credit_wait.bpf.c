// Time a task waits for journal credits, from tracepoints only (for kernels without fentry/fexit).
//
// ext4 starts every journal handle in __ext4_journal_start_sb(), which fires ext4_journal_start_sb
// or ext4_journal_start_inode and then calls jbd2__journal_start() -> start_this_handle(); when
// start_this_handle() has its credits (add_transaction_credits(), where tasks sleep in
// wait_transaction_locked() / __jbd2_log_wait_for_space()), jbd2__journal_start() fires
// jbd2_handle_start. The interval between the two, on the same task, brackets start_this_handle()
// and so the credit wait (plus a handle allocation, well under a microsecond).
//
// A nested start (the task already holds a handle: current->journal_info is set) only takes a
// reference in jbd2__journal_start() and fires no jbd2_handle_start, so it is skipped.
// Reserved handles (ext4_journal_start_reserved) got their credits when reserved; not timed.
// Tracepoints as in Linux 6.x: ext4_journal_start_sb / _inode replaced ext4_journal_start.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "jbd2.bpf.h"

static __always_inline int journal_start(void)
{
    struct task_struct *task = bpf_get_current_task_btf();

    if (task->journal_info)
        return 0;
    wait_begin();
    return 0;
}

SEC("tp_btf/ext4_journal_start_sb")
int BPF_PROG(ext4_journal_start_sb, struct super_block *sb, int blocks, int rsv_blocks, int revoke_creds, int type,
             unsigned long ip)
{
    return journal_start();
}

SEC("tp_btf/ext4_journal_start_inode")
int BPF_PROG(ext4_journal_start_inode, struct inode *inode, int blocks, int rsv_blocks, int revoke_creds, int type,
             unsigned long ip)
{
    return journal_start();
}

SEC("tp_btf/jbd2_handle_start")
int BPF_PROG(jbd2_handle_start, dev_t dev, tid_t tid, unsigned int type, unsigned int line_no, int requested_blocks)
{
    wait_end(dev);
    return 0;
}

// jbd2_log_do_checkpoint(): the journal is full (see jbd2_checkpoint_waits_total).
SEC("tp_btf/jbd2_checkpoint")
int BPF_PROG(jbd2_checkpoint, journal_t *journal, int result)
{
    wait_checkpoint();
    return 0;
}

char LICENSE[] SEC("license") = "GPL";

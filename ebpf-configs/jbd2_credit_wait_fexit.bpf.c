// Time a task spends in jbd2's add_transaction_credits() (fs/jbd2/transaction.c), measured
// exactly with fentry/fexit: the function start_this_handle() calls to get journal credits, and
// where it sleeps until the running transaction is unlocked or the journal has space
// (wait_transaction_locked(), __jbd2_log_wait_for_space()). It returns 1 when it slept and
// start_this_handle() must retry; each call is one sample.
//
// Needs BPF trampolines (fentry/fexit: x86-64 and arm64 with CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS)
// and add_transaction_credits not inlined (it is a static function; check /proc/kallsyms).
// Where it cannot load, jbd2_credit_wait gives the same metric from tracepoints.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "jbd2.bpf.h"

SEC("fentry/add_transaction_credits")
int BPF_PROG(add_transaction_credits_entry, journal_t *journal, int blocks, int rsv_blocks)
{
    wait_begin();
    return 0;
}

SEC("fexit/add_transaction_credits")
int BPF_PROG(add_transaction_credits_exit, journal_t *journal, int blocks, int rsv_blocks, int ret)
{
    wait_end(journal->j_fs_dev->bd_dev);
    return 0;
}

// jbd2_log_do_checkpoint() inside add_transaction_credits(): the journal is full (see
// jbd2_checkpoint_waits_total).
SEC("tp_btf/jbd2_checkpoint")
int BPF_PROG(jbd2_checkpoint, journal_t *journal, int result)
{
    wait_checkpoint();
    return 0;
}

char LICENSE[] SEC("license") = "GPL";

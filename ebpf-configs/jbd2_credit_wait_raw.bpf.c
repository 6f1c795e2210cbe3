// jbd2_credit_wait from raw tracepoints on Linux 6.2+ (ext4_journal_start_sb and _inode, then
// jbd2_handle_start): jbd2_credit_wait_legacy.bpf.c built for the 6.2 tracepoints. For an
// ebpf_exporter without CAP_SYS_ADMIN (the package's and the chart's identity) on kernels whose
// ext4 and jbd2 are modules (Debian's, Ubuntu's): libbpf opens a module's BTF, which the fexit and
// tp_btf variants need, only with CAP_SYS_ADMIN; a raw tracepoint needs no BTF of its tracepoint.
// Same metric, same YAML.
#define JBD2_SPLIT_START
#include "jbd2_credit_wait_legacy.bpf.c"

// block_io with every histogram observation added to the exported maps at once (two per-CPU hash
// updates each): no lag between an I/O and its counts, ~1.5x block_io's BPF time per I/O, and no
// bpf_loop() or perf event needed, so it loads where block_io does not (Linux 5.10 to 5.16). Same
// metrics, same YAML. See README.md, "Kernels" and "Cost".
#define BLOCK_IO_IMMEDIATE
#include "block_io.bpf.c"

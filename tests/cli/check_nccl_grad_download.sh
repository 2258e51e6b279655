#!/usr/bin/env bash
# PD at dp 2 on two emulated GPUs with NCCL reduce-scatters each unit's gradient on the GPUs and
# downloads only its own segment: the compute ranks together copy half the device-to-host bytes
# of the same run over MPI (which downloads every replica's whole unit to reduce on the host),
# and train to the same bits (final loss and params_crc32c) as that run and as the replicated
# baseline at dp 2 on NCCL. The copy bytes are the emulation's own counts
# (PDTRAIN_CUDA_EMU_COUNTS: every cudaMemcpy by route), summed over the processes; the few
# device-to-host bytes that are not gradients (losses) are the same in both runs, so
#   mpi - nccl = the gradients once = nccl - the rest,
# and the check asks for nccl / mpi in [0.45, 0.55] (1.0 when every replica downloads the
# whole unit). The gradient memory each run reports stays within its bound.
# Usage: check_nccl_grad_download.sh PDTRAIN OUT_DIR -- pdtrain's --set arguments...
set -uo pipefail
pdtrain=$1 out=$2
shift 3
source "$(dirname "$0")/emulated_counts_lib.sh"
run() { emu_run "$@"; }  # run TAG RANKS ARGS...
d2h_bytes() { copy_bytes "$1" '^device to pinned host$'; }

run pd-nccl 3 "$@" --set parallel.holders=1 --set parallel.comm=nccl
run pd-mpi 3 "$@" --set parallel.holders=1 --set parallel.comm=mpi
run base-nccl 2 "$@" --set parallel.holders=0 --set parallel.comm=nccl
grep -q "tp, dp and pp over NCCL" "$out/pd-nccl.log" ||
  fail "the PD run's header does not say dp runs over NCCL"

nccl=$(final pd-nccl) mpi=$(final pd-mpi) base=$(final base-nccl)
echo "pd nccl: $nccl"
echo "pd mpi:  $mpi"
echo "baseline nccl: $base"
[ -n "$nccl" ] || fail "no final line from the PD NCCL run"
[ "$nccl" = "$mpi" ] || fail "PD over NCCL does not end with the bits of PD over MPI"
[ "$nccl" = "$base" ] || fail "PD over NCCL does not end with the bits of the baseline"

down_nccl=$(d2h_bytes pd-nccl) down_mpi=$(d2h_bytes pd-mpi)
ratio=$(awk -v a="$down_nccl" -v b="$down_mpi" 'BEGIN { printf "%.3f", (b > 0 ? a / b : -1) }')
echo "device-to-host bytes: nccl $down_nccl, mpi $down_mpi: ratio $ratio"
awk -v r="$ratio" 'BEGIN { exit !(r >= 0.45 && r <= 0.55) }' ||
  fail "PD over NCCL downloads $ratio x the bytes of PD over MPI, not about 1/2 (dp 2)"

# The gradient memory a rank held stays within GradStreamer's bound (the pool arithmetic of the
# reduce on the GPU: packed device buffers), with 0, 1 (the default) and 2 pushes in flight and
# with two micro-batches (every unit bound through the step).
within_bound() {  # within_bound TAG: the grads line's exact peak <= bound
  local line
  line=$(grep -m1 -oE "exactly [0-9]+ and [0-9]+ B" "$out/$1.log") ||
    fail "no gradient peak and bound in the $1 run's output"
  echo "$1: grads peak and bound: $line"
  awk -v l="$line" 'BEGIN { split(l, w, " "); exit !(w[2] + 0 > 0 && w[2] + 0 <= w[4] + 0) }' ||
    fail "the $1 run held more gradient memory than its bound ($line)"
}
within_bound pd-nccl
run pd-nccl-0 3 "$@" --set parallel.holders=1 --set parallel.comm=nccl --set pd.pushes_in_flight=0
within_bound pd-nccl-0
run pd-nccl-2mb 3 "$@" --set parallel.holders=1 --set parallel.comm=nccl --set pd.pushes_in_flight=2 \
  --set parallel.micro_batches=2
within_bound pd-nccl-2mb
echo "PASS"

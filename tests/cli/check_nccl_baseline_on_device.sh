#!/usr/bin/env bash
# The replicated baseline at tp 2 x pp 2 on four emulated GPUs with NCCL keeps every gradient on
# the GPUs: the tied embedding's two stages swap theirs GPU to GPU and the tp-replicated blocks
# go from tp rank 0 to the others over NCCL, so a training step copies no gradient to the host.
# Counted by the emulation (PDTRAIN_CUDA_EMU_COUNTS, every cudaMemcpy by route, summed over the
# processes) for 2 and for 3 steps: the difference is one step without set-up, checkpoint and
# the final CRC. What a step still copies to the host is its loss and norm statistics (tens of
# bytes a rank); the tied embedding alone is kilobytes. The same run over MPI (through the host)
# ends with the same bits.
# Usage: check_nccl_baseline_on_device.sh PDTRAIN OUT_DIR -- pdtrain's --set arguments...
set -uo pipefail
pdtrain=$1 out=$2
shift 3
source "$(dirname "$0")/emulated_counts_lib.sh"
run() {  # run TAG STEPS COMM ARGS...: the baseline at tp 2 x pp 2 on four GPUs
  local tag=$1 steps=$2 comm=$3
  shift 3
  emu_run "$tag" 4 "$@" --set parallel.holders=0 --set parallel.tp=2 --set parallel.pp=2 \
    --set parallel.comm="$comm" --set run.steps="$steps"
}
d2h_bytes() { copy_bytes "$1" '^device to .*host$'; }

run nccl-2 2 nccl "$@"
run nccl-3 3 nccl "$@"
run mpi-3 3 mpi "$@"
grep -q "tp, dp and pp over NCCL" "$out/nccl-3.log" || fail "the NCCL run's header does not say so"
nccl=$(final nccl-3) mpi=$(final mpi-3)
echo "baseline tp 2 x pp 2, nccl: $nccl"
echo "baseline tp 2 x pp 2, mpi:  $mpi"
[ -n "$nccl" ] || fail "no final line from the NCCL run"
[ "$nccl" = "$mpi" ] || fail "the baseline over NCCL does not end with the bits of the MPI path"

per_step=$(( $(d2h_bytes nccl-3) - $(d2h_bytes nccl-2) ))
echo "device-to-host bytes of one step over NCCL, all ranks: $per_step"
[ "$per_step" -lt 2048 ] ||
  fail "a step of the baseline over NCCL copies $per_step bytes to the host (gradients?)"
echo "PASS"

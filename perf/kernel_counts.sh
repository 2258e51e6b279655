#!/usr/bin/env bash
# Per-kernel counts of GPT-2 124M's GPU step from the emulation's profiling build (issue 42,
# docs/cuda-emulation.md "Kernel counts"; a profiler that needs no GPU). Not a timing.
#
#   perf/kernel_counts.sh [--check-only] [PROFILE_BUILD_DIR]
#
# 1. The regression check: the small deck (perf/decks/gpt2_124m_gpu.toml shrunk as
#    perf/emulated_counts.sh shrinks it: 2 layers, d_model 128, T 64) against
#    perf/kernel_counts.expected: fails when a kernel's bank-conflict ratio (shared wavefronts /
#    ideal) or uncoalesced ratio (global sectors / ideal) rose above its record (about 20 s).
#    --check-only stops here (the ctest profile.kernel_ratios).
# 2. Registers and static shared memory of every kernel from the real nvcc build
#    (nvcc -std=c++20 -arch=sm_90 -O3 -Xptxas -v on each .cu; kept in BUILD/nvcc until a .cu
#    changes).
# 3. The scaling the table relies on (perf/kernel_counts.py, "Scaling to the deck"): each count
#    of a kernel is bilinear in the layers L and the micro-batch size B, a + c B + y L + d L B;
#    checked at the small shape (fitted at (L, B) = (1,1) (2,1) (1,2) (2,2), it must give the
#    counts of (3,1) (1,3) (3,3): a kernel that does not is named and marked "?"; 7 runs, about
#    2 minutes).
# 4. GPT-2 124M at its full T 1024, d_model 768, 12 heads and vocabulary at those four (L, B)
#    (11, 16, 21 and 27 minutes on 2 shared cores: about 80 minutes in all), projected to the deck's 12 layers
#    and micro-batch of 16; one step of the deck is 32 such micro-batches and one optimizer step
#    (the kernels marked *).
# The runs take pdtrain's own attention kernels (compute.attention = "pdtrain"): cuDNN's (the
# default where it runs) are a library's, priced from its published figures, not counted here.
# Each run is one step (--stop-after 1: no evaluation, and no kernel runs before the first step:
# a 1-step run counts what the 2-step run less it counts, but for the embedding gathers' DRAM
# bytes, which follow the batch's tokens).
# Prints the table (per kernel: launches, block, dynamic shared memory, registers, static shared
# memory, occupancy on sm_90 and its limiter, shared requests and wavefronts/ideal, global
# requests and sectors/ideal, DRAM MB, tensor-core GFLOP, barriers, and the lower bound of its
# time on machines/h100-sxm.toml and machines/h200.toml with what bounds it), then
#   kernel_counts: ok
# Exit 0, or 1 when a run, the check or the scaling fails.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
check_only=0
[ "${1:-}" = "--check-only" ] && { check_only=1; shift; }
build=${1:-$src/build/cuda-profile}
py="python3 $src/perf/kernel_counts.py"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$build/pdtrain" ] || "$src/scripts/build-cuda-profile.sh" "$build"
"$build/pdtrain" --version | grep -q "emulated on the CPU" ||
  { echo "kernel_counts: $build/pdtrain is not the emulated target" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
began=$(date +%s)

deck=$src/perf/decks/gpt2_124m_gpu.toml
small=(--set model.n_head=2 --set model.d_model=128 --set model.vocab_size=512
       --set model.seq_len=64)
count_run() {  # count_run NAME OVERRIDES...: one step's counts in $work/NAME.tsv
  local name=$1 t0
  shift
  t0=$(date +%s)
  mkdir -p "$work/$name"
  if ! PDTRAIN_CUDA_EMU_PROFILE=$work/$name "$src/scripts/mpirun-local" -np 1 "$build/pdtrain" \
      "$deck" --set parallel.micro_batches=1 --set train.eval_every=0 --set run.steps=9 \
      --set compute.attention='"pdtrain"' \
      --stop-after 1 --set run.out_dir="$work/run-$name" --set checkpoint.dir="$work/ckpt-$name" \
      "$@" > "$work/log-$name" 2>&1; then
    tail -20 "$work/log-$name"
    echo "kernel_counts: the run $name failed" >&2
    exit 1
  fi
  $py merge "$work/$name" > "$work/$name.tsv"
  echo "run $name ($*): $(( $(date +%s) - t0 )) s"
}

# 1. The regression check.
count_run check "${small[@]}" --set model.n_layer=2 --set train.batch_size=4
if ! $py check "$work/check.tsv" "$src/perf/kernel_counts.expected"; then
  echo "kernel_counts: a ratio rose above its record (perf/kernel_counts.expected)" >&2
  exit 1
fi
echo "kernel_counts: ratios at or below perf/kernel_counts.expected"
[ $check_only = 1 ] && { echo "kernel_counts: ok"; exit 0; }

# 2. Resources from ptxas.
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$build/nvcc"
for cu in "$src"/src/kernels/cuda/*.cu "$src"/src/device/cuda/fixed_order_sum.cu; do
  log=$build/nvcc/$(basename "$cu" .cu).log
  [ -s "$log" ] && [ "$log" -nt "$cu" ] && [ "$log" -nt "$src/src/kernels/cuda/common.cuh" ] &&
    continue
  "$nvcc" -std=c++20 -arch=sm_90 -O3 -Xptxas -v -I"$src/include" -I"$src/src" \
      -I"$build/generated" -c "$cu" -o "$work/$(basename "$cu").o" > "$log" 2>&1 ||
    { cat "$log"; echo "kernel_counts: nvcc failed on $cu" >&2; rm -f "$log"; exit 1; }
done
$py resources "$build"/nvcc/*.log > "$work/resources.tsv"

# 3. and 4. The small shape's runs that check the scaling, then the full shape's that it is
# fitted to, projected to the deck.
for lb in 1,1 2,1 1,2 2,2 3,1 1,3 3,3; do
  count_run "small-${lb/,/-}" "${small[@]}" --set model.n_layer=${lb%,*} --set train.batch_size=${lb#*,}
done
for lb in 1,1 2,1 1,2 2,2; do
  count_run "full-${lb/,/-}" --set model.n_layer=${lb%,*} --set train.batch_size=${lb#*,}
done
$py project "$work"/full-{1-1,2-1,1-2,2-2}.tsv "$work"/small-{1-1,2-1,1-2,2-2,3-1,1-3,3-3}.tsv \
    "$work/deck.tsv" 12 16
echo "GPT-2 124M, bf16, one micro-batch of 16 x 1024 tokens through 12 layers (* once per optimizer step; ? not exactly scaled):"
$py table "$work/deck.tsv" "$work/resources.tsv" "$src/machines/h100-sxm.toml" "$src/machines/h200.toml"
echo "kernel_counts: $(( $(date +%s) - began )) s"
echo "kernel_counts: ok"

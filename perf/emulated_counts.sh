#!/usr/bin/env bash
# What one training step launches on a GPU, counted on the emulated CUDA target, beside
# `pdtrain plan`'s prediction for the same shapes on an H200 (issue 35, "Benchmarks": the figures
# to have until a GPU is lent). Not a timing: the emulation has no clock worth reading.
#
#   perf/emulated_counts.sh [--set KEY=VALUE]... [EMULATED_BUILD_DIR] [MAIN_BUILD_DIR]
#
# Runs the GPU deck perf/decks/gpt2_124m_gpu.toml shrunk to what the emulation runs in a minute
# (GPT-2's head size 64 and its layer structure, bf16, the baseline on one compute rank; the
# shrinking overrides are printed) for 1 and for 2 steps with PDTRAIN_CUDA_EMU_COUNTS, and
# subtracts: what remains is one optimizer step, without set-up, checkpoint or evaluation.
# Prints per kernel / GEMM shape / copy route: launches (calls), threads, FLOPs and bytes per
# step (a kernel's own bytes are not known to the emulation: "-"), then one greppable line
#   counts per_step: launches=.. kernels=.. gemms=.. gemm_flops=.. model_flops=..
#     gemm_flops_vs_model=.. copies=.. copy_bytes=.. memsets=.. memset_bytes=..
# where model_flops is the plan's model FLOPs per step (6 N + 6 L T C per token, perf/bench_gpu.sh's
# convention: causal attention counted at half the square; recomputation not counted), then the
# plan's prediction for the same deck on machines/h200.toml. Exit 0, or 1 when a run fails.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
sets=()
while [ $# -gt 0 ]; do
  case $1 in
    --set) sets+=(--set "$2"); shift 2 ;;
    *) break ;;
  esac
done
emu=${1:-$src/build/cuda-emulated}
main=${2:-$src/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$emu/pdtrain" --version | grep -q "emulated on the CPU" ||
  { echo "emulated_counts: $emu/pdtrain is not the emulated target" >&2; exit 1; }

deck=$src/perf/decks/gpt2_124m_gpu.toml
shrink=(--set model.n_layer=2 --set model.n_head=2 --set model.d_model=128
        --set model.vocab_size=512 --set model.seq_len=64 --set train.batch_size=4
        --set parallel.micro_batches=1 --set train.eval_every=0 --set run.log_every=1)
echo "deck: $deck ${shrink[*]} ${sets[*]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

count_run() {  # count_run STEPS: the counts of a run of STEPS steps, merged over processes
  local steps=$1 dir=$work/counts-$1
  mkdir -p "$dir"
  if ! PDTRAIN_CUDA_EMU_COUNTS=$dir ASAN_OPTIONS=detect_leaks=0 \
      "$src/scripts/mpirun-local" -np 1 "$emu/pdtrain" "$deck" "${shrink[@]}" "${sets[@]}" \
      --set run.steps="$steps" --set run.out_dir="$work/run-$steps" \
      --set checkpoint.dir="$work/ckpt-$steps" > "$work/log-$steps" 2>&1; then
    tail -20 "$work/log-$steps"
    echo "emulated_counts: the $steps-step run failed" >&2
    exit 1
  fi
  awk -F'\t' 'FNR > 1 { k = $1 "\t" $2; c[k] += $3; t[k] += $4; f[k] += $5; b[k] += $6 }
              END { for (k in c) printf "%s\t%d\t%d\t%d\t%d\n", k, c[k], t[k], f[k], b[k] }' \
      "$dir"/counts.*.tsv | sort > "$work/merged-$steps"
}
count_run 1
count_run 2

# One step = the 2-step run less the 1-step run, row by row (a row of one run only counts 0
# in the other).
join -t $'\t' -a 1 -a 2 -e 0 -o 0,1.2,1.3,1.4,1.5,2.2,2.3,2.4,2.5 \
    <(awk -F'\t' '{ printf "%s|%s\t%s\t%s\t%s\t%s\n", $1, $2, $3, $4, $5, $6 }' "$work/merged-2") \
    <(awk -F'\t' '{ printf "%s|%s\t%s\t%s\t%s\t%s\n", $1, $2, $3, $4, $5, $6 }' "$work/merged-1") |
  awk -F'\t' '{ printf "%s\t%d\t%d\t%d\t%d\n", $1, $2 - $6, $3 - $7, $4 - $8, $5 - $9 }' |
  awk -F'\t' '$2 != 0' > "$work/step"

printf "%-7s %-64s %7s %10s %12s %12s\n" kind name calls threads flops bytes
awk -F'\t' '{ split($1, k, "|"); b = (k[1] == "kernel") ? "-" : $5
              printf "%-7s %-64s %7d %10d %12d %12s\n", k[1], substr(k[2], 1, 64), $2, $3, $4, b }' \
    "$work/step"

# The plan for the same deck on an H200: its model FLOPs per step (6 N + 6 L T C per token, the
# convention of perf/bench_gpu.sh) to hold the counted GEMM FLOPs against, and its prediction.
plan=$("$main/pdtrain" plan "$deck" "${shrink[@]}" "${sets[@]}" --machine "$src/machines/h200.toml" \
           --ranks 1 2>&1) || { echo "$plan"; echo "emulated_counts: pdtrain plan failed" >&2; exit 1; }
model_tflop=$(echo "$plan" | grep -oE "[0-9.e+-]+ model TFLOP per step" | grep -oE "^[0-9.e+-]+" || echo 0)
awk -F'\t' -v model_tflop="$model_tflop" '
  { split($1, k, "|"); calls[k[1]] += $2; flops[k[1]] += $4; bytes[k[1]] += $5; all += $2 }
  END {
    model = model_tflop * 1e12
    printf "counts per_step: launches=%d kernels=%d gemms=%d gemm_flops=%.4g model_flops=%.4g " \
           "gemm_flops_vs_model=%s copies=%d copy_bytes=%d memsets=%d memset_bytes=%d\n", all,
           calls["kernel"], calls["gemm"], flops["gemm"], model,
           (model > 0 ? sprintf("%.3f", flops["gemm"] / model) : "n/a"), calls["copy"],
           bytes["copy"], calls["memset"], bytes["memset"] }' "$work/step"
echo "plan on machines/h200.toml for the same deck:"
echo "$plan" | grep -E "^(step of|  stage|memory|throughput|predicted)" || true
echo "emulated_counts: ok"

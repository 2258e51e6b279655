#!/usr/bin/env bash
# fp32 against bf16 (train.precision) on one rank with both cores, GPT-2 124M shapes, at
# batch 4 x 64 and 8 x 256: step time, tokens/s and model GFLOP/s (6 x parameters x tokens per
# step), each as a fraction of the same-run matmul ceiling of its precision (bench_matmul at
# the 124M shapes with the same thread count). Targets (issue 8): bf16 step >= 4x faster than
# fp32, and >= 50 % of the bf16 ceiling.
#   perf/bench_precision.sh [--short] [BUILD_DIR]     (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
short=0
if [[ ${1:-} == --short ]]; then short=1; shift; fi
build=${1:-build}
threads=${THREADS:-$(nproc)}
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=()
cases=("4 64" "8 256")
steps=4
if (( short )); then
  model=(--set model.n_layer=2 --set model.d_model=128 --set model.n_head=4 --set model.vocab_size=512)
  cases=("4 64")
  steps=3
fi
if (( short )); then
  ceiling=$("$build/perf/bench_matmul" --short --threads "$threads" | grep '^ceiling:')
else
  ceiling=$("$build/perf/bench_matmul" --threads "$threads" --tokens 256 --seconds 0.5 | grep '^ceiling:')
fi
echo "bench_precision: $threads thread(s); matmul $ceiling"
c32=$(sed -E 's/.*fp32=([0-9.]+).*/\1/' <<< "$ceiling")
c16=$(sed -E 's/.*bf16=([0-9.]+).*/\1/' <<< "$ceiling")
for c in "${cases[@]}"; do
  read -r B T <<< "$c"
  declare -A ms
  for p in fp32 bf16; do
    scripts/mpirun-local -np 1 "$build/pdtrain" perf/decks/pd_124m.toml "${model[@]}" \
      --set parallel.holders=0 --set train.batch_size="$B" --set model.seq_len="$T" \
      --set run.steps=$steps --set train.precision=$p --set run.out_dir="$out/$p-$B-$T" \
      > "$out/$p-$B-$T.log" 2>&1 || { tail "$out/$p-$B-$T.log"; echo "bench_precision: FAIL"; exit 1; }
    # mean step time over steps 2..N-1 (step 1 warms up, step N evaluates)
    ms[$p]=$(awk -F, 'NR > 2 { v[NR] = $7 } END { s = 0; n = 0; for (i = 3; i < NR + 1 - 1; ++i) { s += v[i]; ++n }
                      printf "%.1f", s / n }' "$out/$p-$B-$T/metrics.csv")
    params=$(grep -o '| [0-9]* parameters' "$out/$p-$B-$T.log" | grep -o '[0-9]*')
  done
  awk -v B="$B" -v T="$T" -v P="$params" -v a="${ms[fp32]}" -v b="${ms[bf16]}" -v c32="$c32" -v c16="$c16" 'BEGIN {
    f = 6 * P * B * T / 1e9
    printf "batch %dx%d: fp32 %.0f ms (%.0f tok/s, %.1f GFLOP/s, %.2f of fp32 ceiling) | bf16 %.0f ms (%.0f tok/s, %.1f GFLOP/s, %.2f of bf16 ceiling) | speedup bf16/fp32 %.2fx (target >= 4)\n",
      B, T, a, B * T / (a / 1e3), f / (a / 1e3), f / (a / 1e3) / c32, b, B * T / (b / 1e3), f / (b / 1e3), f / (b / 1e3) / c16, a / b }'
done
echo "bench_precision: ok"

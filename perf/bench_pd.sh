#!/usr/bin/env bash
# Parameter/compute decoupling against the replicated baseline on the same compute rank:
#   (a) holders = 0: one rank holds parameters, gradients and AdamW state
#   (b) PD, blocking: one holder + the compute rank, each layer fetched when needed by the
#       compute thread itself (pd.prefetch_depth = 0, pd.fetch_thread = false)
#   (c) PD, prefetch: the same with pd.prefetch_depth uses fetched ahead by the fetch thread,
#       and the parameter cache bounded (pd.cache_mb) so the compute rank holds a fraction of
#       the parameters
#   (d) as (c) with pd.staleness = 1 (the push -> update -> fetch chain overlaps the next step)
# Prints step-time ratios b/a and c/a, the exposed fetch wait as a share of the step, bytes
# fetched per step, and the compute rank's resident parameter + optimizer bytes against the
# baseline's. Step time is the mean over steps 2..N-1 (step 1 warms up, step N evaluates).
#   perf/bench_pd.sh [--short] [PDTRAIN]       (from the repository root, after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
short=0
if [[ ${1:-} == --short ]]; then short=1; shift; fi
bin=${1:-build/pdtrain}
deck=perf/decks/pd_124m.toml
cache_mb=200   # the tied embedding + final LayerNorm (154 MiB) and a few layers (27 MiB each)
sets=()
if (( short )); then
  sets=(--set model.n_layer=4 --set model.d_model=128 --set model.n_head=4 --set model.vocab_size=512
        --set model.seq_len=64 --set run.steps=6)
  cache_mb=1.6
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # name ranks extra-sets...
  local name=$1 np=$2; shift 2
  scripts/mpirun-local -np "$np" "$bin" "$deck" "${sets[@]}" --set run.out_dir="$out/$name" "$@" \
    > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; echo "bench_pd: FAIL: run $name"; exit 1; }
}
run a 1 --set parallel.holders=0
run b 2 --set parallel.holders=1 --set pd.prefetch_depth=0 --set pd.fetch_thread=false
run c 2 --set parallel.holders=1 --set pd.prefetch_depth=2 --set pd.cache_mb=$cache_mb --set pd.fetch_thread=true
run d 2 --set parallel.holders=1 --set pd.prefetch_depth=2 --set pd.cache_mb=$cache_mb --set pd.fetch_thread=true --set pd.staleness=1

# mean step_ms, fetch_ms over steps 2..N-1 from metrics.csv
mean() {  # file column-name
  awk -F, -v col="$2" 'NR==1 { for (i = 1; i <= NF; ++i) if ($i == col) c = i; next }
                       { v[NR] = $c } END { n = 0; s = 0; for (i = 3; i < NR; ++i) { s += v[i]; ++n }
                       printf "%.3f", s / n }' "$1/metrics.csv"
}
params=$(grep -o '| [0-9]* parameters' "$out/a.log" | grep -o '[0-9]*')
steps=$(awk -F, 'END { print $1 }' "$out/a/metrics.csv")
echo "bench_pd: $(grep -m1 '^model:' "$out/a.log")"
for r in a b c d; do
  echo "config $r: step_ms=$(mean "$out/$r" step_ms) fetch_wait_ms=$(mean "$out/$r" fetch_ms) | $(grep -m1 '^summary:' "$out/$r.log")"
  grep -m1 '^cache:' "$out/$r.log" || true
  grep -m1 '^holder 0:' "$out/$r.log" || true
done
awk -v a="$(mean "$out/a" step_ms)" -v b="$(mean "$out/b" step_ms)" -v c="$(mean "$out/c" step_ms)" \
    -v d="$(mean "$out/d" step_ms)" -v wb="$(mean "$out/b" fetch_ms)" \
    -v wc="$(mean "$out/c" fetch_ms)" -v wd="$(mean "$out/d" fetch_ms)" 'BEGIN {
  printf "ratio b/a=%.3f c/a=%.3f d/a=%.3f (target c/a <= 1.05)\n", b / a, c / a, d / a
  printf "exposed fetch wait: b %.1f %% c %.1f %% d %.1f %% of the step (target <= 5 %%)\n", 100 * wb / b, 100 * wc / c, 100 * wd / d }'
# Bytes: fetched per step from the cache line; resident = the cache's peak (no optimizer state on
# a compute rank) against the baseline's parameters + AdamW m and v (3 x 4 bytes per parameter).
peak=$(grep -m1 '^cache:' "$out/c.log" | sed -E 's/.*peak ([0-9.]+) MiB.*/\1/')
fetched=$(grep -m1 '^cache:' "$out/c.log" | sed -E 's/.*fetched ([0-9.]+) MiB.*/\1/')
awk -v p="$params" -v peak="$peak" -v f="$fetched" -v n="$steps" 'BEGIN {
  base = 3 * 4 * p / 1048576
  printf "fetched per step (c): %.1f MiB\n", f / n
  printf "resident params+optimizer: PD compute rank %.1f MiB, baseline %.1f MiB, ratio %.3f (target <= 0.167)\n", peak, base, peak / base }'
echo "bench_pd: ok"

#!/usr/bin/env bash
# Parameter/compute decoupling against the replicated baseline, whole training steps, with the
# holder on its own core the way a cluster gives holders their own cores or nodes (2 ranks on
# this machine's 2 cores; every rank one BLAS thread):
#   (a)  holders = 0: one rank holds parameters, gradients and AdamW state
#   (b0) PD: one holder + the compute rank, prefetch, gradients streamed during backward,
#        staleness 0, unbounded parameter cache
#   (b1) as (b0) with pd.staleness = 1 (the update of step k overlaps step k+1) from the first
#        step: pd.staleness_warmup = 0 (with the default warm-up of 200 synchronous steps a
#        short run never computes on a delayed version, and (b1) would time (b0) again)
#   (c)  as (b0) with pd.cache_mb = two layers (or the least the model accepts): the memory side
#   (c0) as (c) with pd.pushes_in_flight = 0: backward waits for each push, which goes from the
#        unit's gradient memory (no packed copy): the least gradient memory
#   (d)  as (c) with 4 micro-batches, micro-batch order: each micro-batch re-fetches the layers
#   (e)  as (d) in layer-major order (parallel.order = layer): each layer once per direction
# Prints step-time ratios against (a), the exposed fetch wait as a share of the step, the
# compute rank's parameter + gradient memory (its own accounting: the cache's and the gradient
# streamer's peaks) against the baseline's 16 bytes per parameter (parameters, gradients, AdamW
# m and v), and bytes fetched per training step / the stage's bytes for (d) and (e).
# Step time is the mean over steps 2..N-1 (step 1 warms up, step N evaluates).
#   perf/bench_pd.sh [--short] [--model d384|124m] [--paired N] [PDTRAIN]   (repository root)
# --paired N: only (a), (b0) and (b1), run one after another N times; each round's ratios
# compare runs of the same minute, and their medians are the step-time figures to quote on a
# machine shared with other work (its load moves more between minutes than the configurations
# differ).
set -euo pipefail
cd "$(dirname "$0")/.."
short=0 model=124m paired=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --short) short=1; shift ;;
    --model) model=$2; shift 2 ;;
    --paired) paired=$2; shift 2 ;;
    *) break ;;
  esac
done
bin=${1:-build/pdtrain}
sets=()
case $model in
  124m) deck=perf/decks/pd_124m.toml
        cache_mb=200 ;;  # the tied embedding + final LayerNorm (154 MiB) and a layer (27 MiB)
  d384) deck=perf/decks/pd_d384.toml
        cache_mb=14 ;;   # two layers (6.8 MiB each); the embedding is 0.4 MiB
  *) echo "bench_pd: unknown --model $model (d384 or 124m)" >&2; exit 2 ;;
esac
if (( short )); then
  sets=(--set model.n_layer=4 --set model.d_model=128 --set model.n_head=4 --set model.vocab_size=512
        --set model.seq_len=64 --set run.steps=6)
  cache_mb=0.8
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# mean of a metrics.csv column over steps 2..N-1
mean() {  # run column-name
  awk -F, -v col="$2" 'NR==1 { for (i = 1; i <= NF; ++i) if ($i == col) c = i; next }
                       { v[NR] = $c } END { n = 0; s = 0; for (i = 3; i < NR; ++i) { s += v[i]; ++n }
                       printf "%.3f", s / n }' "$out/$1/metrics.csv"
}
run() {  # name ranks extra-sets...
  local name=$1 np=$2; shift 2
  scripts/mpirun-local -np "$np" "$bin" "$deck" "${sets[@]}" --set run.out_dir="$out/$name" "$@" \
    > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; echo "bench_pd: FAIL: run $name"; exit 1; }
}
pd=(--set parallel.holders=1 --set pd.prefetch_depth=2)
stale1=(--set pd.staleness=1 --set pd.staleness_warmup=0)
if (( paired > 0 )); then
  echo "bench_pd: cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  r0=() r1=()
  for i in $(seq 1 "$paired"); do
    run a$i 1 --set parallel.holders=0
    run b0$i 2 "${pd[@]}"
    run b1$i 2 "${pd[@]}" "${stale1[@]}"
    a=$(mean a$i step_ms) b0=$(mean b0$i step_ms) b1=$(mean b1$i step_ms)
    r0+=("$(awk -v x="$b0" -v a="$a" 'BEGIN { printf "%.3f", x / a }')")
    r1+=("$(awk -v x="$b1" -v a="$a" 'BEGIN { printf "%.3f", x / a }')")
    echo "round $i: step_ms a=$a b0=$b0 b1=$b1 | b0/a=${r0[-1]} b1/a=${r1[-1]} | load $(cut -d' ' -f1 /proc/loadavg)"
  done
  med() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
  echo "paired median over $paired rounds: b0/a=$(med "${r0[@]}") (target <= 1.05) b1/a=$(med "${r1[@]}") (target <= 1.02)"
  echo "bench_pd: ok"
  exit 0
fi
run a 1 --set parallel.holders=0
run b0 2 "${pd[@]}"
run b1 2 "${pd[@]}" "${stale1[@]}"
run c 2 "${pd[@]}" --set pd.cache_mb=$cache_mb
run c0 2 "${pd[@]}" --set pd.cache_mb=$cache_mb --set pd.pushes_in_flight=0
run d 2 "${pd[@]}" --set pd.cache_mb=$cache_mb --set parallel.micro_batches=4
run e 2 "${pd[@]}" --set pd.cache_mb=$cache_mb --set parallel.micro_batches=4 --set parallel.order=layer

# "12.3 MiB" in a summary line after `label` -> bytes
bytes_after() {  # run line-prefix label
  grep -m1 "^$2" "$out/$1.log" | sed -E "s/.*$3 ([0-9.]+) (B|KiB|MiB|GiB).*/\1 \2/" |
    awk '{ m = $2 == "GiB" ? 2^30 : $2 == "MiB" ? 2^20 : $2 == "KiB" ? 2^10 : 1; printf "%.0f", $1 * m }'
}
params=$(grep -o '| [0-9]* parameters' "$out/a.log" | grep -o '[0-9]*')
echo "bench_pd: $(grep -m1 '^model:' "$out/a.log")"
echo "bench_pd: $(grep -m1 '^compute:' "$out/a.log")"
echo "bench_pd: cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc --all) cores"
for r in a b0 b1 c c0 d e; do
  echo "config $r: step_ms=$(mean $r step_ms) compute_ms=$(mean $r compute_ms) fetch_wait_ms=$(mean $r fetch_ms) stream_ms=$(mean $r reduce_ms) push_wait_ms=$(mean $r push_ms)"
  grep -m1 '^summary:' "$out/$r.log" || true
  grep -m1 '^cache:' "$out/$r.log" || true
  grep -m1 '^fetched per training step:' "$out/$r.log" || true
  grep -m1 '^grads:' "$out/$r.log" || true
  grep -m1 '^holder 0:' "$out/$r.log" || true
done
awk -v a="$(mean a step_ms)" -v b0="$(mean b0 step_ms)" -v b1="$(mean b1 step_ms)" \
    -v c="$(mean c step_ms)" -v c0="$(mean c0 step_ms)" -v w0="$(mean b0 fetch_ms)" \
    -v w1="$(mean b1 fetch_ms)" -v wc="$(mean c fetch_ms)" 'BEGIN {
  printf "ratio b0/a=%.3f (target <= 1.05) b1/a=%.3f (target <= 1.02) c/a=%.3f c0/a=%.3f\n", b0 / a, b1 / a, c / a, c0 / a
  printf "exposed fetch wait: b0 %.1f %% b1 %.1f %% c %.1f %% of the step (target <= 5 %%)\n",
         100 * w0 / b0, 100 * w1 / b1, 100 * wc / c }'
for r in c c0; do
  cache=$(bytes_after $r cache: peak) grads=$(bytes_after $r grads: peak)
  awk -v r="$r" -v p="$params" -v cache="$cache" -v grads="$grads" 'BEGIN {
    base = 16 * p
    printf "compute-rank params+grads+optimizer (%s): cache peak %.1f MiB + gradients peak %.1f MiB = %.1f MiB; baseline 16 B/param %.1f MiB; ratio %.3f (target <= 0.167)\n",
           r, cache / 2^20, grads / 2^20, (cache + grads) / 2^20, base / 2^20, (cache + grads) / base }'
done
ratio() { grep -m1 '^fetched per training step:' "$out/$1.log" | sed -E 's/.*= ([0-9.]+) x.*/\1/'; }
echo "fetched per training step / stage bytes, 4 micro-batches, cache $cache_mb MiB: micro-batch order $(ratio d), layer-major $(ratio e) (target <= 2)"
echo "bench_pd: ok"

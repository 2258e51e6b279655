#!/usr/bin/env bash
# BitDelta checkpoints worth using (issue 16): for each checkpoint setting, the whole-file size
# of a delta checkpoint against the raw fp32 state it stands for, and the validation loss of a
# run restarted from that delta against the uninterrupted run's at the same steps.
#
#   raw bytes  = 12 x parameters: the parameters, Adam m and Adam v as plain fp32, no metadata
#                (what a raw codec file holds, less its HDF5 headers)
#   file ratio = raw bytes / size of the delta file (ckpt-00000200.h5, the whole .h5 file; its
#                anchor is another file, written every anchor_every-th checkpoint)
#   loss ratio = val loss of the restarted run / the uninterrupted run's, at steps 250 and 300
#
# The run (the issue's): 4 layers, d_model 128, 4 heads, tinyshakespeare bytes, batch 16 x 64,
# 300 steps, validation every 50 steps, checkpoints every 50 with an anchor every 4 (anchors at
# 50 and 250: the step-200 checkpoint is the delta furthest from its anchor). The uninterrupted
# run is run once (checkpoints do not change training); each setting then trains 200 steps
# writing its checkpoints (run.steps 300 with --stop-after 200, so that its learning-rate
# schedule is the full run's), and restarts from its step-200 delta to step 300. The lossless
# xor setting is the control: its ratios must be exactly 1.
#
#   perf/bench_bitdelta.sh [--short] [--gpt2] [BUILD_DIR] [-- "SETS" ...]
#     SETS: one setting per argument, a space-separated list of key=value (--set) pairs;
#     default: the settings compared in perf/RESULTS.md.
#   --short  2 layers, d_model 64, 50 steps, checkpoints every 10, the xor control and the
#            default 4/6-bit setting only (checks the script: the control's ratios must be 1.0000)
#   --gpt2   also the file ratio at GPT-2 124M shapes: a 3-step run (anchor after step 1,
#            deltas after 2 and 3; size only)
set -euo pipefail
cd "$(dirname "$0")/.."
short=0 gpt2=0
while [[ ${1:-} == --* && ${1:-} != -- ]]; do
  case $1 in
    --short) short=1 ;;
    --gpt2) gpt2=1 ;;
    *) echo "bench_bitdelta: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
build=build
if [[ $# -gt 0 && $1 != -- ]]; then build=$1; shift; fi
[[ ${1:-} == -- ]] && shift
settings=("$@")
if (( ${#settings[@]} == 0 && short )); then
  settings=("checkpoint.codec=xor" "checkpoint.bitdelta_bits=4 checkpoint.moment_bits=6")
elif (( ${#settings[@]} == 0 )); then  # the table of perf/RESULTS.md, issue 16
  settings=("checkpoint.codec=xor"
            "checkpoint.bitdelta_bits=1 checkpoint.moment_bits=0"
            "checkpoint.bitdelta_bits=1 checkpoint.moment_bits=8"
            "checkpoint.bitdelta_bits=4 checkpoint.moment_bits=0"
            "checkpoint.bitdelta_bits=4 checkpoint.moment_bits=8"
            "checkpoint.bitdelta_bits=4 checkpoint.moment_bits=6"
            "checkpoint.bitdelta_bits=4 checkpoint.moment_bits=4"
            "checkpoint.bitdelta_bits=3 checkpoint.moment_bits=6"
            "checkpoint.bitdelta_bits=2 checkpoint.moment_bits=4")
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

steps=300 every=50 cut=200
model=(--set model.n_layer=4 --set model.d_model=128 --set model.n_head=4)
if (( short )); then
  steps=50 every=10 cut=30
  model=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4)
fi
common=(perf/decks/shakespeare_6l.toml "${model[@]}" --set train.batch_size=16
        --set model.seq_len=64 --set train.eval_every=$every --set run.log_every=$every
        --set checkpoint.every=$every --set checkpoint.anchor_every=4 --set checkpoint.keep=0
        --set checkpoint.codec=bitdelta)

# pdtrain ARGS... > LOG, failing the benchmark with the log's tail.
train() {
  local log=$1; shift
  scripts/mpirun-local -np 3 "$build/pdtrain" "${common[@]}" "$@" > "$log" 2>&1 ||
    { tail -n 20 "$log"; echo "bench_bitdelta: FAIL ($log)"; exit 1; }
}
# The largest error bound per state over the tensors of a bitdelta file (pdtrain inspect).
bounds() {
  "$build/pdtrain" inspect "$1" | awk '/error bounds/ { on = 1; next }
    on && /^    [a-z]/ { for (i = 2; i < NF; i += 2) if (!($i in m) || $(i + 1) + 0 > m[$i]) m[$i] = $(i + 1) + 0 }
    END { if ("params" in m) printf "params %.3g", m["params"]
          if ("adam_m" in m) printf ", adam_m %.3g, adam_v %.3g (relative)", m["adam_m"], m["adam_v"] }'
}
# val_loss METRICS STEP
val_loss() { awk -F, -v s="$2" '$1 == s { print $3 }' "$1"; }

ref=$out/reference
train "$out/reference.log" --set run.steps=$steps --set run.out_dir="$ref"
params=$(grep -o '| [0-9]* parameters' "$out/reference.log" | grep -o '[0-9]*')
raw=$((12 * params))
mid=$(( (cut + steps) / 2 ))
ref_mid=$(val_loss "$ref/metrics.csv" $mid)
ref_end=$(val_loss "$ref/metrics.csv" $steps)
echo "bench_bitdelta: $params parameters, raw fp32 state (params + m + v) $raw bytes;" \
     "uninterrupted val loss $ref_mid at step $mid, $ref_end at step $steps"

i=0
for s in "${settings[@]}"; do
  sets=()
  for kv in $s; do sets+=(--set "$kv"); done
  d=$out/s$i
  # --stop-after, not run.steps=$cut: the learning-rate schedule must be the full run's
  train "$d.log" "${sets[@]}" --set run.steps=$steps --stop-after $cut --set run.out_dir="$d/first"
  delta=$(printf '%s/first/checkpoints/ckpt-%08d.h5' "$d" $cut)
  bytes=$(stat -c %s "$delta")
  for st in $((cut - 2 * every)) $((cut - every)) $cut; do  # 1, 2, 3 intervals after the anchor
    b=$(bounds "$(printf '%s/first/checkpoints/ckpt-%08d.h5' "$d" $st)")
    if [[ -n $b ]]; then echo "setting $s: error bounds of ckpt-$st: $b"; fi
  done
  train "$d.restart.log" "${sets[@]}" --set run.steps=$steps --set run.out_dir="$d/second" \
    --restart "$delta"
  grep -q "restart: from $delta" "$d.restart.log" || { echo "bench_bitdelta: FAIL (no restart)"; exit 1; }
  got_mid=$(val_loss "$d/second/metrics.csv" $mid)
  got_end=$(val_loss "$d/second/metrics.csv" $steps)
  awk -v s="$s" -v raw=$raw -v b=$bytes -v rm=$ref_mid -v gm=$got_mid -v re=$ref_end \
      -v ge=$got_end -v m=$mid -v e=$steps -v c=$cut 'BEGIN {
    printf "setting %s: delta ckpt-%d %d bytes, file ratio %.2fx | restarted val loss %.4f / %.4f = %.4f at step %d, %.4f / %.4f = %.4f at step %d\n",
      s, c, b, raw / b, gm, rm, gm / rm, m, ge, re, ge / re, e }'
  i=$((i + 1))
done

if (( gpt2 )); then
  g=$out/gpt2
  scripts/mpirun-local -np 2 "$build/pdtrain" perf/decks/pd_124m.toml --set run.steps=3 \
    --set parallel.holders=1 \
    --set train.batch_size=2 --set model.seq_len=64 --set train.eval_every=0 \
    --set checkpoint.every=1 --set checkpoint.anchor_every=4 --set checkpoint.keep=0 \
    --set checkpoint.codec=bitdelta --set run.out_dir="$g" ${GPT2_SETS:-} > "$g.log" 2>&1 ||
    { tail -n 20 "$g.log"; echo "bench_bitdelta: FAIL ($g.log)"; exit 1; }
  params=$(grep -o '| [0-9]* parameters' "$g.log" | grep -o '[0-9]*')
  for st in 2 3; do
    bytes=$(stat -c %s "$(printf '%s/checkpoints/ckpt-%08d.h5' "$g" $st)")
    awk -v p=$params -v b=$bytes -v st=$st -v s="${GPT2_SETS:-defaults}" 'BEGIN {
      printf "gpt2-124m shapes (%s): %d parameters, delta ckpt-%d %d bytes, file ratio %.2fx\n",
        s, p, st, b, 12 * p / b }'
  done
fi
echo "bench_bitdelta: ok"

#!/usr/bin/env bash
# The divergence guard: 10 good steps with checkpoints, then a continuation at a learning rate
# that makes the loss overflow. The job must exit 5 within seconds, naming the step, the
# quantity and where it was seen; no step after it is reported; the parameters it ends with are
# those before the diverged step (no holder touched one); every checkpoint left holds finite
# parameters and moments only, and the good ones (steps 5 and 10) are kept.
# Usage: check_divergence.sh PDTRAIN OUT_DIR WHERE_PATTERN "LAYOUT SETS" -- mpirun-prefix...
set -u
pdtrain=$1 out=$2 where=$3 layout=$4
shift 5
rm -rf "$out"
sets=(--set run.steps=30 --set run.log_every=1 --set checkpoint.every=5 --set checkpoint.keep=2
      --set checkpoint.codec=raw --set run.out_dir="$out")
for s in $layout; do sets+=(--set "$s"); done
log=$(mktemp)
fail=0
if ! "$@" "$pdtrain" "${sets[@]}" --stop-after 10 >"$log" 2>&1; then
  echo "FAIL: the 10 good steps did not run"; cat "$log"; exit 1
fi
start=$(date +%s)
timeout --kill-after=5 120 "$@" "$pdtrain" "${sets[@]}" --restart auto --set optimizer.lr=1e4 \
  --set optimizer.warmup_steps=0 >"$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -eq 5 ] || { echo "FAIL: exit status $rc after divergence, expected 5"; fail=1; }
[ $elapsed -le 60 ] || { echo "FAIL: took ${elapsed}s"; fail=1; }
msg=$(grep -E "^pdtrain: error: training diverged at step [0-9]+: the (gradient norm|loss) is -?(nan|inf)" "$log")
[ -n "$msg" ] || { echo "FAIL: no divergence message"; fail=1; }
echo "$msg" | grep -qE -- "$where" || { echo "FAIL: the message does not name /$where/"; fail=1; }
step=$(echo "$msg" | sed -nE 's/.*diverged at step ([0-9]+):.*/\1/p')
if [ -n "$step" ]; then
  last=$(grep -E "^step +[0-9]+/" "$log" | tail -n 1 | sed -nE 's/^step +([0-9]+)\/.*/\1/p')
  [ "$last" = "$step" ] || { echo "FAIL: steps reported up to $last, diverged at $step"; fail=1; }
  for f in "$out"/checkpoints/ckpt-*.h5; do
    n=$(basename "$f" .h5); n=$((10#${n#ckpt-}))
    [ "$n" -lt "$step" ] || { echo "FAIL: $f written at or after the diverged step $step"; fail=1; }
  done
fi
# Nothing of the diverged step was applied: the parameters the run ends with are those of a run
# stopped right before it (same restart point, same deck).
if [ -n "$step" ]; then
  crc=$(sed -nE "s/^final step=$step .*params_crc32c=([0-9a-f]+).*/\1/p" "$log")
  ref=$(mktemp -d)
  "$@" "$pdtrain" "${sets[@]}" --set run.out_dir="$ref" --set optimizer.lr=1e4 \
    --set optimizer.warmup_steps=0 --restart "$out/checkpoints/ckpt-00000010.h5" \
    --stop-after $((step - 1)) >"$ref/log" 2>&1
  want=$(sed -nE "s/^final step=$((step - 1)) .*params_crc32c=([0-9a-f]+).*/\1/p" "$ref/log")
  [ -n "$crc" ] && [ "$crc" = "$want" ] \
    || { echo "FAIL: parameters after the divergence ($crc) differ from step $((step - 1))'s ($want)"; fail=1; }
  rm -rf "$ref"
fi
for good in 5 10; do
  [ -f "$out/checkpoints/$(printf 'ckpt-%08d.h5' $good)" ] || { echo "FAIL: good checkpoint of step $good deleted"; fail=1; }
done
for f in "$out"/checkpoints/ckpt-*.h5; do
  for g in /params /adam_m /adam_v; do
    if h5dump -g "$g" "$f" | grep -qiE "(^|[ ,:])-?(nan|inf)([ ,]|$)"; then
      echo "FAIL: $f holds a value that is not finite in $g"; fail=1
    fi
  done
done
[ $fail -eq 0 ] && echo "PASS: $msg; final params_crc32c $crc as at step $((step - 1))" || cat "$log"
rm -f "$log"
exit $fail

#!/usr/bin/env bash
# train.on_divergence = rewind: a learning rate that makes the loss overflow within a few steps;
# each divergence is logged as a rewind to the newest checkpoint before it (or step 0) with a
# lower learning rate, the run ends at its last step with exit 0 and a finite loss, every
# step has exactly one metrics row, no checkpoint holds a value that is not finite, and a
# second run gives the same params_crc32c (rewinds are reproducible).
# Usage: check_rewind.sh PDTRAIN OUT_DIR -- mpirun-prefix...
set -u
pdtrain=$1 out=$2
shift 3
sets=(--set run.steps=30 --set checkpoint.every=5 --set checkpoint.keep=2 --set checkpoint.codec=raw
      --set train.on_divergence=rewind --set train.rewind_lr_factor=0.1 --set train.max_rewinds=6
      --set optimizer.lr=1e4 --set optimizer.warmup_steps=5)
log=$(mktemp)
fail=0
crcs=()
for run in 1 2; do
  rm -rf "$out"
  timeout --kill-after=5 120 "$@" "$pdtrain" "${sets[@]}" --set run.out_dir="$out" >"$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: run $run exits $rc"; fail=1; }
  n=$(grep -cE "^rewind [0-9]+ of 6: training diverged at step [0-9]+: the (gradient norm|loss) is" "$log")
  [ "$n" -ge 1 ] || { echo "FAIL: run $run logged no rewind"; fail=1; }
  [ "$(grep -c '^rewind: from ' "$log")" -eq "$n" ] || { echo "FAIL: a rewind does not say where from"; fail=1; }
  final=$(grep "^final step=30 " "$log" | tail -n 1)
  echo "$final" | grep -qE "loss=[0-9.e+-]+ " || { echo "FAIL: run $run: no finite final loss ($final)"; fail=1; }
  echo "$final" | grep -qiE "nan|inf" && { echo "FAIL: run $run: final loss not finite"; fail=1; }
  crcs+=("$(echo "$final" | sed -nE 's/.*params_crc32c=([0-9a-f]+).*/\1/p')")
  rows=$(tail -n +2 "$out/metrics.csv" | cut -d, -f1 | tr '\n' ' ')
  [ "$rows" = "$(seq -s ' ' 1 30) " ] || { echo "FAIL: run $run: metrics rows are $rows"; fail=1; }
  for f in "$out"/checkpoints/ckpt-*.h5; do
    for g in /params /adam_m /adam_v; do
      h5dump -g "$g" "$f" | grep -qiE "(^|[ ,:])-?(nan|inf)([ ,]|$)" && { echo "FAIL: $f holds a value that is not finite in $g"; fail=1; }
    done
  done
  [ $fail -eq 0 ] || { cat "$log"; break; }
done
[ $fail -eq 0 ] && [ "${crcs[0]}" != "${crcs[1]:-}" ] && { echo "FAIL: params_crc32c ${crcs[0]} then ${crcs[1]:-}"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: $n rewind(s), params_crc32c ${crcs[0]} twice"
rm -f "$log"
exit $fail

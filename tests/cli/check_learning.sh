#!/usr/bin/env bash
# Runs a training command, then checks the last validation loss in OUT/metrics.csv.
# Usage: check_learning.sh OUT_DIR MAX_VAL_LOSS -- command...
# With MAX_VAL_LOSS = "floor+D", the bound is the entropy floor the run printed plus D.
set -u
out_dir=$1 bound=$2
shift 3
log=$(mktemp)
"$@" >"$log" 2>&1
rc=$?
cat "$log"
[ $rc -eq 0 ] || { echo "FAIL: training exited with $rc"; exit 1; }
case "$bound" in
  floor+*)
    floor=$(grep -oE 'entropy floor [0-9.]+' "$log" | head -1 | awk '{print $3}')
    [ -n "$floor" ] || { echo "FAIL: the run printed no entropy floor"; exit 1; }
    bound=$(awk -v f="$floor" -v d="${bound#floor+}" 'BEGIN{printf "%.6f", f + d}') ;;
esac
val=$(awk -F, 'NR > 1 && $3 != "" {v = $3} END {print v}' "$out_dir/metrics.csv")
[ -n "$val" ] || { echo "FAIL: no validation loss in $out_dir/metrics.csv"; exit 1; }
if awk -v v="$val" -v b="$bound" 'BEGIN{exit !(v < b)}'; then
  echo "PASS: final validation loss $val < $bound"
else
  echo "FAIL: final validation loss $val is not below $bound"; exit 1
fi

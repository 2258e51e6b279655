#!/usr/bin/env bash
# Runs two points of a sweep deck, then `pdtrain summarize`, and checks the listing, the point
# directories, the summary table and the loss-curve picture.
# Usage: check_sweep.sh PDTRAIN OUT_DIR DECK -- mpirun-prefix...
set -u
pdtrain=$1 out=$2 deck=$3
shift 4
rm -rf "$out"
fail=0
list=$("$pdtrain" --list-sweep "$deck" --set run.out_dir="$out")
[ "$(echo "$list" | wc -l)" -eq 6 ] || { echo "FAIL: expected 6 points:"; echo "$list"; fail=1; }
echo "$list" | grep -q "^4  $out/4-lr=0.01,n_layer=1$" || { echo "FAIL: point 4 listed as:"; echo "$list"; fail=1; }
for i in 1 4; do
  SLURM_ARRAY_TASK_ID=$i "$@" "$pdtrain" "$deck" --set run.out_dir="$out" --set run.steps=20 >/dev/null 2>&1 \
    || { echo "FAIL: point $i exited with $?"; fail=1; }
done
[ -s "$out/1-lr=0.001,n_layer=2/metrics.csv" ] || { echo "FAIL: point 1 wrote no metrics"; fail=1; }
[ -s "$out/4-lr=0.01,n_layer=1/metrics.csv" ] || { echo "FAIL: point 4 wrote no metrics"; fail=1; }
"$pdtrain" summarize "$out" >/dev/null || { echo "FAIL: summarize exited with $?"; fail=1; }
rows=$(tail -n +2 "$out/summary.csv" | wc -l)
[ "$rows" -eq 2 ] || { echo "FAIL: summary.csv has $rows rows"; fail=1; }
tail -n +2 "$out/summary.csv" | awk -F, '$4 == "" || $7 <= 0 {bad = 1} END {exit bad}' \
  || { echo "FAIL: a summary row lacks its validation loss or wall time"; cat "$out/summary.csv"; fail=1; }
grep -q "<polyline" "$out/loss_curves.svg" || { echo "FAIL: no curve in loss_curves.svg"; fail=1; }
grep -q "| 4-lr=0.01,n_layer=1 |" "$out/summary.md" || { echo "FAIL: summary.md lacks point 4"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: sweep points, summary and curves"
exit $fail

#!/usr/bin/env bash
# bf16 training quality: the same deck trained in fp32 and in bf16 (mixed precision) ends with
# validation losses within 1 % of each other.
# Usage: check_bf16_quality.sh OUT_DIR -- command... (the command gets --set run.out_dir and
# --set train.precision appended)
set -u
out=$1
shift 2
val() {  # the last validation loss in a metrics.csv
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "val_loss") c = i; next }
           $c != "" { v = $c } END { print v }' "$1/metrics.csv"
}
for p in fp32 bf16; do
  "$@" --set run.out_dir="$out/$p" --set train.precision=$p > "$out-$p.log" 2>&1 \
    || { echo "FAIL: the $p run exited with $?"; tail -5 "$out-$p.log"; exit 1; }
done
a=$(val "$out/fp32") b=$(val "$out/bf16")
echo "val loss: fp32 $a, bf16 $b"
awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d
  printf "relative difference %.4f (limit 0.01)\n", d; exit !(a > 0 && d <= 0.01) }' \
  || { echo "FAIL: bf16 validation loss is not within 1 % of fp32"; exit 1; }
echo "PASS: bf16 within 1 % of fp32"

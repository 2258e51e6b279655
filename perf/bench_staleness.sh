#!/usr/bin/env bash
# Convergence under bounded staleness (issue 17): every point of perf/decks/staleness_sweep.toml
# (staleness 0-3, plain delayed AdamW, the previous defaults and the defaults: synchronous
# warm-up, the delay rising one step at a time, trend-corrected versions), each one holder +
# one compute rank, then `pdtrain summarize` (summary.md and
# loss_curves.svg) and each point's final validation loss as a ratio of staleness 0's.
# Targets: staleness 1 within 1 % of staleness 0, staleness 2 within 3 %.
#   perf/bench_staleness.sh [--short] [BUILD_DIR] [OUT_DIR]     (from the repository root)
# --short: 60 steps, a check that the script works, not a measurement (the points with a
# 200-step warm-up stay synchronous).
set -euo pipefail
cd "$(dirname "$0")/.."
short=()
if [[ ${1:-} == --short ]]; then
  short=(--set run.steps=60 --set train.eval_every=20)
  shift
fi
build=${1:-build}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
deck=perf/decks/staleness_sweep.toml
points=$("$build/pdtrain" --list-sweep "$deck" | wc -l)
echo "bench_staleness: $points points of $deck, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for ((i = 0; i < points; i++)); do
  scripts/mpirun-local -np 2 "$build/pdtrain" "$deck" --sweep-index "$i" \
    --set run.out_dir="$out" "${short[@]}" > "$out/$i.log" 2>&1 ||
    { echo "point $i failed:"; tail -5 "$out/$i.log"; exit 1; }
done
"$build/pdtrain" summarize "$out" > "$out/summarize.log"
# The last validation loss of each point, and its ratio to point 0's (staleness 0).
final_val() { awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "val_loss") c = i }
                       NR > 1 && $c != "" { v = $c } END { print v }' "$1/metrics.csv"; }
base=$(final_val "$out/$("$build/pdtrain" --list-sweep "$deck" | awk 'NR == 1 { sub(".*/", "", $2); print $2 }')")
"$build/pdtrain" --list-sweep "$deck" | while read -r i dir; do
  v=$(final_val "$out/${dir##*/}")
  printf '%-60s val %.4f  ratio %.4f\n' "${dir##*/}" "$v" "$(awk -v a="$v" -v b="$base" 'BEGIN { print a / b }')"
done
echo "curves: $out/loss_curves.svg, table: $out/summary.md"

#!/usr/bin/env bash
# pdtrain summarize on a metrics.csv with a cell that is not a number names the file, line and
# column (status 4) rather than "unexpected error: stoll".
# Usage: check_summarize_bad_cell.sh EXPECT_EXIT TMP_DIR -- mpirun-prefix... pdtrain
set -u
expect=$1 dir=$2
shift 3
rm -rf "$dir"
mkdir -p "$dir/0-run"
printf 'step,loss,val_loss,tokens_per_s,step_ms\n1,4.1,,1000,12.5\n2,x4.0,,1000,12.5\n' \
  >"$dir/0-run/metrics.csv"
"$expect" 4 20 "$dir/0-run/metrics.csv:3:3: column 'loss': expected a number, got 'x4.0'" -- \
  "$@" summarize "$dir"

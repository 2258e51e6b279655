#!/usr/bin/env bash
# A data path that is a FIFO is refused (status 4, naming it) instead of blocking every rank
# in open() until a writer comes: nobody ever writes to this one.
# Usage: check_data_fifo.sh EXPECT_EXIT TMP_DIR -- mpirun-prefix... pdtrain
set -u
expect=$1 dir=$2
shift 3
rm -rf "$dir"
mkdir -p "$dir"
mkfifo "$dir/corpus.fifo"
"$expect" 4 20 "$dir/corpus.fifo: is a FIFO \(named pipe\), not a regular file" -- \
  "$@" --set data.source=text --set data.path="$dir/corpus.fifo" --set model.vocab_size=128 \
  --set run.out_dir="$dir/run"

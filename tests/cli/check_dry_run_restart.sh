#!/usr/bin/env bash
# --dry-run --restart PATH reads the checkpoint with the restart reader: a sound one passes
# (status 0), one with a damaged block fails naming the file and the block (status 4), as the
# real restart would, before any training.
# Usage: check_dry_run_restart.sh EXPECT_EXIT OUT_DIR -- mpirun-prefix... pdtrain
set -u
expect=$1 out=$2
shift 3
rm -rf "$out"
mkdir -p "$(dirname "$out")"  # $out.log lies beside $out: its folder may not exist yet
"$@" --set run.steps=2 --set checkpoint.codec=raw --set run.out_dir="$out/run" >"$out.log" 2>&1 \
  || { echo "FAIL: the run that writes the checkpoint failed"; cat "$out.log"; exit 1; }
ckpt="$out/run/checkpoints/ckpt-00000002.h5"
fail=0
"$expect" 0 30 "restart: from $ckpt \(step 2\)" -- \
  "$@" --dry-run --restart "$ckpt" --set run.steps=4 --set run.out_dir="$out/run" || fail=1
# Flip bytes inside the raw parameter data (the file's last quarter is datasets, not metadata).
bad="$out/damaged.h5"
cp "$ckpt" "$bad"
size=$(stat -c %s "$bad")
printf '\377\377\377\377\377\377\377\377' | dd of="$bad" bs=1 seek=$((size * 3 / 4)) conv=notrunc status=none
"$expect" 4 30 "checkpoint $bad: CRC32C mismatch in .* block [0-9]+" -- \
  "$@" --dry-run --restart "$bad" --set run.steps=4 --set run.out_dir="$out/run" || fail=1
exit $fail

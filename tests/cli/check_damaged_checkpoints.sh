#!/usr/bin/env bash
# Nothing lost silently: two checkpoints (an xor anchor at step 5 and its delta at 10), then the
# anchor damaged (cut to half, as a crashed file system leaves it), so neither verifies.
#   restart: --restart auto is a data error (status 4) within seconds naming both files, which
#            are left byte for byte; --restart fresh then trains from step 0, and its retention
#            (keep = 1) deletes neither damaged file.
#   inspect: `pdtrain inspect` exits 4 on either file (and 0 on a good one).
# Usage: check_damaged_checkpoints.sh restart|inspect PDTRAIN OUT_DIR -- mpirun-prefix...
set -u
mode=$1 pdtrain=$2 out=$3
shift 4
rm -rf "$out"
ck="$out/checkpoints"
sets=(--set run.steps=30 --set checkpoint.every=5 --set checkpoint.keep=1 --set checkpoint.codec=xor
      --set run.out_dir="$out")
log=$(mktemp)
fail=0
if ! "$@" "$pdtrain" "${sets[@]}" --stop-after 10 >"$log" 2>&1; then
  echo "FAIL: the first 10 steps did not run"; cat "$log"; exit 1
fi
a="$ck/ckpt-00000005.h5" d="$ck/ckpt-00000010.h5"
if [ "$mode" = inspect ]; then
  "$pdtrain" inspect "$d" >"$log" 2>&1 || { echo "FAIL: inspect of a good checkpoint exits $?"; fail=1; }
fi
truncate -s $(( $(stat -c %s "$a") / 2 )) "$a"
sums=$(md5sum "$a" "$d")
if [ "$mode" = restart ]; then
  start=$(date +%s)
  timeout --kill-after=5 120 "$@" "$pdtrain" "${sets[@]}" --restart auto >"$log" 2>&1
  rc=$?
  [ $rc -eq 4 ] || { echo "FAIL: --restart auto with only damaged checkpoints exits $rc, expected 4"; fail=1; }
  [ $(( $(date +%s) - start )) -le 60 ] || { echo "FAIL: took more than 60 s"; fail=1; }
  grep -q "^pdtrain: error: --restart auto: none of the 2 checkpoint(s) in $ck verifies" "$log" \
    || { echo "FAIL: no error saying that none verifies"; fail=1; }
  for f in "$a" "$d"; do
    grep -q "^  $f does not verify: " "$log" || { echo "FAIL: the error does not name $f"; fail=1; }
  done
  grep -q -- "--restart fresh" "$log" || { echo "FAIL: the error does not say how to start fresh"; fail=1; }
  grep -q "^step " "$log" && { echo "FAIL: it trained"; fail=1; }
  [ "$(md5sum "$a" "$d")" = "$sums" ] || { echo "FAIL: the damaged files changed"; fail=1; }
  cat "$log" >"$log.auto"
  # Asked for: a fresh start; checkpoints at 3, 6, 9, 12 (keep 1) must leave 5 and 10 alone.
  if ! "$@" "$pdtrain" "${sets[@]}" --restart fresh --set run.steps=12 --set checkpoint.every=3 \
       >"$log" 2>&1; then
    echo "FAIL: --restart fresh did not run"; fail=1
  fi
  grep -q "^final step=12 " "$log" || { echo "FAIL: --restart fresh did not train 12 steps"; fail=1; }
  [ -f "$ck/ckpt-00000012.h5" ] || { echo "FAIL: the fresh run wrote no checkpoint"; fail=1; }
  [ -f "$ck/ckpt-00000006.h5" ] && { echo "FAIL: retention kept an older good checkpoint"; fail=1; }
  [ "$(md5sum "$a" "$d" 2>&1)" = "$sums" ] || { echo "FAIL: retention deleted or changed a damaged file"; fail=1; }
  grep -q "retention keeps a checkpoint that does not verify: $a" "$log" \
    || { echo "FAIL: retention did not say it keeps $a"; fail=1; }
  [ $fail -eq 0 ] || cat "$log.auto"
  rm -f "$log.auto"
else
  for f in "$a" "$d"; do
    "$pdtrain" inspect "$f" >"$log" 2>&1
    rc=$?
    [ $rc -eq 4 ] || { echo "FAIL: inspect of damaged $f exits $rc, expected 4"; fail=1; }
    grep -q "DAMAGED\|does not verify\|error" "$log" || { echo "FAIL: inspect does not report the damage of $f"; fail=1; }
    grep -q "^pdtrain: error: .*$(basename "$f")" "$log" || { echo "FAIL: no error naming $f"; fail=1; }
  done
fi
[ $fail -eq 0 ] && echo "PASS ($mode)" || cat "$log"
rm -f "$log"
exit $fail

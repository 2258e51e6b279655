#!/usr/bin/env bash
# Output write errors on a full disk (a small tmpfs) end the job with status 4 naming the file,
# and lose nothing already written.
#   fresh:      run.out_dir on a 16 KiB disk: status 4 naming metrics.csv; the rows written are
#               whole and equal (step, loss, val_loss, lr, grad_norm) to those of a run on a
#               roomy disk (stopped after 150 of its 300 steps).
#   restart:    a run of 150 steps, its last checkpoint (150) removed, the disk filled but for
#               two pages; --restart auto (from 100) must trim metrics.csv to rows 1..100 and
#               cannot: status 4 naming metrics.csv, every one of the 150 rows still there.
#   checkpoint: checkpoint.dir on a disk with room for two checkpoints: the third ends the job
#               with status 4 naming its .tmp; the first two stay readable, no .tmp is left;
#               with one holder and with two (collective MPI-IO writes; the launcher's last
#               word, its rank count, is replaced by holders + 2).
# Mounting needs root (or CAP_SYS_ADMIN): without it the test says so and exits 77, which
# ctest reports as skipped, never as passed.
# Usage: check_full_disk.sh fresh|restart|checkpoint PDTRAIN WORK_DIR -- mpirun-prefix...
set -u
mode=$1 pdtrain=$2 work=$3
shift 4
mnt=$work/disk
umount "$mnt" 2>/dev/null
rm -rf "$work"
mkdir -p "$mnt"
log=$(mktemp)
fail=0

mount_disk() {  # SIZE
  if ! mount -t tmpfs -o "size=$1" tmpfs "$mnt" 2>"$log"; then
    echo "SKIP: cannot mount a $1 tmpfs at $mnt (needs root or CAP_SYS_ADMIN): $(cat "$log")"
    exit 77
  fi
  trap 'umount "$mnt"' EXIT
}

train() {  # OUT_DIR CHECKPOINT_DIR args...: a run of the default deck, its output in $log
  local out=$1 ckpt=$2
  shift 2
  timeout --kill-after=5 60 "${launch[@]}" "$pdtrain" --set run.out_dir="$out" \
    --set checkpoint.dir="$ckpt" "$@" >"$log" 2>&1
}

expect() {  # STATUS PATTERN: of the last run
  [ "$rc" -eq "$1" ] || { echo "FAIL: exit status $rc, expected $1"; fail=1; }
  grep -qE -- "$2" "$log" || { echo "FAIL: output lacks /$2/"; fail=1; }
}

# The columns every run computes alike (not the timings).
numbers() { cut -d, -f1-5 "$1"; }

finish() {
  [ $fail -eq 0 ] && echo "PASS: $1" || { echo "--- output of the last run:"; cat "$log"; }
  rm -f "$log"
  exit $fail
}

launch=("$@")
case "$mode" in
fresh)
  mount_disk 16k
  train "$work/roomy" "$work/roomy-ckpt" --set run.steps=300 --stop-after 150
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: the run on a roomy disk exited $rc"; fail=1; finish ""; }
  train "$mnt/run" "$work/ckpt" --set run.steps=300
  rc=$?
  expect 4 "cannot write $mnt/run/metrics.csv: No space left on device"
  rows=$(( $(wc -l <"$mnt/run/metrics.csv") - 1 ))
  [ "$rows" -gt 0 ] && [ "$rows" -lt 300 ] || { echo "FAIL: $rows rows, expected some but not all"; fail=1; }
  [ -z "$(tail -c 1 "$mnt/run/metrics.csv")" ] || { echo "FAIL: metrics.csv ends mid-line"; fail=1; }
  numbers "$mnt/run/metrics.csv" | cmp -s - <(numbers "$work/roomy/metrics.csv" | head -n $((rows + 1))) \
    || { echo "FAIL: the rows written differ from the roomy run's"; fail=1; }
  finish "full disk: status 4 naming metrics.csv, its $rows rows whole and right"
  ;;
restart)
  mount_disk 64k
  train "$mnt/run" "$work/ckpt" --set run.steps=150 --set checkpoint.every=50
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: the first run exited $rc"; fail=1; finish ""; }
  rm "$work/ckpt/ckpt-00000150.h5"
  cp "$mnt/run/metrics.csv" "$work/before.csv"
  free=$(stat -f -c %a "$mnt")
  dd if=/dev/zero of="$mnt/filler" bs=4096 count=$((free - 2)) 2>/dev/null
  train "$mnt/run" "$work/ckpt" --set run.steps=150 --set checkpoint.every=50 --restart auto
  rc=$?
  expect 4 "cannot write $mnt/run/metrics.csv.tmp: No space left on device"
  grep -q "restart: from $work/ckpt/ckpt-00000100.h5" "$log" || { echo "FAIL: not restarted from step 100"; fail=1; }
  cmp -s "$work/before.csv" "$mnt/run/metrics.csv" || { echo "FAIL: metrics.csv changed: $(( $(wc -l <"$mnt/run/metrics.csv") - 1 )) rows of 150 left"; fail=1; }
  [ ! -e "$mnt/run/metrics.csv.tmp" ] || { echo "FAIL: metrics.csv.tmp left behind"; fail=1; }
  finish "restart on a full disk: status 4 naming metrics.csv, all 150 rows kept"
  ;;
checkpoint)  # one holder (HDF5's POSIX driver), then two (MPI-IO, collective writes)
  mount_disk 3m
  for holders in 1 2; do
    rm -rf "$mnt/ckpt"
    launch=("${@:1:$#-1}" $((holders + 2)))  # the launcher's last word is its rank count
    train "$work/run-$holders" "$mnt/ckpt" --set parallel.holders=$holders --set run.steps=100 \
      --set checkpoint.every=20 --set checkpoint.keep=10
    rc=$?
    echo "$holders holder(s): exit status $rc"
    expect 4 "checkpoint $mnt/ckpt/ckpt-00000060.h5.tmp"
    for s in 20 40; do
      "$pdtrain" inspect "$mnt/ckpt/ckpt-000000$s.h5" >/dev/null 2>&1 || { echo "FAIL: ckpt-000000$s.h5 unreadable"; fail=1; }
    done
    left=$(ls "$mnt/ckpt" | grep '\.tmp$')
    [ -z "$left" ] || { echo "FAIL: left behind: $left"; fail=1; }
    grep -qx "ckpt-00000040.h5" "$mnt/ckpt/latest" || { echo "FAIL: latest is not ckpt-00000040.h5"; fail=1; }
    [ $fail -eq 0 ] || finish ""
  done
  finish "checkpoint on a full disk (1 and 2 holders): status 4 naming its .tmp, removed; the earlier two intact"
  ;;
*)
  echo "usage: check_full_disk.sh fresh|restart|checkpoint PDTRAIN WORK_DIR -- mpirun..."
  exit 2
  ;;
esac

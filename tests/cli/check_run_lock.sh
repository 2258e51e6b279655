#!/usr/bin/env bash
# One run per output directory (io/run_lock).
#   two:   while run A trains in OUT, run B into the same OUT refuses at once with status 4,
#          naming A's host and PID (one of A's ranks) and writing nothing; A finishes with
#          status 0 and a whole metrics.csv (rows 1..N, each complete) and its own resolved deck.
#   ckpt:  the same with runs in OUT/a and OUT/b that share checkpoint.dir OUT/ckpt: B refuses
#          naming checkpoint.dir and writes nothing in OUT/b (its retention would delete A's
#          checkpoint being written); A finishes intact.
#   stale: a run killed with SIGKILL leaves its lock; the next run into OUT takes it over with a
#          warning naming the dead PID, trains, and leaves the lock free.
# Usage: check_run_lock.sh two|ckpt|stale PDTRAIN OUT_DIR -- mpirun-prefix...
set -u
mode=$1 pdtrain=$2 out=$3
shift 4
rm -rf "$out"
mkdir -p "$(dirname "$out")"
log_a=$(mktemp) log_b=$(mktemp)
fail=0
host=$(hostname)
steps=400

a_dir=$out a_sets=()  # run A's output directory and its other settings

start_a() {  # run A (STEPS, launcher...) in the background; sets $a (mpirun), $ranks (its pdtrain processes)
  local n=$1
  shift
  "$@" "$pdtrain" --set run.steps="$n" --set run.log_every=1 --set run.out_dir="$a_dir" \
    "${a_sets[@]}" >"$log_a" 2>&1 &
  a=$!
  for _ in $(seq 1 150); do grep -q "^step" "$log_a" && break; sleep 0.2; done
  grep -q "^step" "$log_a" || { echo "FAIL: run A printed no step line"; cat "$log_a"; kill -9 "$a"; exit 1; }
  ranks=$(pgrep -P "$a" | tr '\n' ' ')
}

finish() {
  [ $fail -eq 0 ] && echo "PASS: $1" || { echo "--- run A:"; cat "$log_a"; echo "--- run B:"; cat "$log_b"; }
  rm -f "$log_a" "$log_b"
  exit $fail
}

# The pid named by `pattern` in run B's output is one of A's ranks.
check_pid_is_a_rank() {
  local pid
  pid=$(grep -oE "$1" "$log_b" | head -n 1 | grep -oE '[0-9]+$')
  case " $ranks " in
    *" ${pid:-none} "*) ;;
    *) echo "FAIL: the pid named ('$pid') is not one of run A's ranks ($ranks)"; fail=1 ;;
  esac
}

launch=("$@")
# Run B (its settings...) while A trains: it must refuse, naming `key_dir` and A's host and PID;
# A must finish with every metrics row in order and its own resolved deck.
second_run_refuses() {
  start_a "$steps" "${launch[@]}"
  begin=$(date +%s)
  timeout --kill-after=5 60 "${launch[@]}" "$pdtrain" --set run.steps=7 "$@" >"$log_b" 2>&1
  rc_b=$? elapsed=$(( $(date +%s) - begin ))
  [ $rc_b -eq 4 ] || { echo "FAIL: run B exited $rc_b, expected 4"; fail=1; }
  [ "$elapsed" -le 30 ] || { echo "FAIL: run B took ${elapsed}s to refuse"; fail=1; }
  pattern="$key_dir is in use by another run: host $host, pid [0-9]+"
  grep -qE -- "$pattern" "$log_b" || { echo "FAIL: run B's output lacks /$pattern/"; fail=1; }
  check_pid_is_a_rank "pid [0-9]+"
  wait "$a"
  rc_a=$?
  [ $rc_a -eq 0 ] || { echo "FAIL: run A exited $rc_a"; fail=1; }
  grep -q "^final step=$steps " "$log_a" || { echo "FAIL: run A has no final line"; fail=1; }
  # Every row whole, in order, one per step: nothing interleaved from run B.
  awk -F, -v n="$steps" 'NR == 1 { ok = ($1 == "step") } NR > 1 && (NF != 12 || $1 != NR - 1) { ok = 0 }
       END { exit !(ok && NR == n + 1) }' "$a_dir/metrics.csv" \
    || { echo "FAIL: $a_dir/metrics.csv is not rows 1..$steps of run A"; fail=1; }
  grep -qE "^steps = $steps( |$)" "$a_dir/deck.resolved.toml" \
    || { echo "FAIL: deck.resolved.toml is not run A's"; fail=1; }
}

if [ "$mode" = two ]; then
  key_dir="run.out_dir $out"
  second_run_refuses --set run.out_dir="$out"
  finish "the second run refused with status 4 naming host and pid; the first finished intact"
elif [ "$mode" = ckpt ]; then
  a_dir=$out/a a_sets=(--set checkpoint.dir="$out/ckpt") key_dir="checkpoint.dir $out/ckpt"
  second_run_refuses --set run.out_dir="$out/b" --set checkpoint.dir="$out/ckpt"
  for f in deck.resolved.toml metrics.csv; do
    [ ! -e "$out/b/$f" ] || { echo "FAIL: the refused run wrote $out/b/$f"; fail=1; }
  done
  [ -s "$out/ckpt/ckpt-00000$steps.h5" ] || { echo "FAIL: run A's last checkpoint is missing"; fail=1; }
  finish "a run sharing checkpoint.dir refused with status 4 naming host and pid; the first finished intact"
elif [ "$mode" = stale ]; then
  start_a 100000 "${launch[@]}"
  kill -9 $ranks
  wait "$a" 2>/dev/null
  grep -q "pid=" "$out/pdtrain.lock" 2>/dev/null || { echo "FAIL: the killed run left no lock naming it"; fail=1; }
  timeout --kill-after=5 60 "${launch[@]}" "$pdtrain" --set run.steps=5 --set run.out_dir="$out" >"$log_b" 2>&1
  rc_b=$?
  [ $rc_b -eq 0 ] || { echo "FAIL: the run after the killed one exited $rc_b"; fail=1; }
  pattern="warning: run.out_dir $out: taking over the lock of a run that is gone \(host $host, pid [0-9]+"
  grep -qE -- "$pattern" "$log_b" || { echo "FAIL: no warning /$pattern/"; fail=1; }
  grep -q "that process no longer runs" "$log_b" || { echo "FAIL: the warning does not say why the holder is dead"; fail=1; }
  check_pid_is_a_rank "pid [0-9]+"
  grep -q "^final step=5 " "$log_b" || { echo "FAIL: the run after the killed one did not finish"; fail=1; }
  [ -e "$out/pdtrain.lock" ] && [ ! -s "$out/pdtrain.lock" ] || { echo "FAIL: the lock was not released (emptied) at exit"; fail=1; }
  finish "a killed run's lock was taken over with a warning naming its pid"
else
  echo "usage: check_run_lock.sh two|ckpt|stale PDTRAIN OUT -- mpirun..."; exit 2
fi

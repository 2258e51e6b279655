#!/usr/bin/env bash
# A signal to the launcher ends the whole job within seconds with status 0, a complete
# checkpoint and no half-written one, and a restart from it continues exactly: its
# params_crc32c after 3 more steps equals an uninterrupted run's to the same step.
# MODE (docs/running.md has the table):
#   usr1        SIGUSR1 (what Slurm's --signal sends), through any launcher; also checks that
#               `pdtrain inspect` and h5dump (through the zstd filter plugin) read the file
#   term, int   SIGTERM (a user's `kill`) / SIGINT (Ctrl-C) to the launch script mid-run
#   term-ckpt   SIGTERM while a checkpoint is being written (a *.h5.tmp exists): that one is
#               completed, then the stop's own
#   usr1-storm  SIGUSR1 to the launcher, then 39 more straight to the ranks 50 ms apart (a
#               scheduler and a launcher may each send one, and users repeat themselves): the
#               later ones change nothing. Delivered while the
#               ranks worked, a stop signal used to corrupt Open MPI's heap now and then (about
#               one run in twenty with one signal); core/signals takes them on a thread of its own
# Usage: check_signal.sh MODE PDTRAIN OUT_DIR PLUGIN_DIR -- launcher-prefix...
set -u
mode=$1 pdtrain=$2 out=$3 plugins=$4
shift 5
launcher=("$@")
rm -rf "$out"
mkdir -p "$out"
log=$out/interrupted.log
ckpts=$out/run/checkpoints
fail=0
sets=(--set run.steps=100000 --set run.log_every=1)
case "$mode" in
  usr1|usr1-storm) sig=USR1 ;;
  term) sig=TERM ;;
  int) sig=INT ;;
  # Large enough (3.2M parameters, ~40 MB per checkpoint) that a write lasts long enough to be
  # caught, written every 2 steps.
  term-ckpt) sig=TERM
    sets+=(--set model.n_layer=4 --set model.d_model=256 --set model.n_head=8
           --set checkpoint.every=2 --set checkpoint.keep=0) ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac

# Job control on: the launcher gets a process group of its own and SIGINT is not ignored in
# it (a script's background jobs otherwise ignore SIGINT, as they would not in a terminal).
set -m
"${launcher[@]}" "$pdtrain" "${sets[@]}" --set run.out_dir="$out/run" >"$log" 2>&1 &
job=$!
set +m
for _ in $(seq 1 300); do grep -q "^step" "$log" && break; sleep 0.2; done
if [ "$mode" = term-ckpt ]; then
  # Wait for the second checkpoint's write (the first has landed: there is one to keep).
  caught=0
  for _ in $(seq 1 3000); do
    if ls "$ckpts"/ckpt-*.h5 >/dev/null 2>&1 && ls "$ckpts"/*.h5.tmp >/dev/null 2>&1; then
      caught=1; break
    fi
    sleep 0.01
  done
  [ $caught -eq 1 ] || { echo "FAIL: never saw a checkpoint being written"; fail=1; }
  writing=$(ls "$ckpts"/*.h5.tmp 2>/dev/null | head -n 1)
else
  sleep 1
fi
kill -"$sig" "$job"
if [ "$mode" = usr1-storm ]; then
  # Straight to the ranks, as Slurm signals every task: the launcher itself dies of a SIGUSR1
  # that reaches it while it tears down (Open MPI's mpirun drops its handler then).
  for _ in $(seq 1 39); do
    sleep 0.05
    pkill -USR1 -f "^$pdtrain .*run.out_dir=$out/run" 2>/dev/null || break
  done
fi
for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$job" 2>/dev/null; then
  echo "FAIL: still running 60 s after SIG$sig"; kill -9 "$job"; cat "$log"; exit 1
fi
wait "$job"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: exit status $rc after SIG$sig"; fail=1; }
step=$(grep -oE "^stopped after step [0-9]+ of 100000: checkpoint written" "$log" | grep -oE "[0-9]+" | head -n 1)
[ -n "$step" ] || { echo "FAIL: no stop line"; fail=1; step=0; }
grep -q "^stop requested by a signal: step $step is the last" "$log" \
  || { echo "FAIL: the stop was not announced before the checkpoint"; fail=1; }
ckpt=$(printf "%s/ckpt-%08d.h5" "$ckpts" "$step")
[ -f "$ckpt" ] || { echo "FAIL: no checkpoint of step $step"; fail=1; }
leftover=$(ls "$ckpts"/*.tmp 2>/dev/null)
[ -z "$leftover" ] || { echo "FAIL: half-written files left: $leftover"; fail=1; }
# Every checkpoint there is complete (the one being written when the signal came included).
for f in "$ckpts"/ckpt-*.h5; do
  "$pdtrain" inspect "$f" >/dev/null 2>&1 || { echo "FAIL: $f is not a readable checkpoint"; fail=1; }
done
if [ "$mode" = term-ckpt ] && [ -n "${writing:-}" ]; then
  [ -f "${writing%.tmp}" ] || { echo "FAIL: the checkpoint being written (${writing%.tmp}) was abandoned"; fail=1; }
fi
if [ "$mode" = usr1 ] && [ -f "$ckpt" ]; then
  "$pdtrain" inspect "$ckpt" | grep -q "codec zstd" || { echo "FAIL: inspect"; fail=1; }
  HDF5_PLUGIN_PATH="$plugins" h5dump -d /params/lnfw "$ckpt" 2>&1 | grep -q "DATA {" \
    || { echo "FAIL: h5dump cannot read the zstd dataset through the plugin"; fail=1; }
fi

# The restart continues exactly where the signal stopped it.
crc() { grep -oE "^final step=$1 .*params_crc32c=[0-9a-f]{8}" "$2" | grep -oE "[0-9a-f]{8}$"; }
if [ $fail -eq 0 ]; then
  to=$((step + 3))
  "${launcher[@]}" "$pdtrain" "${sets[@]}" --set run.out_dir="$out/run" --restart auto \
    --stop-after $to >"$out/restarted.log" 2>&1 || { echo "FAIL: the restart failed"; cat "$out/restarted.log"; fail=1; }
  "${launcher[@]}" "$pdtrain" "${sets[@]}" --set run.out_dir="$out/straight" \
    --stop-after $to >"$out/straight.log" 2>&1 || { echo "FAIL: the uninterrupted run failed"; fail=1; }
  got=$(crc $to "$out/restarted.log") want=$(crc $to "$out/straight.log")
  echo "step $to: restarted ${got:-none}, uninterrupted ${want:-none}"
  [ -n "$got" ] && [ "$got" = "$want" ] || { echo "FAIL: the restart does not continue exactly"; fail=1; }
fi
if [ $fail -eq 0 ]; then
  echo "PASS: SIG$sig ($mode) -> exit 0, complete checkpoint of step $step, exact restart"
else
  cat "$log"
fi
exit $fail

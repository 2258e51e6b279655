#!/usr/bin/env bash
# SIGUSR1 (what Slurm's --signal sends before a time limit) makes the whole job finish its
# step, write a checkpoint and exit 0; `pdtrain inspect` reads the checkpoint and h5dump reads
# it through the zstd filter plugin.
# Usage: check_signal.sh PDTRAIN OUT_DIR PLUGIN_DIR -- mpirun-prefix...
set -u
pdtrain=$1 out=$2 plugins=$3
shift 4
rm -rf "$out"
log=$(mktemp)
"$@" "$pdtrain" --set run.steps=100000 --set run.log_every=1 --set run.out_dir="$out" >"$log" 2>&1 &
job=$!
for _ in $(seq 1 100); do grep -q "^step" "$log" && break; sleep 0.2; done
sleep 1
kill -USR1 "$job"
for _ in $(seq 1 150); do kill -0 "$job" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$job" 2>/dev/null; then echo "FAIL: still running 30 s after SIGUSR1"; kill -9 "$job"; cat "$log"; exit 1; fi
wait "$job"
rc=$?
fail=0
[ $rc -eq 0 ] || { echo "FAIL: exit status $rc after SIGUSR1"; fail=1; }
grep -q "^stopped after step [0-9]* of 100000: checkpoint written" "$log" || { echo "FAIL: no stop line"; fail=1; }
ckpt=$(ls "$out"/checkpoints/ckpt-*.h5 2>/dev/null | tail -n 1)
[ -n "$ckpt" ] || { echo "FAIL: no checkpoint written"; fail=1; }
if [ -n "$ckpt" ]; then
  "$pdtrain" inspect "$ckpt" | grep -q "codec zstd" || { echo "FAIL: inspect"; fail=1; }
  HDF5_PLUGIN_PATH="$plugins" h5dump -d /params/lnfw "$ckpt" 2>&1 | grep -q "DATA {" \
    || { echo "FAIL: h5dump cannot read the zstd dataset through the plugin"; fail=1; }
fi
[ $fail -eq 0 ] && echo "PASS: SIGUSR1 -> checkpoint ($ckpt), exit 0; inspect and h5dump read it" || cat "$log"
rm -f "$log"
exit $fail

#!/usr/bin/env bash
# pdtrain under a real Slurm (installed from Debian and started on this host):
#  1. a sweep submitted as a job array: every point finishes with a decreasing loss and
#     `pdtrain summarize` covers them all;
#  2. a job whose time limit runs out mid-training: it checkpoints on the warning signal, is
#     requeued, resumes, and ends with the same params_crc32c as an uninterrupted run;
#  3. the daemons it started are stopped (also on failure).
# Usage: test_slurm.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 build=$2
work=$build/slurm-test
pdtrain=$build/pdtrain
rm -rf "$work"
mkdir -p "$work/runs"
bash "$src/scripts/install-deps.sh" --slurm || exit 1
trap 'bash "$src/tests/slurm/slurm_cluster.sh" stop "$work/cluster"' EXIT
bash "$src/tests/slurm/slurm_cluster.sh" start "$work/cluster" || exit 1
export SLURM_CONF=$work/cluster/slurm.conf PDTRAIN=$pdtrain PDTRAIN_HOME=$src
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$work"
fail=0

echo "== 1. sweep as a job array"
sbatch --wait --array=0-1 --time=00:10:00 "$src/jobscripts/sweep.sbatch" "$src/tests/slurm/sweep_small.toml" \
  || { echo "FAIL: the array job failed"; fail=1; }
for point in runs/slurm-sweep/0-lr=0.003 runs/slurm-sweep/1-lr=0.01; do
  m=$point/metrics.csv
  [ -s "$m" ] || { echo "FAIL: $m missing"; fail=1; continue; }
  awk -F, 'NR == 2 {first = $2} {last = $2; n = $1} END {exit !(n == 60 && last < first - 0.05)}' "$m" \
    || { echo "FAIL: $point did not finish 60 steps with a decreasing loss"; fail=1; }
done
"$pdtrain" summarize runs/slurm-sweep > summary.txt || fail=1
[ "$(tail -n +2 runs/slurm-sweep/summary.csv | wc -l)" -eq 2 ] || { echo "FAIL: summary rows"; cat summary.txt; fail=1; }

echo "== 2. time limit: checkpoint on the signal, requeue, resume"
job=$(sbatch --parsable --time=00:02:00 --signal=B:USR1@90 "$src/jobscripts/single_node.sbatch" \
        "$src/tests/slurm/long.toml")
echo "job $job"
state=""
# Up to 18 minutes: each segment runs ~30 s before the signal, and Slurm takes a while to
# start a requeued job; on a loaded 2-core machine that can add up to 4-5 segments.
deadline=$((SECONDS + 1080))
while ((SECONDS < deadline)); do
  state=$(scontrol show job "$job" 2>/dev/null | grep -oE "JobState=[A-Z_]+" | cut -d= -f2)
  restarts=$(scontrol show job "$job" 2>/dev/null | grep -oE "Restarts=[0-9]+" | cut -d= -f2)
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  sleep 1
done
out=$(ls runs/slurm-pdtrain-"$job".out 2>/dev/null)
echo "state $state, restarts ${restarts:-?}"
[ "$state" = COMPLETED ] || { echo "FAIL: job ended $state"; fail=1; }
[ "${restarts:-0}" -ge 1 ] || { echo "FAIL: the job was never requeued"; fail=1; }
grep -q "stopped after step" "$out" || { echo "FAIL: no checkpoint on the signal"; fail=1; }
grep -q "restart: from .*ckpt-" "$out" || { echo "FAIL: the requeued job did not resume"; fail=1; }
got=$(grep -oE "final step=4000 .*params_crc32c=[0-9a-f]{8}" "$out" | tail -n 1 | grep -oE "[0-9a-f]{8}$")
mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 3 "$pdtrain" "$src/tests/slurm/long.toml" \
  --set run.out_dir=runs/uninterrupted > uninterrupted.out 2>&1
want=$(grep -oE "params_crc32c=[0-9a-f]{8}" uninterrupted.out | tail -n 1 | cut -d= -f2)
echo "interrupted+requeued: ${got:-none}  uninterrupted: ${want:-none}"
[ -n "$got" ] && [ "$got" = "$want" ] || { echo "FAIL: final params_crc32c differs"; fail=1; }
if [ $fail -ne 0 ]; then echo "--- job output"; cat "$out" 2>/dev/null | tail -40; fi
[ $fail -eq 0 ] && echo "PASS: sweep array and preemption-safe requeue under Slurm"
exit $fail

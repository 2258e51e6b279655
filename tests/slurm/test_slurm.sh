#!/usr/bin/env bash
# pdtrain under a real Slurm (installed from Debian and started on this host):
#  1. a sweep submitted as a job array: every point finishes with a decreasing loss and
#     `pdtrain summarize` covers them all;
#  2. a job whose time limit runs out mid-training: it checkpoints on the warning signal, is
#     requeued, resumes, and ends with the same params_crc32c as an uninterrupted run;
#  3. meanwhile a job one of whose ranks is killed (SIGKILL, as a crash or a lost node leaves
#     it) comes back by itself within Slurm's waits plus 60 s (the time is printed) and ends
#     the same way;
#     both jobs' losses at every step are the uninterrupted run's;
#  4. the daemons it started are stopped (also on failure).
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
echo "== 3. at the same time, a job one of whose ranks is killed comes back by itself"
job=$(sbatch --parsable --time=00:02:00 --signal=B:USR1@90 "$src/jobscripts/single_node.sbatch" \
        "$src/tests/slurm/long.toml")
# No time limit in the way: only the lost rank ends a run early.
heal=$(sbatch --parsable --time=00:20:00 "$src/jobscripts/single_node.sbatch" \
         "$src/tests/slurm/long.toml" --set run.out_dir=runs/slurm-heal)
echo "jobs: time limit $job, lost rank $heal"
out=runs/slurm-pdtrain-$job.out heal_out=runs/slurm-pdtrain-$heal.out
field() { scontrol show job "$1" 2>/dev/null | grep -oE "$2=[A-Z_0-9]+" | cut -d= -f2; }
ended() { case "$1" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0 ;; esac; return 1; }
resumes() { grep -c "^restart: from .*ckpt-" "$1" 2>/dev/null; }
state="" heal_state="" restarts="" heal_restarts="" killed_at="" recovered=""
# Up to 18 minutes: each segment runs ~30 s before the signal, and Slurm takes a while to
# start a requeued job; on a loaded 2-core machine that can add up to 4-5 segments.
deadline=$((SECONDS + 1080))
while ((SECONDS < deadline)); do
  # A job's last state is kept: Slurm forgets a finished job after MinJobAge.
  ended "$state" || { state=$(field "$job" JobState); restarts=$(field "$job" Restarts); }
  ended "$heal_state" || { heal_state=$(field "$heal" JobState); heal_restarts=$(field "$heal" Restarts); }
  ended "$state" && ended "$heal_state" && break
  # Once the second job has a checkpoint (step 1000, of 4000), SIGKILL one of its ranks, as a
  # crash or a lost node would end it.
  if [ -z "$killed_at" ] && [ -f runs/slurm-heal/checkpoints/ckpt-00001000.h5 ]; then
    rank=$(pgrep -n -f "^$pdtrain .*slurm-heal")
    if [ -n "$rank" ] && kill -9 "$rank"; then
      killed_at=$SECONDS resumes_before=$(resumes "$heal_out")
      echo "$(date -u +%T) killed rank process $rank of job $heal"
    fi
  fi
  if [ -n "$killed_at" ] && [ -z "$recovered" ] && [ "$(resumes "$heal_out")" -gt "$resumes_before" ]; then
    recovered=$((SECONDS - killed_at))
    echo "$(date -u +%T) job $heal trains again, ${recovered} s after one of its ranks was killed"
  fi
  sleep 1
done
echo "job $job: $state, restarts ${restarts:-?}; job $heal: $heal_state, restarts ${heal_restarts:-?}"
[ "$state" = COMPLETED ] || { echo "FAIL: job $job ended $state"; fail=1; }
[ "${restarts:-0}" -ge 1 ] || { echo "FAIL: the job was never requeued"; fail=1; }
grep -q "stopped after step" "$out" || { echo "FAIL: no checkpoint on the signal"; fail=1; }
grep -q "restart: from .*ckpt-" "$out" || { echo "FAIL: the requeued job did not resume"; fail=1; }
[ "$heal_state" = COMPLETED ] || { echo "FAIL: job $heal ended $heal_state"; fail=1; }
[ -n "$killed_at" ] || { echo "FAIL: no rank of job $heal was killed"; fail=1; }
grep -q "pdtrain failed (status [0-9]*): a lost rank or node; requeueing job $heal" "$heal_out" \
  || { echo "FAIL: job $heal did not requeue itself after the lost rank"; fail=1; }
# The bound: Slurm's own waits as the test cluster sets them (KillWait for the surviving
# ranks, which take SIGTERM as a request to checkpoint but wait on the dead one; cred_expire
# before a requeued job may start), plus 60 s for pdtrain's part (seeing the lost rank,
# exiting, the job script's requeue, start-up and the checkpoint read) on a loaded 2-core host.
slurm_wait=$(( $(grep -oE '^KillWait=[0-9]+' "$SLURM_CONF" | cut -d= -f2) + \
               $(grep -oE 'cred_expire=[0-9]+' "$SLURM_CONF" | cut -d= -f2) ))
bound=$((slurm_wait + 60))
echo "recovery bound: ${bound} s (${slurm_wait} s of it Slurm's KillWait and cred_expire)"
[ -n "$recovered" ] && [ "$recovered" -le "$bound" ] \
  || { echo "FAIL: job $heal not training again within $bound s (${recovered:-never})"; fail=1; }
mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 3 "$pdtrain" "$src/tests/slurm/long.toml" \
  --set run.out_dir=runs/uninterrupted > uninterrupted.out 2>&1
want=$(grep -oE "params_crc32c=[0-9a-f]{8}" uninterrupted.out | tail -n 1 | cut -d= -f2)
cut -d, -f1,2 runs/uninterrupted/metrics.csv >losses-straight.csv
# Both jobs end where the uninterrupted run ends, and their losses continue as before:
# metrics.csv (resumed at each restart) holds every step's loss as the uninterrupted run has it.
for j in "$job:runs/slurm-long" "$heal:runs/slurm-heal"; do
  id=${j%%:*} dir=${j#*:}
  got=$(grep -oE "final step=4000 .*params_crc32c=[0-9a-f]{8}" "runs/slurm-pdtrain-$id.out" | tail -n 1 \
        | grep -oE "[0-9a-f]{8}$")
  echo "job $id: ${got:-none}  uninterrupted: ${want:-none}"
  [ -n "$got" ] && [ "$got" = "$want" ] || { echo "FAIL: job $id: final params_crc32c differs"; fail=1; }
  cut -d, -f1,2 "$dir/metrics.csv" >"losses-$id.csv"
  cmp -s "losses-$id.csv" losses-straight.csv && [ "$(wc -l <"losses-$id.csv")" -eq 4001 ] \
    || { echo "FAIL: job $id: losses differ from the uninterrupted run's"; fail=1; }
done
if [ $fail -ne 0 ]; then
  for o in "$out" "$heal_out"; do echo "--- $o"; grep -v "^step" "$o" 2>/dev/null | tail -40; done
fi
[ $fail -eq 0 ] && echo "PASS: sweep array, preemption-safe requeue and a self-healing job under Slurm"
exit $fail

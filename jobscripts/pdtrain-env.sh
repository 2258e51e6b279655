# Sourced by the job scripts: what every pdtrain rank needs in its environment.
# One BLAS thread per rank (ranks share a node's cores), and OpenBLAS's AVX-512 kernels on
# CPUs that OpenBLAS 0.3.21 misdetects (pdtrain prints a hint when it notices).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
# Where pdtrain was built: $PDTRAIN, else $PDTRAIN_HOME/build/pdtrain (PDTRAIN_HOME defaults to
# the submit directory, i.e. sbatch from the repository). Output goes under runs/ of the
# submit directory (mkdir -p runs before the first sbatch: Slurm needs it for --output).
PDTRAIN=${PDTRAIN:-${PDTRAIN_HOME:-$SLURM_SUBMIT_DIR}/build/pdtrain}

# Every way Slurm stops a job (the time-limit warning, scancel, the time limit itself) reaches
# pdtrain as a request to checkpoint and exit: scripts/stoppable.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/stoppable.sh"
# Failures (lost ranks or nodes) requeued per job at most this many times.
PDTRAIN_MAX_FAILURES=${PDTRAIN_MAX_FAILURES:-3}

# Runs "$@" (srun or mpirun, then pdtrain with --restart auto) through run_stoppable, then
# decides whether the job comes back (the next run resumes from the newest checkpoint):
#  - the time-limit warning (SIGUSR1: --signal=B:USR1@..., or scancel -b -s USR1): requeued;
#  - scancel, or SIGTERM/SIGINT to this script: checkpointed and not requeued (a cancel);
#  - a failure (a rank or node lost; any status but 0 and the input errors 2-4): requeued at
#    most PDTRAIN_MAX_FAILURES times, counted in runs/slurm-<job>.failures (SLURM_RESTART_COUNT
#    also counts the time-limit requeues, which are not failures);
#  - an input error (2 deck, 3 layout, 4 data file): a retry cannot help, the job ends.
run_preemptible() {
  run_stoppable "$@"
  local rc=$?
  case "$STOP_SIGNAL" in
    SIGUSR1) if [ $rc -eq 0 ]; then requeue_job "pdtrain checkpointed before the time limit"
             else count_failure $rc && requeue_job "pdtrain failed (status $rc) while stopping"
             fi ;;
    "") [ $rc -eq 0 ] && return 0
        case $rc in 2|3|4) echo "pdtrain: an input error (status $rc): not retried"; return $rc ;; esac
        count_failure $rc && requeue_job "pdtrain failed (status $rc): a lost rank or node" ;;
  esac
  return $rc
}

# Counts one more failure of this job; false once PDTRAIN_MAX_FAILURES are used up.
count_failure() {  # STATUS
  local file=$SLURM_SUBMIT_DIR/runs/slurm-$SLURM_JOB_ID.failures n=0
  [ -f "$file" ] && n=$(cat "$file")
  n=$((n + 1))
  echo $n >"$file"
  if [ $n -gt "$PDTRAIN_MAX_FAILURES" ]; then
    echo "pdtrain failed (status $1) $n times in job $SLURM_JOB_ID: not requeued again" \
         "(PDTRAIN_MAX_FAILURES=$PDTRAIN_MAX_FAILURES)"
    return 1
  fi
  echo "failure $n of at most $PDTRAIN_MAX_FAILURES in job $SLURM_JOB_ID"
}

# Slurm keeps a requeued job's excluded nodes and will not change them while it runs; a node
# that failed is DOWN (or drained) and is not allocated again. With --nodes=MIN-MAX the job
# starts again on fewer nodes, and a deck with parallel.dp = 0 trains on the smaller layout.
requeue_job() {  # WHY
  local bad
  bad=$(sinfo -h -N -n "${SLURM_JOB_NODELIST:-}" -t down,drain,fail -o %N 2>/dev/null \
        | sort -u | paste -sd, -)
  echo "$(date -u +%T) $1; requeueing job $SLURM_JOB_ID${bad:+ (nodes out of service: $bad)}"
  scontrol requeue "$SLURM_JOB_ID"
}

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

# Runs "$@" (the launcher + pdtrain) in the background and forwards the warning signal that
# Slurm sends before the time limit (--signal=B:USR1@...) to it: pdtrain finishes its step,
# checkpoints and exits 0. If it stopped early, the job requeues itself; the next run continues
# with --restart auto.
run_preemptible() {
  "$@" &
  local pid=$! stopped=0
  trap 'stopped=1; kill -USR1 $pid 2>/dev/null' USR1 TERM
  wait $pid; local rc=$?
  # `wait` returns early when a trapped signal arrives: wait for pdtrain itself to finish.
  while kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done
  if [ $stopped -eq 1 ] && [ $rc -eq 0 ]; then
    echo "pdtrain checkpointed before the time limit; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return $rc
}

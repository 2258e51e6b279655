# Sourced by scripts/mpirun-local and jobscripts/pdtrain-env.sh: the one way a launch script
# turns the signals that stop a job into pdtrain's checkpoint-and-exit (docs/running.md has
# the table of ways to stop a job and what each leaves).
#
# run_stoppable CMD...  runs CMD (mpirun or srun, then pdtrain) in the background and turns
# SIGTERM, SIGINT, SIGHUP or SIGUSR1 that reach this shell into one SIGUSR1 to the launcher,
# which passes it to every rank: pdtrain finishes its step, writes a checkpoint and exits 0.
# Why SIGUSR1: Open MPI 4.1's mpirun cannot forward SIGTERM or SIGINT (it refuses them in
# ess_base_forward_signals); on either it sends the ranks SIGTERM and SIGKILLs them about a
# second later (odls_base_sigkill_timeout), before any but a tiny checkpoint is written, and
# exits 1. SIGUSR1 it forwards and then waits for the ranks. The launcher runs in a session of
# its own, so a Ctrl-C in the terminal reaches this shell only, never mpirun itself.
# Returns the launcher's status and sets STOP_SIGNAL to the signal that asked for the stop
# ("" if none came).
run_stoppable() {
  STOP_SIGNAL=""
  setsid "$@" &
  local pid=$! rc sig
  for sig in TERM INT HUP USR1; do trap "stoppable_forward $pid SIG$sig" "$sig"; done
  # `wait` returns early when a trapped signal arrives: wait until the launcher is gone.
  while wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null; do :; done
  trap - TERM INT HUP USR1
  if [ -n "$STOP_SIGNAL" ] && [ "$rc" -ne 0 ]; then
    echo "$(date -u +%T) pdtrain ended with status $rc after $STOP_SIGNAL, before its checkpoint" \
         "was complete (killed first?): the previous checkpoint is intact and --restart auto" \
         "resumes from it" >&2
  fi
  return "$rc"
}

# The first stop signal is passed on; later ones are not (a stop is under way, and a scheduler
# may signal the script and the launcher both).
stoppable_forward() {  # PID SIGNAL
  [ -n "$STOP_SIGNAL" ] && return 0
  STOP_SIGNAL=$2
  echo "$(date -u +%T) $2: asking pdtrain to finish its step, checkpoint and exit (SIGUSR1 to" \
       "the launcher, pid $1)" >&2
  kill -USR1 "$1" 2>/dev/null || true
}

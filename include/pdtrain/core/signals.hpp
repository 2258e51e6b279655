#pragma once
// SIGUSR1 (what Slurm's --signal and the launch scripts send), SIGTERM (a user's `kill`,
// `scancel`, Slurm's time limit, srun passing either on) and SIGINT (Ctrl-C) all ask pdtrain to
// finish the current step, write a checkpoint and exit 0. The table of the ways a job is
// stopped, and what each leaves behind, is in docs/running.md.
namespace pdtrain {

// First thing in main, before MPI_Init starts any thread: blocks the three signals in every
// thread and takes them on a thread of its own (sigwait), so that no code is ever interrupted
// by one. SIGUSR1 (Slurm's warning, which can come while a requeued job's ranks start) sets
// the flag from then on; training then stops after its first step.
void catch_usr1_from_start();
// When training starts: SIGTERM and SIGINT set the flag too (before that they end the process
// by their default action, as they would a command).
void install_stop_signals();
bool stop_signal_received();
void request_stop_for_testing();  // as if a signal had arrived

}  // namespace pdtrain

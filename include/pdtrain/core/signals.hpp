#pragma once
// SIGTERM and SIGUSR1 (what Slurm sends before a time limit, directly or through the batch
// script) ask pdtrain to finish the current step, write a checkpoint and exit 0.
namespace pdtrain {

void install_stop_signals();
bool stop_signal_received();
void request_stop_for_testing();  // as if a signal had arrived

}  // namespace pdtrain

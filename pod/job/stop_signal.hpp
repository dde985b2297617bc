// Clean stops on SIGTERM, SIGINT and SIGUSR1 (what Slurm sends before a time limit): a handler
// that only records the signal, and the collective by which every rank agrees to stop.
#pragma once

#include <mpi.h>

#include <string>

namespace ipupod::pod {

// Installs the handlers (each resets itself: a second signal of the same kind acts as usual).
void install_stop_signals();
// The signal received so far on this rank, 0 if none.
int stop_signal_received();
// Collective over `world` at a step boundary: the signal any rank received (0 if none), so that
// every rank stops at the same boundary.
int agree_to_stop(MPI_Comm world);
// "SIGTERM", "SIGINT", "SIGUSR1" or "signal N".
std::string signal_name(int signal);
// The exit code of a run stopped by `signal`: 128 + the signal, as a shell reports it.
inline int stopped_exit_code(int signal) {
  return 128 + signal;
}

}  // namespace ipupod::pod

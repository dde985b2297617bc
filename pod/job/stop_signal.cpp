// Stop signals: the handler stores the signal number in a lock-free atomic and makes the rank's
// standard output and error non-blocking (fcntl is async-signal-safe); the ranks look at the
// signal at step boundaries.
#include "pod/job/stop_signal.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace ipupod::pod {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void record_stop_signal(int signal) {
  g_signal.store(signal, std::memory_order_relaxed);
  // mpirun stops reading the ranks' output once it has a SIGTERM or SIGINT, and a rank that
  // prints into the full pipe (or pty) would block there, never reach the step boundary, and
  // be killed a second later without its checkpoint. Non-blocking, that write (restarted after
  // this handler) fails with EAGAIN instead and the stream drops what it cannot pass on; the
  // stop notice goes to the run directory too. Left so: the rank is about to end.
  const int saved = errno;
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO})
    if (const int flags = fcntl(fd, F_GETFL); flags != -1 && (flags & O_NONBLOCK) == 0)
      fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  errno = saved;
}

}  // namespace

void install_stop_signals() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a blocking read or wait carries on; SA_RESETHAND: a second signal is not
  // caught, so an impatient user can still end the run at once.
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal, &action, nullptr);
}

int stop_signal_received() {
  return g_signal.load(std::memory_order_relaxed);
}

int agree_to_stop(MPI_Comm world) {
  int local = stop_signal_received(), agreed = 0;
  MPI_Allreduce(&local, &agreed, 1, MPI_INT, MPI_MAX, world);
  return agreed;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal " + std::to_string(signal);
  }
}

}  // namespace ipupod::pod

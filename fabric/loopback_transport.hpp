// The in-process transport for unit tests: n endpoints in one process, one thread each,
// with MPI's matching rules, so collectives can be tested without mpirun.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fabric/transport.hpp"

namespace ipupod::fabric {

// Messages match like MPI: by (source, destination, tag), in posting order (non-overtaking).
// Sends are rendezvous: a send completes only once a receive has taken it, so a protocol
// that relies on MPI buffering deadlocks here too (and is reported after wait_timeout).
class LoopbackFabric {
 public:
  explicit LoopbackFabric(int participants,
                          std::chrono::milliseconds wait_timeout = std::chrono::seconds(60));
  ~LoopbackFabric();
  LoopbackFabric(const LoopbackFabric&) = delete;
  LoopbackFabric& operator=(const LoopbackFabric&) = delete;

  int participants() const;
  // The transport of one participant; use each from one thread only.
  Transport& endpoint(int rank);
  // Wakes every waiting endpoint with a FabricError carrying the reason; later waits fail too.
  void abort(const std::string& reason);

  struct Shared;  // the mailbox, shared by the endpoints

 private:
  std::unique_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
};

// Runs fn(endpoint) on `participants` threads over a fresh LoopbackFabric. If any thread
// throws, the fabric is aborted (so no thread hangs) and the first exception is rethrown.
void run_on_loopback(int participants, const std::function<void(Transport&)>& fn);

}  // namespace ipupod::fabric

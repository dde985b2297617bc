// The transport for real runs: each rank of an MPI communicator is one participant, and
// isend/irecv/wait map onto MPI_Isend/MPI_Irecv/MPI_Wait on bytes.
#pragma once

#include <mpi.h>

#include "fabric/transport.hpp"

namespace ipupod::fabric {

// Does not own the communicator: the caller keeps it alive for the transport's lifetime.
// Errors MPI reports under the communicator's error handler (by default MPI aborts the whole
// job, which is what we want) are turned into FabricError when the handler returns them.
class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  Request isend(int peer, std::span<const std::byte> data, int tag) override;
  Request irecv(int peer, std::span<std::byte> data, int tag) override;
  void wait(Request& request) override;
  bool test(Request& request) override;

 private:
  // Empties a request whose MPI operation returned `code` and `status`, checking both.
  void complete(Request& request, int code, const MPI_Status& status, const char* call);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace ipupod::fabric

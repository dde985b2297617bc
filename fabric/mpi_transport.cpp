// MpiTransport: byte messages over an MPI communicator, every MPI return code checked.
#include "fabric/mpi_transport.hpp"

#include <climits>
#include <string>

namespace ipupod::fabric {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

void check_mpi(int code, const std::string& what) {
  if (code != MPI_SUCCESS) throw FabricError(what + " failed: " + mpi_error_text(code));
}

int checked_count(std::size_t bytes, const std::string& what) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    throw FabricError(what + ": message of " + std::to_string(bytes) +
                      " bytes exceeds MPI's int count limit of " + std::to_string(INT_MAX) +
                      "; split it into smaller messages");
  }
  return static_cast<int>(bytes);
}

struct MpiRequestState final : RequestState {
  MPI_Request handle = MPI_REQUEST_NULL;

  ~MpiRequestState() override {
    if (handle == MPI_REQUEST_NULL) return;
    // Dropped without wait (only on an error path). A receive is cancelled so MPI never
    // writes into a buffer that may be gone; a send cannot be cancelled safely, so it is freed.
    if (is_send) {
      MPI_Request_free(&handle);
    } else {
      MPI_Cancel(&handle);
      MPI_Wait(&handle, MPI_STATUS_IGNORE);
    }
  }
};

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    throw FabricError("MpiTransport: MPI is not initialised; call MPI_Init before making one");
  }
  if (comm == MPI_COMM_NULL) {
    throw FabricError(
        "MpiTransport: the communicator is MPI_COMM_NULL; this rank is not part of it "
        "(check the colour given to MPI_Comm_split)");
  }
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MpiTransport: MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MpiTransport: MPI_Comm_size");
}

Request MpiTransport::isend(int peer, std::span<const std::byte> data, int tag) {
  check_peer_and_tag("isend", peer, tag);
  auto state = std::make_unique<MpiRequestState>();
  state->owner = this;
  state->is_send = true;
  state->peer = peer;
  state->tag = tag;
  state->bytes = data.size();
  Request request(std::move(state));
  const std::string what = "MPI_Isend on " + where() + " (" + request.describe() + ")";
  auto* mpi_state = static_cast<MpiRequestState*>(request.state());
  check_mpi(MPI_Isend(data.data(), checked_count(data.size(), what), MPI_BYTE, peer, tag, comm_,
                      &mpi_state->handle),
            what);
  return request;
}

Request MpiTransport::irecv(int peer, std::span<std::byte> data, int tag) {
  check_peer_and_tag("irecv", peer, tag);
  auto state = std::make_unique<MpiRequestState>();
  state->owner = this;
  state->is_send = false;
  state->peer = peer;
  state->tag = tag;
  state->bytes = data.size();
  Request request(std::move(state));
  const std::string what = "MPI_Irecv on " + where() + " (" + request.describe() + ")";
  auto* mpi_state = static_cast<MpiRequestState*>(request.state());
  check_mpi(MPI_Irecv(data.data(), checked_count(data.size(), what), MPI_BYTE, peer, tag, comm_,
                      &mpi_state->handle),
            what);
  return request;
}

void MpiTransport::wait(Request& request) {
  if (!request.pending()) return;
  auto& state = static_cast<MpiRequestState&>(own_state(request));
  MPI_Status status;
  const int code = MPI_Wait(&state.handle, &status);
  complete(request, code, status, "MPI_Wait");
}

bool MpiTransport::test(Request& request) {
  if (!request.pending()) return true;
  auto& state = static_cast<MpiRequestState&>(own_state(request));
  MPI_Status status;
  int done = 0;
  const int code = MPI_Test(&state.handle, &done, &status);
  if (code == MPI_SUCCESS && !done) return false;
  complete(request, code, status, "MPI_Test");
  return true;
}

void MpiTransport::complete(Request& request, int code, const MPI_Status& status,
                            const char* call) {
  auto& state = static_cast<MpiRequestState&>(own_state(request));
  const std::string description = request.describe();
  const bool is_send = state.is_send;
  const std::size_t expected = state.bytes;
  request.release();  // the MPI handle is complete (MPI_REQUEST_NULL) either way
  if (code != MPI_SUCCESS) {
    throw FabricError(std::string(call) + " on " + where() + " for the " + description +
                      " failed: " + mpi_error_text(code));
  }
  if (!is_send) {
    int count = 0;
    check_mpi(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count on " + where());
    if (count < 0 || static_cast<std::size_t>(count) != expected) {
      throw FabricError("wait on " + where() + " for the " + description + ": got " +
                        std::to_string(count) + " bytes, expected " + std::to_string(expected) +
                        "; sender and receiver disagree on the message size (same tag used "
                        "for two different messages?)");
    }
  }
}

}  // namespace ipupod::fabric

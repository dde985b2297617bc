// Transport helpers shared by every implementation: argument checks, request descriptions
// and wait_all.
#include "fabric/transport.hpp"

#include <exception>

namespace ipupod::fabric {

std::string Request::describe() const {
  if (!state_) return "empty request";
  return std::string(state_->is_send ? "send to" : "receive from") + " peer " +
         std::to_string(state_->peer) + " (tag " + std::to_string(state_->tag) + ", " +
         std::to_string(state_->bytes) + " bytes)";
}

void Transport::wait_all(std::span<Request> requests) {
  std::exception_ptr first;
  for (Request& request : requests) {
    try {
      wait(request);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

std::string Transport::where() const {
  return "rank " + std::to_string(rank()) + " of " + std::to_string(size());
}

void Transport::check_peer_and_tag(const char* operation, int peer, int tag) const {
  if (peer < 0 || peer >= size()) {
    throw FabricError(std::string(operation) + " on " + where() + ": peer " + std::to_string(peer) +
                      " is out of range, expected 0.." + std::to_string(size() - 1) +
                      "; check the rank arithmetic or the communicator the transport wraps");
  }
  if (tag < 0 || tag > max_tag()) {
    throw FabricError(std::string(operation) + " on " + where() + ": tag " + std::to_string(tag) +
                      " is out of range, expected 0.." + std::to_string(max_tag()));
  }
}

RequestState& Transport::own_state(Request& request) const {
  RequestState* state = request.state();
  if (state == nullptr || state->owner != this) {
    throw FabricError("wait on " + where() + ": the " + request.describe() +
                      " was not made by this transport; wait on the transport that made it");
  }
  return *state;
}

}  // namespace ipupod::fabric

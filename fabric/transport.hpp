// The narrow contract every collective is written against (ASTRA-sim style): point-to-point
// non-blocking send and receive of bytes between ranks, waiting for them, and the clock of
// the cost model (predicted seconds on real IPU links, advanced by the collectives).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "fabric/error.hpp"

namespace ipupod::fabric {

class Transport;

// What a transport remembers about one pending operation. Each transport derives its own
// state from this; collectives only see the Request handle.
struct RequestState {
  virtual ~RequestState() = default;
  const Transport* owner = nullptr;
  bool is_send = false;
  int peer = -1;
  int tag = -1;
  std::size_t bytes = 0;
};

// Move-only handle of one non-blocking operation. An empty handle (default-constructed or
// already waited for) is complete: waiting on it does nothing.
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<RequestState> state) : state_(std::move(state)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() = default;

  bool pending() const { return state_ != nullptr; }
  // "send to peer 3 (tag 32001, 4096 bytes)"; for error messages.
  std::string describe() const;

  RequestState* state() { return state_.get(); }
  const RequestState* state() const { return state_.get(); }
  // Transports call this once the operation completed (or failed) to empty the handle.
  std::unique_ptr<RequestState> release() { return std::move(state_); }

 private:
  std::unique_ptr<RequestState> state_;
};

class Transport {
 public:
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The buffer must stay valid and unchanged until the request is waited for.
  virtual Request isend(int peer, std::span<const std::byte> data, int tag) = 0;
  // The message must have exactly data.size() bytes; the buffer is filled by wait().
  virtual Request irecv(int peer, std::span<std::byte> data, int tag) = 0;
  // Throws FabricError on failure (naming peer, tag and bytes). Empties the request.
  virtual void wait(Request& request) = 0;
  // Never blocks: if the operation has finished, completes it as wait() would (throwing on
  // failure, emptying the request) and returns true; else returns false. An empty request is
  // complete.
  virtual bool test(Request& request) = 0;

  // Waits for every request in order; the first failure is thrown after the rest were
  // waited for, so no buffer is left in use by the transport.
  void wait_all(std::span<Request> requests);

  // Largest tag a caller may use; collectives reserve the tags in collectives.hpp.
  static constexpr int max_tag() { return 32767; }

  // The cost model's clock: predicted seconds the traffic through this transport would take
  // on the real topology. Collectives given a topology advance it by their prediction.
  double model_seconds() const { return model_seconds_; }
  void advance_model_clock(double seconds) { model_seconds_ += seconds; }

 protected:
  // Throws FabricError unless 0 <= peer < size() and 0 <= tag <= max_tag().
  void check_peer_and_tag(const char* operation, int peer, int tag) const;
  // Throws FabricError unless the request was made by this transport; returns its state.
  RequestState& own_state(Request& request) const;
  // "rank 2 of 4"
  std::string where() const;

 private:
  double model_seconds_ = 0.0;
};

}  // namespace ipupod::fabric

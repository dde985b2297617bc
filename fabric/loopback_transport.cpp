// LoopbackFabric: a mutex-protected mailbox that matches sends to receives the way MPI does.
#include "fabric/loopback_transport.hpp"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace ipupod::fabric {

namespace {

// (source, destination, tag, sequence number of that triple): one message.
using MessageKey = std::tuple<int, int, int, std::uint64_t>;

// One side of a message. A send keeps a copy of its bytes until a receive takes them.
struct Operation {
  std::vector<std::byte> send_bytes;
  std::span<std::byte> recv_buffer;
  bool done = false;
  std::string error;
};

}  // namespace

struct LoopbackFabric::Shared {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<MessageKey, std::shared_ptr<Operation>> unmatched_sends;
  std::map<MessageKey, std::shared_ptr<Operation>> posted_recvs;
  std::chrono::milliseconds wait_timeout{};
  bool aborted = false;
  std::string abort_reason;
};

namespace {

using Shared = LoopbackFabric::Shared;

struct LoopbackRequestState final : RequestState {
  std::shared_ptr<Operation> operation;
  Shared* shared = nullptr;
  MessageKey key{};

  ~LoopbackRequestState() override {
    // A receive dropped without wait must not be written into later.
    if (is_send || shared == nullptr) return;
    std::lock_guard lock(shared->mutex);
    auto it = shared->posted_recvs.find(key);
    if (it != shared->posted_recvs.end() && it->second == operation) shared->posted_recvs.erase(it);
  }
};

// Called with the mutex held: copies a send into a receive, or records why it cannot.
void complete_match(Operation& send, Operation& recv, const MessageKey& key) {
  if (send.send_bytes.size() != recv.recv_buffer.size()) {
    const std::string text =
        "message from rank " + std::to_string(std::get<0>(key)) + " to rank " +
        std::to_string(std::get<1>(key)) + " (tag " + std::to_string(std::get<2>(key)) + ") has " +
        std::to_string(send.send_bytes.size()) + " bytes but the receive expects " +
        std::to_string(recv.recv_buffer.size()) +
        "; sender and receiver disagree on the message size (same tag used for two messages?)";
    send.error = text;
    recv.error = text;
  } else if (!send.send_bytes.empty()) {
    std::memcpy(recv.recv_buffer.data(), send.send_bytes.data(), send.send_bytes.size());
  }
  send.send_bytes.clear();
  send.done = true;
  recv.done = true;
}

class LoopbackEndpoint final : public Transport {
 public:
  LoopbackEndpoint(Shared& shared, int rank, int size)
      : shared_(shared), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Request isend(int peer, std::span<const std::byte> data, int tag) override {
    check_peer_and_tag("isend", peer, tag);
    auto operation = std::make_shared<Operation>();
    operation->send_bytes.assign(data.begin(), data.end());
    const MessageKey key{rank_, peer, tag, send_sequence_[{peer, tag}]++};
    {
      std::lock_guard lock(shared_.mutex);
      auto posted = shared_.posted_recvs.find(key);
      if (posted != shared_.posted_recvs.end()) {
        complete_match(*operation, *posted->second, key);
        shared_.posted_recvs.erase(posted);
      } else {
        shared_.unmatched_sends.emplace(key, operation);
      }
    }
    shared_.changed.notify_all();
    return make_request(true, peer, tag, data.size(), std::move(operation), key);
  }

  Request irecv(int peer, std::span<std::byte> data, int tag) override {
    check_peer_and_tag("irecv", peer, tag);
    auto operation = std::make_shared<Operation>();
    operation->recv_buffer = data;
    const MessageKey key{peer, rank_, tag, recv_sequence_[{peer, tag}]++};
    {
      std::lock_guard lock(shared_.mutex);
      auto sent = shared_.unmatched_sends.find(key);
      if (sent != shared_.unmatched_sends.end()) {
        complete_match(*sent->second, *operation, key);
        shared_.unmatched_sends.erase(sent);
      } else {
        shared_.posted_recvs.emplace(key, operation);
      }
    }
    shared_.changed.notify_all();
    return make_request(false, peer, tag, data.size(), std::move(operation), key);
  }

  void wait(Request& request) override {
    if (!request.pending()) return;
    auto& state = static_cast<LoopbackRequestState&>(own_state(request));
    const std::string description = request.describe();
    std::shared_ptr<Operation> operation = state.operation;
    std::unique_lock lock(shared_.mutex);
    shared_.changed.wait_for(lock, shared_.wait_timeout,
                             [&] { return operation->done || shared_.aborted; });
    if (operation->done) {
      lock.unlock();
      request.release();
      if (!operation->error.empty()) {
        throw FabricError("wait on loopback " + where() + " for the " + description + ": " +
                          operation->error);
      }
      return;
    }
    if (shared_.aborted) {
      throw FabricError("wait on loopback " + where() + " for the " + description +
                        " abandoned: " + shared_.abort_reason);
    }
    throw FabricError(
        "wait on loopback " + where() + " for the " + description + " timed out after " +
        std::to_string(shared_.wait_timeout.count()) +
        " ms: the peer never posted the matching operation; is a collective called on some "
        "ranks only, or with different tags or sizes?");
  }

  bool test(Request& request) override {
    if (!request.pending()) return true;
    auto& state = static_cast<LoopbackRequestState&>(own_state(request));
    {
      std::lock_guard lock(shared_.mutex);
      if (!state.operation->done && !shared_.aborted) return false;
    }
    wait(request);  // finished or aborted: completes (or throws) at once
    return true;
  }

 private:
  Request make_request(bool is_send, int peer, int tag, std::size_t bytes,
                       std::shared_ptr<Operation> operation, const MessageKey& key) {
    auto state = std::make_unique<LoopbackRequestState>();
    state->owner = this;
    state->is_send = is_send;
    state->peer = peer;
    state->tag = tag;
    state->bytes = bytes;
    state->operation = std::move(operation);
    state->shared = &shared_;
    state->key = key;
    return Request(std::move(state));
  }

  Shared& shared_;
  int rank_;
  int size_;
  // Per (peer, tag): how many messages this endpoint sent / expects, for MPI's ordering.
  std::map<std::pair<int, int>, std::uint64_t> send_sequence_;
  std::map<std::pair<int, int>, std::uint64_t> recv_sequence_;
};

}  // namespace

LoopbackFabric::LoopbackFabric(int participants, std::chrono::milliseconds wait_timeout)
    : shared_(std::make_unique<Shared>()) {
  if (participants < 1) {
    throw FabricError("LoopbackFabric: " + std::to_string(participants) +
                      " participants requested, expected at least 1");
  }
  shared_->wait_timeout = wait_timeout;
  endpoints_.reserve(static_cast<std::size_t>(participants));
  for (int rank = 0; rank < participants; ++rank) {
    endpoints_.push_back(std::make_unique<LoopbackEndpoint>(*shared_, rank, participants));
  }
}

LoopbackFabric::~LoopbackFabric() = default;

int LoopbackFabric::participants() const {
  return static_cast<int>(endpoints_.size());
}

Transport& LoopbackFabric::endpoint(int rank) {
  if (rank < 0 || rank >= participants()) {
    throw FabricError("LoopbackFabric::endpoint: rank " + std::to_string(rank) +
                      " is out of range, expected 0.." + std::to_string(participants() - 1));
  }
  return *endpoints_[static_cast<std::size_t>(rank)];
}

void LoopbackFabric::abort(const std::string& reason) {
  {
    std::lock_guard lock(shared_->mutex);
    if (!shared_->aborted) {
      shared_->aborted = true;
      shared_->abort_reason = reason;
    }
  }
  shared_->changed.notify_all();
}

void run_on_loopback(int participants, const std::function<void(Transport&)>& fn) {
  LoopbackFabric fabric(participants);
  std::mutex first_mutex;
  std::exception_ptr first;
  {
    std::vector<std::jthread> threads;
    threads.reserve(static_cast<std::size_t>(participants));
    for (int rank = 0; rank < participants; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          fn(fabric.endpoint(rank));
        } catch (const std::exception& error) {
          {
            std::lock_guard lock(first_mutex);
            if (!first) first = std::current_exception();
          }
          fabric.abort("participant " + std::to_string(rank) + " failed: " + error.what());
        } catch (...) {
          {
            std::lock_guard lock(first_mutex);
            if (!first) first = std::current_exception();
          }
          fabric.abort("participant " + std::to_string(rank) + " failed");
        }
      });
    }
  }  // jthreads join here
  if (first) std::rethrow_exception(first);
}

}  // namespace ipupod::fabric

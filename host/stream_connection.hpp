// Internal to host/: one framed TCP connection with a reader thread, shared by StreamServer and
// StreamClient. It queues incoming data/hello frames, counts credits, and records why it ended.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/stream_protocol.hpp"

namespace ipupod::host::detail {

// Before the peer has authenticated, frames larger than this are refused (a hello only carries
// the secret), so an unauthenticated peer cannot make us allocate much.
inline constexpr std::uint64_t kMaxHelloPayloadBytes = 4096;
// Payload buffers a connection keeps for reuse: enough for the frames a client's credits let
// through of each stream (inputs and labels) plus the ones being consumed.
inline constexpr std::size_t kSpareBuffers = 32;

class Connection {
 public:
  using Clock = std::chrono::steady_clock;

  // Takes the connected socket and starts the reader thread. `peer` names the other end in
  // error messages (e.g. "client 1 (127.0.0.1:5555)"). A client connects to a host it chose,
  // so it trusts it from the start (`trusted`): its frames are not held to the hello limit,
  // which the reader thread would otherwise apply to the first data frame too.
  // A frame that fails a check ends the connection: the reason goes to `log` (if set), to the
  // peer in a close frame, and to whoever next waits on this connection.
  using Log = std::function<void(const std::string&)>;
  Connection(boost::asio::ip::tcp::socket socket, std::string peer, bool trusted = false,
             Log log = {});
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer);
  // Lifts the payload limit from kMaxHelloPayloadBytes to kMaxPayloadBytes.
  void set_authenticated() { authenticated_ = true; }

  // Writes one frame, the payload straight from `frame` (no copy); StreamError if the
  // connection is gone.
  void write(FrameKind kind, const FrameView& frame);
  // Best effort: tells the peer why we are closing; never throws.
  void write_close(const std::string& reason) noexcept;

  // Next hello/data frame in arrival order. StreamError if the peer closed or the connection
  // failed (with the reason) or nothing arrived within `timeout` (`waiting_for` says for what).
  WireFrame pop(std::chrono::milliseconds timeout, const std::string& waiting_for);
  // Waits until the peer has granted a credit and consumes it (same errors as pop).
  void take_credit(std::chrono::milliseconds timeout);
  std::uint64_t credits() const;
  // Gives back the payload buffer of a frame the caller has finished with; the reader thread
  // fills it with a later frame of the same size instead of allocating (and page-faulting) a
  // fresh one. At most kSpareBuffers are kept.
  void recycle(std::vector<std::byte>&& buffer);

  // Shuts the socket down, joins the reader thread and closes. Idempotent.
  void shutdown() noexcept;

 private:
  void read_loop();
  void read_exact(std::span<std::byte> buffer);
  std::vector<std::byte> payload_buffer(std::size_t bytes);
  void end(const std::string& reason);
  [[noreturn]] void throw_ended(const std::string& doing);

  boost::asio::ip::tcp::socket socket_;
  std::string peer_;
  std::atomic<bool> authenticated_{false};
  Log log_;
  std::mutex write_mutex_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<WireFrame> queue_;
  std::vector<std::vector<std::byte>> spare_;
  std::uint64_t credits_ = 0;
  bool ended_ = false;
  std::string end_reason_;
  bool shut_down_ = false;
  std::thread reader_;
};

}  // namespace ipupod::host::detail

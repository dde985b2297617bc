// An IPU rank's end of the data streams: connects to the host's StreamServer, authenticates with
// the job secret, receives host-to-device frames in order and grants credits as it consumes them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "host/stream_protocol.hpp"

namespace ipupod::host {

struct ClientConfig {
  // An IP address or name, or what StreamServer::announced_address gives for a server bound to
  // every interface: "NODE|A,B,...", tried in turn (127.0.0.1 first when this is node NODE).
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;
  std::string secret;
  std::size_t client_id = 0;
  std::size_t credits = 4;                   // frames the host may send ahead of receive() (>= 1)
  std::chrono::milliseconds timeout{60000};  // for connecting, the hello and each receive
};

class StreamClient {
 public:
  // Connects (retrying while the server is not listening yet, up to timeout), says hello with the
  // secret and id, waits for the server's acknowledgement, then grants `credits` credits.
  // StreamError if the server refuses (wrong secret, duplicate id...) with the server's reason.
  explicit StreamClient(ClientConfig config);
  ~StreamClient();
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  // Next host-to-device frame in send order; grants one credit back once it is taken.
  Frame receive();
  // The same into `frame`, whose previous payload buffer is handed back to the connection for a
  // later frame: a loop that receives into one Frame allocates nothing in the steady state.
  void receive(Frame& frame);
  // Device-to-host.
  void send(const FrameView& frame);
  void send(const Frame& frame) { send(FrameView(frame)); }
  // Says goodbye and closes. Idempotent; the destructor calls it.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ipupod::host

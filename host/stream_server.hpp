// The host rank's end of the data streams: a TCP server that authenticates one client per IPU
// rank with the job secret and sends host-to-device frames under credit-based backpressure.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "host/stream_protocol.hpp"

namespace ipupod::host {

// 128 random bits from std::random_device as 32 lowercase hex digits (the per-job secret).
std::string make_secret();

struct ServerConfig {
  std::string bind_address = "127.0.0.1";
  std::uint16_t port = 0;                    // 0 = ephemeral; read the chosen one with port()
  std::string secret;                        // required; clients must present it in their hello
  std::size_t clients = 1;                   // client ids are 0..clients-1
  std::chrono::milliseconds timeout{60000};  // for accept_clients, send and receive
  // How long one accepted connection may take to say hello before it is dropped. Connections
  // say hello concurrently, so a slow or silent one delays nobody else.
  std::chrono::milliseconds hello_timeout{10000};
  // Where refused connections are reported; nullptr = one line on stderr.
  std::function<void(const std::string&)> log;
};

// Host-to-device frames are flow-controlled: each client grants credits (its queue depth), the
// server spends one per send and blocks at zero, so the host never buffers unboundedly.
// Device-to-host frames (losses, metrics) are small and are queued as they arrive.
class StreamServer {
 public:
  explicit StreamServer(ServerConfig config);  // binds and listens at once
  ~StreamServer();
  StreamServer(const StreamServer&) = delete;
  StreamServer& operator=(const StreamServer&) = delete;

  std::uint16_t port() const;
  // What clients are told to connect to (ClientConfig::address): the bound address, or, bound to
  // every interface (0.0.0.0), "NODE|A,B,..." with this node's name and its IPv4 addresses
  // other than loopback, which clients try in turn (loopback first on this node).
  std::string announced_address() const;
  // Returns once every client id 0..clients-1 has said hello with the right secret, and closes
  // the listening port (later connections are refused by the system). Every connection waits
  // for its hello at the same time, each for at most hello_timeout; a wrong secret, an unknown
  // or duplicate id, a malformed or missing hello closes that connection (reason logged and
  // sent to the client) and the others carry on. At most a fixed number of connections wait
  // for their hello at once (the oldest is dropped for a newer one). StreamError on overall
  // timeout.
  void accept_clients();
  // Blocks while that client has no credit left; StreamError if it is gone or on timeout.
  // `before_write`, if set, runs once the credit is there, just before the frame is read and
  // written (e.g. to check that a file whose pages the frame points into still has them).
  void send(std::size_t client, const FrameView& frame,
            const std::function<void()>& before_write = {});
  void send(std::size_t client, const Frame& frame) { send(client, FrameView(frame)); }
  // Next device-to-host frame from that client; StreamError on corrupt frame, disconnect, timeout.
  Frame receive(std::size_t client);
  // Credits the client has granted and the server has not yet spent (for tests and diagnostics).
  std::uint64_t credits(std::size_t client) const;
  // Says goodbye to every client and closes the sockets. Idempotent; the destructor calls it.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ipupod::host

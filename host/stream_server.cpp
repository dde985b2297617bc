// StreamServer: asynchronous accept and hello handshakes (every connection waits for its hello
// at the same time, each under its own deadline), then per-client connections with a reader
// thread each and credit-gated sends.
#include "host/stream_server.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/host_name.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <iostream>
#include <list>
#include <random>
#include <vector>

#include "host/stream_connection.hpp"

namespace ipupod::host {
namespace {

using Clock = std::chrono::steady_clock;
using boost::asio::ip::tcp;

// Connections that have not said hello yet, at most: a stranger who opens more only pushes out
// its own oldest ones (a real client says hello as soon as it connects), and the memory they
// hold stays bounded (a socket and at most one hello frame each).
constexpr std::size_t kMaxPendingHellos = 64;
// After an accept fails (e.g. out of file descriptors), wait this long before the next.
constexpr std::chrono::milliseconds kAcceptRetryPause{20};

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

// Compares without an early exit so the time taken does not reveal how much of a guess matched.
bool same_secret(const std::string& expected, const std::string& given) {
  unsigned char difference = expected.size() == given.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i) {
    difference |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  }
  return difference == 0;
}

// Thrown by a reader that only has a frame's header, once read_frame has checked it.
struct HeaderChecked {};

// One accepted connection that has not said hello yet.
struct PendingHello {
  PendingHello(tcp::socket s, boost::asio::io_context& io, std::string from)
      : socket(std::move(s)), deadline(io), peer(std::move(from)) {}
  tcp::socket socket;
  boost::asio::steady_timer deadline;
  std::string peer;
  std::vector<std::byte> bytes;  // the header, then the dims, payload and trailer after it
  bool finished = false;
};

}  // namespace

std::string make_secret() {
  std::random_device device;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string secret;
  for (int word = 0; word < 4; ++word) {  // 4 x 32 bits
    std::uint32_t bits = device();
    for (int nibble = 0; nibble < 8; ++nibble, bits >>= 4) secret += kHex[bits & 0xFU];
  }
  return secret;
}

struct StreamServer::Impl {
  ServerConfig config;
  boost::asio::io_context io;
  tcp::acceptor acceptor{io};
  boost::asio::steady_timer accept_pause{io};
  std::uint16_t port = 0;
  std::vector<std::unique_ptr<detail::Connection>> clients;
  std::list<std::shared_ptr<PendingHello>> pending;  // oldest first
  std::size_t refused = 0;
  std::string last_refusal;
  bool closed = false;

  void log(const std::string& message) const {
    if (config.log) {
      config.log(message);
    } else {
      std::cerr << "ipupod host: " << message << std::endl;
    }
  }

  detail::Connection& client(std::size_t id, const char* doing) const {
    if (id >= clients.size()) {
      throw std::out_of_range(std::string("StreamServer::") + doing + ": client " +
                              std::to_string(id) + " out of range (" +
                              std::to_string(clients.size()) + " clients)");
    }
    if (!clients[id]) {
      throw StreamError(std::string("StreamServer::") + doing + ": client " + std::to_string(id) +
                        " is not connected; call accept_clients() first");
    }
    return *clients[id];
  }

  std::size_t missing() const {
    std::size_t count = 0;
    for (const auto& client : clients) count += client ? 0 : 1;
    return count;
  }

  void start_accept() {
    auto socket = std::make_shared<tcp::socket>(io);
    acceptor.async_accept(*socket, [this, socket](const boost::system::error_code& ec) {
      if (ec == boost::asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        last_refusal = "accepting a connection failed: " + ec.message();
        accept_pause.expires_after(kAcceptRetryPause);
        accept_pause.async_wait([this](const boost::system::error_code& waited) {
          if (!waited && acceptor.is_open()) start_accept();
        });
        return;
      }
      start_hello(std::move(*socket));
      start_accept();
    });
  }

  void start_hello(tcp::socket socket) {
    if (pending.size() >= kMaxPendingHellos) {
      refuse(pending.front(), std::to_string(kMaxPendingHellos) +
                                  " connections were waiting to say hello; the oldest goes");
    }
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    const std::string peer =
        ec ? std::string("unknown peer")
           : remote.address().to_string() + ":" + std::to_string(remote.port());
    auto hello = std::make_shared<PendingHello>(std::move(socket), io, peer);
    pending.push_back(hello);
    hello->deadline.expires_after(config.hello_timeout);
    hello->deadline.async_wait([this, hello](const boost::system::error_code& waited) {
      if (!waited && !hello->finished)
        refuse(hello, "no hello within " + std::to_string(config.hello_timeout.count()) + " ms");
    });
    hello->bytes.resize(kFrameHeaderBytes);
    boost::asio::async_read(hello->socket, boost::asio::buffer(hello->bytes),
                            [this, hello](const boost::system::error_code& read, std::size_t) {
                              on_header(hello, read);
                            });
  }

  void on_header(const std::shared_ptr<PendingHello>& hello, const boost::system::error_code& ec) {
    if (hello->finished) return;
    if (ec) return refuse(hello, read_failure(ec));
    // read_frame checks the header (magic, version, kind, bounds) before it asks for more.
    bool served = false;
    const ReadExact header_only = [&](std::span<std::byte> buffer) {
      if (served) throw HeaderChecked{};
      std::memcpy(buffer.data(), hello->bytes.data(), buffer.size());
      served = true;
    };
    try {
      read_frame(header_only, detail::kMaxHelloPayloadBytes);
    } catch (const HeaderChecked&) {
    } catch (const FrameError& error) {
      return refuse(hello, error.what());
    }
    std::uint64_t payload_bytes = 0;
    std::memcpy(&payload_bytes, hello->bytes.data() + 20, sizeof payload_bytes);
    const std::size_t rank = std::to_integer<std::size_t>(hello->bytes[10]);
    const std::size_t rest = 8 * rank + payload_bytes + kFrameTrailerBytes;  // bounded above
    hello->bytes.resize(kFrameHeaderBytes + rest);
    boost::asio::async_read(hello->socket,
                            boost::asio::buffer(hello->bytes.data() + kFrameHeaderBytes, rest),
                            [this, hello](const boost::system::error_code& read, std::size_t) {
                              on_frame(hello, read);
                            });
  }

  void on_frame(const std::shared_ptr<PendingHello>& hello, const boost::system::error_code& ec) {
    if (hello->finished) return;
    if (ec) return refuse(hello, read_failure(ec));
    WireFrame wire;
    try {
      wire = decode_frame(hello->bytes, detail::kMaxHelloPayloadBytes);
    } catch (const FrameError& error) {
      return refuse(hello, error.what());
    }
    std::string refusal;
    const std::size_t id = check_hello(wire, refusal);
    if (!refusal.empty()) return refuse(hello, refusal);
    admit(hello, id);
  }

  static std::string read_failure(const boost::system::error_code& ec) {
    if (ec == boost::asio::error::eof) return "the peer closed the connection before its hello";
    return "reading its hello failed: " + ec.message();
  }

  // Returns the client id the hello claims, or sets the reason to refuse it.
  std::size_t check_hello(const WireFrame& hello, std::string& refusal) const {
    if (hello.kind != FrameKind::hello) {
      refusal = "the first frame was '" + std::string(frame_kind_name(hello.kind)) +
                "', expected 'hello'";
      return 0;
    }
    if (hello.frame.array.dtype != DType::u8 ||
        !same_secret(config.secret, array_text(hello.frame.array))) {
      refusal = "wrong secret (the client must use this job's secret)";
      return 0;
    }
    const std::uint64_t id = hello.frame.step;
    if (id >= config.clients) {
      refusal = "client id " + std::to_string(id) + " is out of range; this job expects ids 0.." +
                std::to_string(config.clients - 1);
      return 0;
    }
    if (clients[id]) {
      refusal = "client id " + std::to_string(id) + " is already connected";
      return 0;
    }
    return static_cast<std::size_t>(id);
  }

  void finish(const std::shared_ptr<PendingHello>& hello) {
    hello->finished = true;
    hello->deadline.cancel();
    pending.remove(hello);
  }

  // Says why (best effort: a small frame into an empty send buffer) and closes the connection.
  // Takes its own reference: the list entry it may be given goes away in finish().
  void refuse(std::shared_ptr<PendingHello> hello, const std::string& reason) {
    finish(hello);
    ++refused;
    last_refusal = reason;
    log("refused stream connection from " + hello->peer + ": " + reason);
    boost::system::error_code ignored;
    hello->socket.non_blocking(true, ignored);
    boost::asio::write(hello->socket,
                       boost::asio::buffer(encode_frame(
                           FrameKind::close, Frame{0, 0, text_array("refused: " + reason)})),
                       ignored);
    hello->socket.shutdown(tcp::socket::shutdown_both, ignored);
    hello->socket.close(ignored);
  }

  void admit(const std::shared_ptr<PendingHello>& hello, std::size_t id) {
    finish(hello);
    boost::system::error_code ignored;
    hello->socket.non_blocking(false, ignored);
    auto connection = std::make_unique<detail::Connection>(
        std::move(hello->socket), "client " + std::to_string(id) + " (" + hello->peer + ")",
        /*trusted=*/true, [this](const std::string& line) { log(line); });
    try {
      connection->write(FrameKind::hello, Frame{0, id, {DType::u8, {0}, {}}});
    } catch (const StreamError& error) {
      ++refused;
      last_refusal = error.what();
      log(std::string("lost stream client ") + std::to_string(id) + ": " + error.what());
      return;  // it may connect again
    }
    clients[id] = std::move(connection);
  }

  // Ends every handshake still waiting and lets their handlers finish.
  void drop_pending(const std::string& reason) {
    while (!pending.empty()) refuse(pending.front(), reason);
    boost::system::error_code ignored;
    acceptor.cancel(ignored);
    accept_pause.cancel();
    io.restart();
    io.run();
  }
};

StreamServer::StreamServer(ServerConfig config) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  const ServerConfig& c = impl_->config;
  if (c.secret.empty()) {
    throw std::invalid_argument(
        "StreamServer: the secret is empty; generate one with make_secret()");
  }
  if (c.clients == 0) throw std::invalid_argument("StreamServer: clients must be at least 1");
  impl_->clients.resize(c.clients);
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(c.bind_address, ec);
  if (ec) {
    throw StreamError("StreamServer: '" + c.bind_address +
                      "' is not an IP address: " + ec.message());
  }
  const boost::asio::ip::tcp::endpoint endpoint(address, c.port);
  auto& acceptor = impl_->acceptor;
  const std::string where = c.bind_address + ":" + std::to_string(c.port);
  if (acceptor.open(endpoint.protocol(), ec) ||
      acceptor.set_option(boost::asio::socket_base::reuse_address(true), ec) ||
      acceptor.bind(endpoint, ec) ||
      acceptor.listen(boost::asio::socket_base::max_listen_connections, ec)) {
    throw StreamError("StreamServer: cannot listen on " + where + ": " + ec.message() +
                      (c.port != 0 ? " (choose another port, or 0 for any free one)" : ""));
  }
  impl_->port = acceptor.local_endpoint().port();
}

StreamServer::~StreamServer() {
  close();
}

std::string StreamServer::announced_address() const {
  const std::string& bound = impl_->config.bind_address;
  if (bound != "0.0.0.0") return bound;
  std::string addresses;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET ||
          (a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0)
        continue;
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr)
        addresses += (addresses.empty() ? "" : ",") + std::string(text);
    }
    freeifaddrs(list);
  }
  return boost::asio::ip::host_name() + "|" + addresses;
}

std::uint16_t StreamServer::port() const {
  return impl_->port;
}

void StreamServer::accept_clients() {
  Impl& s = *impl_;
  if (s.closed) throw StreamError("StreamServer::accept_clients: the server is closed");
  if (s.missing() == 0) return;
  const auto deadline = Clock::now() + s.config.timeout;
  s.io.restart();
  s.start_accept();
  while (s.missing() > 0 && Clock::now() < deadline) s.io.run_one_for(remaining(deadline));
  if (s.missing() == 0) {
    // Nobody else may connect: the port closes, so a late stranger is refused by the system.
    boost::system::error_code ignored;
    s.acceptor.close(ignored);
    s.drop_pending("every client of this job has connected");
    return;
  }
  std::string refusals;
  if (s.refused > 0) {
    refusals = "; " + std::to_string(s.refused) +
               " other connection(s) were refused meanwhile, the last because: " + s.last_refusal;
  }
  s.drop_pending("the host stopped waiting for clients");
  std::string absent;
  for (std::size_t id = 0; id < s.clients.size(); ++id) {
    if (!s.clients[id]) absent += (absent.empty() ? "" : ", ") + std::to_string(id);
  }
  throw StreamError("timed out after " + std::to_string(s.config.timeout.count()) +
                    " ms waiting for stream clients on port " + std::to_string(s.port) +
                    "; still missing client ids " + absent +
                    " (did those IPU ranks start, and do they use this host's address?)" +
                    refusals);
}

void StreamServer::send(std::size_t client, const FrameView& frame,
                        const std::function<void()>& before_write) {
  detail::Connection& connection = impl_->client(client, "send");
  connection.take_credit(impl_->config.timeout);
  if (before_write) before_write();
  connection.write(FrameKind::data, frame);
}

Frame StreamServer::receive(std::size_t client) {
  detail::Connection& connection = impl_->client(client, "receive");
  WireFrame wire = connection.pop(impl_->config.timeout, "a data frame");
  if (wire.kind != FrameKind::data) {
    throw StreamError("unexpected '" + std::string(frame_kind_name(wire.kind)) + "' frame from " +
                      connection.peer() + " where a data frame was expected");
  }
  return std::move(wire.frame);
}

std::uint64_t StreamServer::credits(std::size_t client) const {
  return impl_->client(client, "credits").credits();
}

void StreamServer::close() {
  if (!impl_ || impl_->closed) return;
  impl_->closed = true;
  for (auto& client : impl_->clients) {
    if (client) {
      client->write_close("the host closed the stream");
      client->shutdown();
    }
  }
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

}  // namespace ipupod::host

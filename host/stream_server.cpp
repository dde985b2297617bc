// StreamServer: accept loop with hello authentication, per-client connections (reader thread
// each), credit-gated sends. Asio is used synchronously except for the timed accept.
#include "host/stream_server.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <iostream>
#include <random>
#include <vector>

#include "host/stream_connection.hpp"

namespace ipupod::host {
namespace {

using Clock = std::chrono::steady_clock;

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
  boost::asio::ip::tcp::acceptor acceptor{io};
  std::vector<std::unique_ptr<detail::Connection>> clients;
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

  // One accept, bounded by the deadline; returns false on timeout.
  bool accept_one(boost::asio::ip::tcp::socket& socket, Clock::time_point deadline) {
    boost::system::error_code result = boost::asio::error::would_block;
    acceptor.async_accept(socket, [&](const boost::system::error_code& ec) { result = ec; });
    io.restart();
    io.run_for(remaining(deadline));
    if (result == boost::asio::error::would_block) {
      acceptor.cancel();
      io.restart();
      io.run();
      return false;
    }
    if (result) throw StreamError("accepting a stream connection failed: " + result.message());
    return true;
  }

  // Reads and checks the hello of a fresh connection; returns the client id or the refusal reason.
  std::size_t authenticate(detail::Connection& connection, Clock::time_point deadline,
                           std::string& refusal) {
    WireFrame hello;
    try {
      hello = connection.pop(std::min(remaining(deadline), config.hello_timeout), "a hello");
    } catch (const StreamError& error) {
      refusal = error.what();
      return 0;
    }
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
}

StreamServer::~StreamServer() {
  close();
}

std::uint16_t StreamServer::port() const {
  return impl_->acceptor.local_endpoint().port();
}

void StreamServer::accept_clients() {
  Impl& s = *impl_;
  if (s.closed) throw StreamError("StreamServer::accept_clients: the server is closed");
  const auto deadline = Clock::now() + s.config.timeout;
  auto missing = [&] {
    std::size_t count = 0;
    for (const auto& client : s.clients) count += client ? 0 : 1;
    return count;
  };
  while (missing() > 0) {
    boost::asio::ip::tcp::socket socket(s.io);
    if (!s.accept_one(socket, deadline)) {
      std::string absent;
      for (std::size_t id = 0; id < s.clients.size(); ++id) {
        if (!s.clients[id]) absent += (absent.empty() ? "" : ", ") + std::to_string(id);
      }
      throw StreamError("timed out after " + std::to_string(s.config.timeout.count()) +
                        " ms waiting for stream clients on port " + std::to_string(port()) +
                        "; still missing client ids " + absent +
                        " (did those IPU ranks start, and do they use this host's address?)");
    }
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    const std::string peer_address =
        ec ? std::string("unknown peer")
           : remote.address().to_string() + ":" + std::to_string(remote.port());
    auto connection =
        std::make_unique<detail::Connection>(std::move(socket), peer_address, /*trusted=*/false,
                                             [&s](const std::string& line) { s.log(line); });
    std::string refusal;
    const std::size_t id = s.authenticate(*connection, deadline, refusal);
    if (!refusal.empty()) {
      s.log("refused stream connection from " + peer_address + ": " + refusal);
      connection->write_close("refused: " + refusal);
      connection->shutdown();
      continue;
    }
    connection->set_peer("client " + std::to_string(id) + " (" + peer_address + ")");
    connection->set_authenticated();
    connection->write(FrameKind::hello, Frame{0, id, {DType::u8, {0}, {}}});
    s.clients[id] = std::move(connection);
  }
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

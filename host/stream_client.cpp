// StreamClient: connect with retry, hello/acknowledge handshake, then credit-granting receives.
// Runs on every IPU rank; all waits are bounded by ClientConfig::timeout.
#include "host/stream_client.hpp"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/host_name.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <thread>
#include <vector>

#include "host/stream_connection.hpp"

namespace ipupod::host {
namespace {

using Clock = std::chrono::steady_clock;
// Pause between connection attempts while the host is not listening yet.
constexpr std::chrono::milliseconds kConnectRetryInterval{50};
// Longest wait for one address to answer (an address this node cannot route to may not).
constexpr std::chrono::milliseconds kAttemptTimeout{2000};

// The addresses to try, in order (see ClientConfig::address).
std::vector<std::string> candidate_addresses(const std::string& announced) {
  const std::size_t bar = announced.find('|');
  if (bar == std::string::npos) return {announced};
  const std::string node = announced.substr(0, bar);
  std::vector<std::string> out;
  if (node == boost::asio::ip::host_name()) out.push_back("127.0.0.1");
  std::size_t from = bar + 1;
  while (from <= announced.size()) {
    const std::size_t comma = std::min(announced.find(',', from), announced.size());
    if (comma > from) out.push_back(announced.substr(from, comma - from));
    from = comma + 1;
  }
  if (out.empty()) out.push_back(node);  // no address known: the node's name
  return out;
}

// One attempt to connect `socket` to address:port within `timeout`; the error, or success.
boost::system::error_code connect_once(boost::asio::io_context& io,
                                       boost::asio::ip::tcp::socket& socket,
                                       const std::string& address, std::uint16_t port,
                                       std::chrono::milliseconds timeout) {
  boost::system::error_code ec;
  boost::asio::ip::tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(address, std::to_string(port), ec);
  if (ec) return ec;
  bool done = false;
  boost::asio::async_connect(socket, endpoints,
                             [&](const boost::system::error_code& result, const auto&) {
                               ec = result;
                               done = true;
                             });
  io.restart();
  io.run_for(timeout);
  if (!done) {
    socket.close();  // the pending connect ends with operation_aborted
    io.restart();
    io.run();
    return boost::asio::error::timed_out;
  }
  if (ec) socket.close();
  return ec;
}

}  // namespace

struct StreamClient::Impl {
  ClientConfig config;
  boost::asio::io_context io;
  std::unique_ptr<detail::Connection> connection;
  bool closed = false;
};

StreamClient::StreamClient(ClientConfig config) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  const ClientConfig& c = impl_->config;
  if (c.credits == 0) throw std::invalid_argument("StreamClient: credits must be at least 1");
  const std::vector<std::string> candidates = candidate_addresses(c.address);
  const auto deadline = Clock::now() + c.timeout;
  boost::asio::ip::tcp::socket socket(impl_->io);
  std::string where;
  for (;;) {
    std::string tried;
    bool refused = false;
    for (const std::string& address : candidates) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const auto ec = connect_once(impl_->io, socket, address, c.port,
                                   std::clamp(left, std::chrono::milliseconds(1), kAttemptTimeout));
      if (!ec) {
        where = address + ":" + std::to_string(c.port);
        break;
      }
      refused = refused || ec == boost::asio::error::connection_refused;
      tried += (tried.empty() ? "" : ", ") + address + ":" + std::to_string(c.port) + " (" +
               ec.message() + ")";
    }
    if (!where.empty()) break;
    // Refused: the host may not be listening yet. Anything else, or time up, is an answer.
    if (!refused || Clock::now() >= deadline) {
      throw StreamError("client " + std::to_string(c.client_id) +
                        " cannot connect to the host at " + tried +
                        " (is the host rank running, and can this node reach it? the host's "
                        "--bind-address chooses where it listens)");
    }
    std::this_thread::sleep_for(kConnectRetryInterval);
  }
  impl_->connection =
      std::make_unique<detail::Connection>(std::move(socket), "the host (" + where + ")",
                                           /*trusted=*/true);
  detail::Connection& connection = *impl_->connection;
  connection.write(FrameKind::hello, Frame{0, c.client_id, text_array(c.secret)});
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  WireFrame reply;
  try {
    reply =
        connection.pop(std::max(left, std::chrono::milliseconds(0)), "the hello acknowledgement");
  } catch (const StreamError& error) {
    connection.shutdown();
    throw StreamError("client " + std::to_string(c.client_id) +
                      " was not accepted: " + error.what());
  }
  if (reply.kind != FrameKind::hello || reply.frame.step != c.client_id) {
    connection.shutdown();
    throw StreamError("client " + std::to_string(c.client_id) +
                      ": the host answered the hello with a '" +
                      std::string(frame_kind_name(reply.kind)) + "' frame for id " +
                      std::to_string(reply.frame.step));
  }
  connection.set_authenticated();
  connection.write(FrameKind::credit, Frame{0, c.credits, {DType::u8, {0}, {}}});
}

StreamClient::~StreamClient() {
  close();
}

Frame StreamClient::receive() {
  Frame frame;
  receive(frame);
  return frame;
}

void StreamClient::receive(Frame& frame) {
  if (impl_->closed) throw StreamError("StreamClient::receive: the client is closed");
  detail::Connection& connection = *impl_->connection;
  WireFrame wire = connection.pop(impl_->config.timeout, "a data frame");
  if (wire.kind != FrameKind::data) {
    throw StreamError("unexpected '" + std::string(frame_kind_name(wire.kind)) +
                      "' frame from the host where a data frame was expected");
  }
  connection.write(FrameKind::credit, Frame{0, 1, {DType::u8, {0}, {}}});
  connection.recycle(std::move(frame.array.bytes));
  frame = std::move(wire.frame);
}

void StreamClient::send(const FrameView& frame) {
  if (impl_->closed) throw StreamError("StreamClient::send: the client is closed");
  impl_->connection->write(FrameKind::data, frame);
}

void StreamClient::close() {
  if (!impl_ || impl_->closed) return;
  impl_->closed = true;
  if (impl_->connection) {
    impl_->connection->write_close("client " + std::to_string(impl_->config.client_id) + " closed");
    impl_->connection->shutdown();
  }
}

}  // namespace ipupod::host

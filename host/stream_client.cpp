// StreamClient: connect with retry, hello/acknowledge handshake, then credit-granting receives.
// Runs on every IPU rank; all waits are bounded by ClientConfig::timeout.
#include "host/stream_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <thread>

#include "host/stream_connection.hpp"

namespace ipupod::host {
namespace {

using Clock = std::chrono::steady_clock;
// Pause between connection attempts while the host is not listening yet.
constexpr std::chrono::milliseconds kConnectRetryInterval{50};

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
  const std::string where = c.address + ":" + std::to_string(c.port);
  boost::system::error_code ec;
  // A name (the host rank's hostname on a cluster) or an IP literal.
  boost::asio::ip::tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(c.address, std::to_string(c.port), ec);
  if (ec) {
    throw StreamError("client " + std::to_string(c.client_id) +
                      " cannot resolve the host address '" + c.address + "': " + ec.message() +
                      " (pass an IP address or a name this node can resolve)");
  }

  const auto deadline = Clock::now() + c.timeout;
  boost::asio::ip::tcp::socket socket(impl_->io);
  for (;;) {
    boost::asio::connect(socket, endpoints, ec);
    if (!ec) break;
    socket.close();
    if (ec != boost::asio::error::connection_refused || Clock::now() >= deadline) {
      throw StreamError("client " + std::to_string(c.client_id) +
                        " cannot connect to the host at " + where + ": " + ec.message() +
                        " (is the host rank running, and is this its address and port?)");
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

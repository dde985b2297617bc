// Connection: blocking Asio socket I/O with one reader thread; the waiting side uses a condition
// variable with deadlines, so every wait in the stream layer is bounded by the caller's timeout.
#include "host/stream_connection.hpp"

#include <sys/socket.h>

#include <array>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

namespace ipupod::host::detail {

Connection::Connection(boost::asio::ip::tcp::socket socket, std::string peer, bool trusted, Log log)
    : socket_(std::move(socket)),
      peer_(std::move(peer)),
      authenticated_(trusted),
      log_(std::move(log)) {
  boost::system::error_code ignored;
  socket_.set_option(boost::asio::ip::tcp::no_delay(true), ignored);
  reader_ = std::thread([this] { read_loop(); });
}

Connection::~Connection() {
  shutdown();
}

void Connection::set_peer(std::string peer) {
  std::lock_guard<std::mutex> guard(mutex_);
  peer_ = std::move(peer);
}

void Connection::read_exact(std::span<std::byte> buffer) {
  boost::system::error_code ec;
  boost::asio::read(socket_, boost::asio::buffer(buffer.data(), buffer.size()), ec);
  if (ec == boost::asio::error::eof) throw StreamError("the connection was closed by the peer");
  if (ec) throw StreamError("reading from the socket failed: " + ec.message());
}

void Connection::read_loop() {
  try {
    const ReadExact read = [this](std::span<std::byte> buffer) { read_exact(buffer); };
    for (;;) {
      const PayloadBuffer buffer = [this](std::size_t bytes) { return payload_buffer(bytes); };
      WireFrame wire =
          read_frame(read, authenticated_ ? kMaxPayloadBytes : kMaxHelloPayloadBytes, buffer);
      std::lock_guard<std::mutex> guard(mutex_);
      if (wire.kind == FrameKind::credit) {
        credits_ += wire.frame.step;
      } else if (wire.kind == FrameKind::close) {
        const std::string reason = array_text(wire.frame.array);
        ended_ = true;
        end_reason_ = "the peer closed the stream" + (reason.empty() ? "" : ": " + reason);
        changed_.notify_all();
        return;
      } else {
        queue_.push_back(std::move(wire));
      }
      changed_.notify_all();
    }
  } catch (const FrameError& error) {
    // The byte stream cannot be trusted past a bad frame: say why and stop reading.
    std::string peer;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      peer = peer_;
    }
    const std::string reason = std::string(error.what()) + " from " + peer;
    if (log_) log_(reason + "; closing the connection");
    write_close(error.what());
    end(reason);
  } catch (const std::exception& error) {
    bool local = false;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      local = shut_down_;
    }
    end(local ? std::string("the connection was closed locally") : std::string(error.what()));
  }
}

void Connection::end(const std::string& reason) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (!ended_) {
    ended_ = true;
    end_reason_ = reason;
  }
  changed_.notify_all();
}

void Connection::throw_ended(const std::string& doing) {
  throw StreamError(doing + " " + peer_ + ": " + end_reason_);
}

std::vector<std::byte> Connection::payload_buffer(std::size_t bytes) {
  std::vector<std::byte> buffer;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    // A spare of exactly this size needs no resize (so no zero fill); else any large enough one.
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->size() == bytes) {
        best = it;
        break;
      }
      if (it->capacity() >= bytes && (best == spare_.end() || it->capacity() < best->capacity()))
        best = it;
    }
    if (best != spare_.end()) {
      buffer = std::move(*best);
      *best = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  buffer.resize(bytes);
  return buffer;
}

void Connection::recycle(std::vector<std::byte>&& buffer) {
  if (buffer.capacity() == 0) return;
  std::lock_guard<std::mutex> guard(mutex_);
  if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(buffer));
}

void Connection::write(FrameKind kind, const FrameView& frame) {
  const std::vector<std::byte> head = encode_frame_head(kind, frame);
  const std::uint32_t trailer = frame_trailer(head, frame);
  // One gather write: the payload goes from where it lies (one buffer or many pieces) straight
  // into the socket, with no copy into a frame buffer first.
  std::vector<boost::asio::const_buffer> pieces;
  pieces.reserve(frame.payload().size() + 2);
  pieces.push_back(boost::asio::buffer(head));
  for (const std::span<const std::byte> piece : frame.payload())
    pieces.push_back(boost::asio::buffer(piece.data(), piece.size()));
  pieces.push_back(boost::asio::buffer(&trailer, sizeof(trailer)));
  std::lock_guard<std::mutex> guard(write_mutex_);
  {
    std::lock_guard<std::mutex> state(mutex_);
    if (shut_down_) throw StreamError("cannot send to " + peer_ + ": the connection is closed");
  }
  boost::system::error_code ec;
  boost::asio::write(socket_, pieces, ec);
  if (ec) throw StreamError("cannot send to " + peer_ + ": " + ec.message());
}

void Connection::write_close(const std::string& reason) noexcept {
  try {
    const Frame close{0, 0, text_array(reason)};
    write(FrameKind::close, close);
  } catch (...) {
    // The peer may already be gone; closing is best effort.
  }
}

WireFrame Connection::pop(std::chrono::milliseconds timeout, const std::string& waiting_for) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool ready = changed_.wait_until(lock, Clock::now() + timeout,
                                         [this] { return !queue_.empty() || ended_; });
  if (!queue_.empty()) {
    WireFrame wire = std::move(queue_.front());
    queue_.pop_front();
    return wire;
  }
  if (ready) throw_ended("while waiting for " + waiting_for + " from");
  throw StreamError("timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                    waiting_for + " from " + peer_ +
                    " (is that rank still running? raise the timeout if it is just slow)");
}

void Connection::take_credit(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool ready =
      changed_.wait_until(lock, Clock::now() + timeout, [this] { return credits_ > 0 || ended_; });
  if (ended_) throw_ended("cannot send to");
  if (!ready) {
    throw StreamError("timed out after " + std::to_string(timeout.count()) +
                      " ms waiting for a credit from " + peer_ +
                      " (it has stopped taking frames; is that rank stuck or much slower?)");
  }
  --credits_;
}

std::uint64_t Connection::credits() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return credits_;
}

void Connection::shutdown() noexcept {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Shutting the socket down wakes both the reader and any writer blocked in send().
  if (socket_.is_open()) ::shutdown(socket_.native_handle(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  end("the connection was closed locally");
  std::lock_guard<std::mutex> guard(write_mutex_);  // no write may still use the descriptor
  boost::system::error_code ignored;
  socket_.close(ignored);
}

}  // namespace ipupod::host::detail

// Framing of the host<->IPU data streams over TCP: a checksummed, bounded, versioned frame format
// that is validated field by field before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/host_array.hpp"

namespace ipupod::host {

// A frame failed a check, the peer went away, or a stream operation timed out.
class StreamError : public std::runtime_error {
  using runtime_error::runtime_error;
};

// A frame failed one of read_frame's checks (the peer is broken or not an ipupod endpoint; the
// connection cannot be trusted any more and is closed).
class FrameError : public StreamError {
  using StreamError::StreamError;
};

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78). crc32c("123456789") == 0xE3069283.
// Pass the previous result as `crc` to continue a running checksum over several pieces.
std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc = 0);
// The same over several pieces one after the other (as if concatenated). Runs of three pieces of
// equal length (a batch's samples) are checksummed as three lanes at once.
std::uint32_t crc32c_pieces(std::span<const std::span<const std::byte>> pieces,
                            std::uint32_t crc = 0);

struct Frame {
  std::uint16_t stream = 0;  // which stream of the job (e.g. inputs, targets, losses)
  std::uint64_t step = 0;    // host step the frame belongs to
  HostArray array;
};

// Wire format, all integers little-endian:
//
//   offset size field
//        0    4 magic          "IPUS" (bytes 0x49 0x50 0x55 0x53)
//        4    2 version        kStreamVersion
//        6    1 kind           FrameKind
//        7    1 dtype          DType value (1..5)
//        8    2 stream         stream id
//       10    1 rank           number of dims, <= kMaxFrameRank
//       11    1 reserved       0
//       12    8 step           host step (hello: client id; credit: credits granted)
//       20    8 payload_bytes  <= kMaxPayloadBytes and == product(dims) * dtype size
//       28  8*r dims           one uint64 per dimension
//        .    n payload        the array, row-major, little-endian elements
//        .    4 crc32c         over every byte above (header, dims and payload)
//
// Kinds: hello (client -> server: step = client id, payload = the job secret as uint8[n];
// server -> client: the same frame without payload acknowledges), data (an array), credit
// (step = number of additional frames the receiver can take), close (payload = optional
// uint8[n] reason text). The header is checked before the dims and payload are read.
enum class FrameKind : std::uint8_t { hello = 1, data = 2, credit = 3, close = 4 };

inline constexpr std::uint32_t kStreamMagic = 0x53555049;  // "IPUS" read as little-endian
inline constexpr std::uint16_t kStreamVersion = 1;
inline constexpr std::size_t kFrameHeaderBytes = 28;
inline constexpr std::size_t kFrameTrailerBytes = 4;
inline constexpr std::size_t kMaxFrameRank = 8;
inline constexpr std::uint64_t kMaxPayloadBytes = std::uint64_t{1} << 30;  // 1 GiB

std::string_view frame_kind_name(FrameKind kind);

struct WireFrame {
  FrameKind kind = FrameKind::data;
  Frame frame;
};

// A frame whose array lies elsewhere (e.g. one micro-batch of a larger host batch): what a
// writer needs to send it without copying the payload first.
// The payload is `bytes`, or, when `pieces` is not empty, the pieces one after the other (e.g.
// a batch's samples where they lie in a mapped file, sent by a gather write); not both.
struct FrameView {
  std::uint16_t stream = 0;
  std::uint64_t step = 0;
  DType dtype = DType::f32;
  std::span<const std::size_t> shape;
  std::span<const std::byte> bytes;
  std::span<const std::span<const std::byte>> pieces;

  // The payload as pieces: `pieces`, or `bytes` as the one piece (valid while this view is).
  std::span<const std::span<const std::byte>> payload() const {
    return pieces.empty() ? std::span<const std::span<const std::byte>>(&bytes, 1) : pieces;
  }
  std::size_t payload_bytes() const;

  FrameView() = default;
  FrameView(const Frame& frame)  // NOLINT(google-explicit-constructor): a frame is its own view
      : stream(frame.stream),
        step(frame.step),
        dtype(frame.array.dtype),
        shape(frame.array.shape),
        bytes(frame.array.bytes) {}
  FrameView(std::uint16_t stream_id, std::uint64_t step_number, DType type,
            std::span<const std::size_t> dims, std::span<const std::byte> payload)
      : stream(stream_id), step(step_number), dtype(type), shape(dims), bytes(payload) {}
  FrameView(std::uint16_t stream_id, std::uint64_t step_number, DType type,
            std::span<const std::size_t> dims,
            std::span<const std::span<const std::byte>> payload_pieces)
      : stream(stream_id), step(step_number), dtype(type), shape(dims), pieces(payload_pieces) {}
};

// The bytes of one frame. Throws StreamError if the array breaks a bound or its byte count
// disagrees with its shape.
std::vector<std::byte> encode_frame(FrameKind kind, const FrameView& frame);
std::vector<std::byte> encode_frame(FrameKind kind, const Frame& frame);
// The same frame in three pieces so that a writer can send the payload from where it lies
// (gather write) instead of copying it: head (header and dims), frame.payload(), trailer.
std::vector<std::byte> encode_frame_head(FrameKind kind, const FrameView& frame);
std::uint32_t frame_trailer(std::span<const std::byte> head, const FrameView& frame);

// Fills exactly `buffer.size()` bytes or throws (StreamError on end of stream).
using ReadExact = std::function<void(std::span<std::byte> buffer)>;
// Returns a buffer of exactly `bytes` bytes for a payload (its contents are overwritten), e.g.
// one taken from a pool of buffers earlier frames no longer use.
using PayloadBuffer = std::function<std::vector<std::byte>(std::size_t bytes)>;

// Reads and validates one frame: magic, version, kind, dtype, rank, reserved byte, payload bound
// (`max_payload_bytes`, at most kMaxPayloadBytes), payload == product(dims) * dtype size, then
// the CRC. Throws FrameError naming the failed check (StreamError if `read` fails); asks
// `buffer` (or allocates) only after the checks that bound the allocation have passed. The
// payload is read and checksummed in pieces, each while it is still in the CPU's cache.
WireFrame read_frame(const ReadExact& read, std::uint64_t max_payload_bytes = kMaxPayloadBytes,
                     const PayloadBuffer& buffer = {});

// read_frame over a buffer that must hold exactly one frame.
WireFrame decode_frame(std::span<const std::byte> bytes,
                       std::uint64_t max_payload_bytes = kMaxPayloadBytes);

// Helpers for the control payloads (text carried as uint8[n]).
HostArray text_array(const std::string& text);
std::string array_text(const HostArray& array);

}  // namespace ipupod::host

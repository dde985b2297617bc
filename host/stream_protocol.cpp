// Frame encoding/decoding and CRC-32C for the host<->IPU streams (format in stream_protocol.hpp).
// Every length read off the wire is bounded before it is used to size a buffer.
#include "host/stream_protocol.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define IPUPOD_HAVE_SSE42_CRC 1
#endif

namespace ipupod::host {

static_assert(std::endian::native == std::endian::little,
              "the stream wire format copies payloads as-is and assumes a little-endian host");

namespace {

constexpr std::uint32_t kCrc32cPolynomial = 0x82F63B78;  // reflected Castagnoli polynomial
// Payloads are read and checksummed in pieces this large: small enough to be still in the
// CPU's cache when the checksum runs over them, large enough to keep reads few.
constexpr std::size_t kChecksumPieceBytes = std::size_t{128} << 10;

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1U) ? kCrc32cPolynomial : 0U);
    table[i] = crc;
  }
  return table;
}
constexpr std::array<std::uint32_t, 256> kCrcTable = make_crc_table();

std::uint32_t crc32c_table(const std::byte* data, std::size_t size, std::uint32_t crc) {
  for (std::size_t i = 0; i < size; ++i) {
    crc = (crc >> 8) ^ kCrcTable[(crc ^ std::to_integer<std::uint32_t>(data[i])) & 0xFFU];
  }
  return crc;
}

#ifdef IPUPOD_HAVE_SSE42_CRC
// One CRC32 instruction per 8 bytes. The states here are raw (not inverted).
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const std::byte* data,
                                                             std::size_t size, std::uint32_t crc) {
  std::uint64_t wide = crc;
  while (size >= 8) {
    std::uint64_t word;
    std::memcpy(&word, data, 8);
    wide = _mm_crc32_u64(wide, word);
    data += 8;
    size -= 8;
  }
  std::uint32_t narrow = static_cast<std::uint32_t>(wide);
  while (size > 0) {
    narrow = _mm_crc32_u8(narrow, std::to_integer<std::uint8_t>(*data));
    ++data;
    --size;
  }
  return narrow;
}

// The CRC32 instruction takes 3 cycles but can start one every cycle, so three independent lanes
// over three neighbouring stretches run about three times faster than one. The lanes' states
// are then joined: the raw CRC update is linear, so crc(s, A B) = zeros_n(crc(s, A)) ^ crc(0, B)
// where zeros_n(x) is the state after n zero bytes from state x (n = |B|), itself linear in x
// and applied with four byte-indexed tables.
constexpr std::size_t kLaneBytes = 4096;

struct ZerosShift {
  std::array<std::array<std::uint32_t, 256>, 4> table{};

  explicit ZerosShift(std::size_t zero_bytes) {
    const std::vector<std::byte> zeros(zero_bytes);
    std::array<std::uint32_t, 32> basis{};  // the shift of each single-bit state
    for (int bit = 0; bit < 32; ++bit) {
      basis[bit] = crc32c_sse42(zeros.data(), zeros.size(), std::uint32_t{1} << bit);
    }
    for (int part = 0; part < 4; ++part) {
      for (std::uint32_t byte = 0; byte < 256; ++byte) {
        std::uint32_t shifted = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (byte & (1U << bit)) shifted ^= basis[8 * part + bit];
        }
        table[part][byte] = shifted;
      }
    }
  }

  std::uint32_t operator()(std::uint32_t state) const {
    return table[0][state & 0xFFU] ^ table[1][(state >> 8) & 0xFFU] ^
           table[2][(state >> 16) & 0xFFU] ^ table[3][state >> 24];
  }
};

// The shifts that join three lanes of `lane_bytes` each: past one lane and past two.
struct LaneShifts {
  ZerosShift one, two;
  explicit LaneShifts(std::size_t lane_bytes) : one(lane_bytes), two(2 * lane_bytes) {}
};

// The shifts for lanes of `lane_bytes`, made once per length and kept (a batch's pieces come in
// few lengths).
const LaneShifts& lane_shifts(std::size_t lane_bytes) {
  static std::mutex mutex;
  static std::map<std::size_t, std::unique_ptr<const LaneShifts>> made;
  std::lock_guard<std::mutex> guard(mutex);
  auto& shifts = made[lane_bytes];
  if (!shifts) shifts = std::make_unique<const LaneShifts>(lane_bytes);
  return *shifts;
}

// Three stretches of `size` bytes each, in the order a, b, c, from raw state `crc`, as three
// lanes joined by `shifts` (made for `size`).
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42_three(
    const std::byte* a, const std::byte* b, const std::byte* c, std::size_t size, std::uint32_t crc,
    const LaneShifts& shifts) {
  std::uint64_t x = crc, y = 0, z = 0;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t wa, wb, wc;
    std::memcpy(&wa, a + i, 8);
    std::memcpy(&wb, b + i, 8);
    std::memcpy(&wc, c + i, 8);
    x = _mm_crc32_u64(x, wa);
    y = _mm_crc32_u64(y, wb);
    z = _mm_crc32_u64(z, wc);
  }
  const std::size_t tail = size - i;
  return shifts.two(crc32c_sse42(a + i, tail, static_cast<std::uint32_t>(x))) ^
         shifts.one(crc32c_sse42(b + i, tail, static_cast<std::uint32_t>(y))) ^
         crc32c_sse42(c + i, tail, static_cast<std::uint32_t>(z));
}

__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42_lanes(const std::byte* data,
                                                                   std::size_t size,
                                                                   std::uint32_t crc) {
  static const LaneShifts& shifts = lane_shifts(kLaneBytes);
  for (; size >= 3 * kLaneBytes; data += 3 * kLaneBytes, size -= 3 * kLaneBytes)
    crc =
        crc32c_sse42_three(data, data + kLaneBytes, data + 2 * kLaneBytes, kLaneBytes, crc, shifts);
  return crc32c_sse42(data, size, crc);
}
#endif

// Writes `value` at `at` (little-endian host) and returns the position after it.
template <class T>
std::byte* put(std::byte* at, T value) {
  std::memcpy(at, &value, sizeof(T));
  return at + sizeof(T);
}

template <class T>
T get(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

bool valid_kind(std::uint8_t raw) {
  return raw >= static_cast<std::uint8_t>(FrameKind::hello) &&
         raw <= static_cast<std::uint8_t>(FrameKind::close);
}

}  // namespace

std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc) {
  crc = ~crc;
#ifdef IPUPOD_HAVE_SSE42_CRC
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  crc = hardware ? crc32c_sse42_lanes(data.data(), data.size(), crc)
                 : crc32c_table(data.data(), data.size(), crc);
#else
  crc = crc32c_table(data.data(), data.size(), crc);
#endif
  return ~crc;
}

std::uint32_t crc32c_pieces(std::span<const std::span<const std::byte>> pieces, std::uint32_t crc) {
#ifdef IPUPOD_HAVE_SSE42_CRC
  // Pieces shorter than this go one by one: three lanes would not repay the shifts.
  constexpr std::size_t kMinLaneBytes = 256;
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) {
    const LaneShifts* shifts = nullptr;  // for lanes of shifts_size bytes
    std::size_t shifts_size = 0;
    for (std::size_t k = 0; k < pieces.size();) {
      const std::size_t size = pieces[k].size();
      if (k + 3 <= pieces.size() && size >= kMinLaneBytes && pieces[k + 1].size() == size &&
          pieces[k + 2].size() == size) {
        if (size != shifts_size) shifts = &lane_shifts(shifts_size = size);
        crc = ~crc32c_sse42_three(pieces[k].data(), pieces[k + 1].data(), pieces[k + 2].data(),
                                  size, ~crc, *shifts);
        k += 3;
      } else {
        crc = crc32c(pieces[k], crc);
        ++k;
      }
    }
    return crc;
  }
#endif
  for (const std::span<const std::byte> piece : pieces) crc = crc32c(piece, crc);
  return crc;
}

std::string_view frame_kind_name(FrameKind kind) {
  switch (kind) {
    case FrameKind::hello:
      return "hello";
    case FrameKind::data:
      return "data";
    case FrameKind::credit:
      return "credit";
    case FrameKind::close:
      return "close";
  }
  return "unknown";
}

std::size_t FrameView::payload_bytes() const {
  std::size_t total = 0;
  for (const std::span<const std::byte> piece : payload()) total += piece.size();
  return total;
}

std::vector<std::byte> encode_frame(FrameKind kind, const FrameView& frame) {
  const std::vector<std::byte> head = encode_frame_head(kind, frame);
  const std::uint32_t trailer = frame_trailer(head, frame);
  std::vector<std::byte> out(head.size() + frame.payload_bytes() + kFrameTrailerBytes);
  std::byte* at = std::copy(head.begin(), head.end(), out.data());
  for (const std::span<const std::byte> piece : frame.payload())
    at = std::copy(piece.begin(), piece.end(), at);
  std::memcpy(at, &trailer, kFrameTrailerBytes);
  return out;
}

std::vector<std::byte> encode_frame(FrameKind kind, const Frame& frame) {
  return encode_frame(kind, FrameView(frame));
}

std::uint32_t frame_trailer(std::span<const std::byte> head, const FrameView& frame) {
  return crc32c_pieces(frame.payload(), crc32c(head));
}

std::vector<std::byte> encode_frame_head(FrameKind kind, const FrameView& frame) {
  const std::string what = std::string(dtype_name(frame.dtype)) + shape_string(frame.shape);
  if (frame.shape.size() > kMaxFrameRank) {
    throw StreamError("cannot send " + what + ": rank " + std::to_string(frame.shape.size()) +
                      " exceeds the stream limit of " + std::to_string(kMaxFrameRank));
  }
  const std::size_t expected = shape_elements(frame.shape) * dtype_size(frame.dtype);
  if (!frame.pieces.empty() && !frame.bytes.empty()) {
    throw StreamError("cannot send " + what +
                      ": its payload is given both as bytes and as pieces (one or the other)");
  }
  if (frame.payload_bytes() != expected) {
    throw StreamError("cannot send " + what + ": it holds " +
                      std::to_string(frame.payload_bytes()) + " bytes but its shape needs " +
                      std::to_string(expected));
  }
  if (expected > kMaxPayloadBytes) {
    throw StreamError("cannot send " + what + ": " + std::to_string(expected) +
                      " bytes exceed the frame limit of " + std::to_string(kMaxPayloadBytes) +
                      " bytes; split it into several frames");
  }
  std::vector<std::byte> out(kFrameHeaderBytes + 8 * frame.shape.size());
  std::byte* at = out.data();
  at = put<std::uint32_t>(at, kStreamMagic);
  at = put<std::uint16_t>(at, kStreamVersion);
  at = put<std::uint8_t>(at, static_cast<std::uint8_t>(kind));
  at = put<std::uint8_t>(at, static_cast<std::uint8_t>(frame.dtype));
  at = put<std::uint16_t>(at, frame.stream);
  at = put<std::uint8_t>(at, static_cast<std::uint8_t>(frame.shape.size()));
  at = put<std::uint8_t>(at, 0);
  at = put<std::uint64_t>(at, frame.step);
  at = put<std::uint64_t>(at, expected);
  for (std::size_t extent : frame.shape) at = put<std::uint64_t>(at, extent);
  return out;
}

WireFrame read_frame(const ReadExact& read, std::uint64_t max_payload_bytes,
                     const PayloadBuffer& buffer) {
  max_payload_bytes = std::min(max_payload_bytes, kMaxPayloadBytes);
  std::array<std::byte, kFrameHeaderBytes> header;
  read(header);
  const auto reject = [](const std::string& reason) {
    throw FrameError("rejected stream frame: " + reason);
  };
  const auto magic = get<std::uint32_t>(header.data() + 0);
  if (magic != kStreamMagic) {
    reject("bad magic number " + std::to_string(magic) + " (expected " +
           std::to_string(kStreamMagic) + "); the peer is not an ipupod stream endpoint");
  }
  const auto version = get<std::uint16_t>(header.data() + 4);
  if (version != kStreamVersion) {
    reject("protocol version " + std::to_string(version) + ", this build speaks version " +
           std::to_string(kStreamVersion) + "; run the same ipupod build on every rank");
  }
  const auto kind = get<std::uint8_t>(header.data() + 6);
  if (!valid_kind(kind)) reject("unknown frame kind " + std::to_string(kind));
  const auto dtype = get<std::uint8_t>(header.data() + 7);
  if (!is_valid_dtype(dtype)) reject("unknown dtype " + std::to_string(dtype));
  const auto rank = get<std::uint8_t>(header.data() + 10);
  if (rank > kMaxFrameRank) {
    reject("rank " + std::to_string(rank) + " exceeds the limit of " +
           std::to_string(kMaxFrameRank));
  }
  if (get<std::uint8_t>(header.data() + 11) != 0) reject("reserved header byte is not zero");
  const auto payload_bytes = get<std::uint64_t>(header.data() + 20);
  if (payload_bytes > max_payload_bytes) {
    reject("payload length " + std::to_string(payload_bytes) + " bytes exceeds the limit of " +
           std::to_string(max_payload_bytes) + " bytes");
  }

  std::vector<std::byte> dims_bytes(8 * std::size_t{rank});
  read(dims_bytes);
  WireFrame wire;
  wire.kind = static_cast<FrameKind>(kind);
  wire.frame.stream = get<std::uint16_t>(header.data() + 8);
  wire.frame.step = get<std::uint64_t>(header.data() + 12);
  HostArray& array = wire.frame.array;
  array.dtype = static_cast<DType>(dtype);
  array.shape.resize(rank);
  std::uint64_t expected = dtype_size(array.dtype);
  for (std::size_t i = 0; i < rank; ++i) {
    const auto extent = get<std::uint64_t>(dims_bytes.data() + 8 * i);
    array.shape[i] = extent;
    // Either the product stays within the payload bound or it is not a valid frame.
    if (extent != 0 && expected > max_payload_bytes / extent) {
      expected = std::numeric_limits<std::uint64_t>::max();
    } else {
      expected *= extent;
    }
  }
  if (expected != payload_bytes) {
    reject("shape " + shape_string(array.shape) + " of " + std::string(dtype_name(array.dtype)) +
           " needs " +
           (expected == std::numeric_limits<std::uint64_t>::max()
                ? std::string("more than the limit")
                : std::to_string(expected)) +
           " bytes but the payload length says " + std::to_string(payload_bytes));
  }
  if (buffer) {
    array.bytes = buffer(payload_bytes);
    if (array.bytes.size() != payload_bytes) {
      throw std::logic_error("read_frame: the payload buffer has " +
                             std::to_string(array.bytes.size()) + " bytes, the frame needs " +
                             std::to_string(payload_bytes));
    }
  } else {
    array.bytes.resize(payload_bytes);
  }
  std::uint32_t crc = crc32c(header);
  crc = crc32c(dims_bytes, crc);
  for (std::size_t first = 0; first < payload_bytes; first += kChecksumPieceBytes) {
    const std::span<std::byte> piece =
        std::span(array.bytes)
            .subspan(first, std::min<std::size_t>(kChecksumPieceBytes, payload_bytes - first));
    read(piece);
    crc = crc32c(piece, crc);
  }
  std::array<std::byte, kFrameTrailerBytes> trailer;
  read(trailer);
  const auto sent_crc = get<std::uint32_t>(trailer.data());
  if (crc != sent_crc) {
    reject("CRC32C mismatch (computed " + std::to_string(crc) + ", frame says " +
           std::to_string(sent_crc) + "); the data was corrupted in transit");
  }
  return wire;
}

WireFrame decode_frame(std::span<const std::byte> bytes, std::uint64_t max_payload_bytes) {
  std::size_t offset = 0;
  const ReadExact read = [&](std::span<std::byte> buffer) {
    if (buffer.size() > bytes.size() - offset) {
      throw FrameError("rejected stream frame: truncated (needed " +
                       std::to_string(offset + buffer.size()) + " bytes, have " +
                       std::to_string(bytes.size()) + ")");
    }
    if (buffer.empty()) return;  // memcpy must not see the null pointer of an empty span
    std::memcpy(buffer.data(), bytes.data() + offset, buffer.size());
    offset += buffer.size();
  };
  // The payload is sized from the header: a header that promises more than the buffer holds is
  // refused before anything is allocated for it.
  const PayloadBuffer buffer = [&](std::size_t payload_bytes) {
    if (payload_bytes > bytes.size() - offset) {
      throw FrameError("rejected stream frame: truncated (its header promises " +
                       std::to_string(payload_bytes) + " payload bytes after byte " +
                       std::to_string(offset) + ", the buffer holds " +
                       std::to_string(bytes.size()) + ")");
    }
    return std::vector<std::byte>(payload_bytes);
  };
  WireFrame wire = read_frame(read, max_payload_bytes, buffer);
  if (offset != bytes.size()) {
    throw FrameError("rejected stream frame: " + std::to_string(bytes.size() - offset) +
                     " trailing bytes after the frame");
  }
  return wire;
}

HostArray text_array(const std::string& text) {
  HostArray array = HostArray::zeros(DType::u8, {text.size()});
  if (!text.empty()) std::memcpy(array.bytes.data(), text.data(), text.size());
  return array;
}

std::string array_text(const HostArray& array) {
  return std::string(reinterpret_cast<const char*>(array.bytes.data()), array.bytes.size());
}

}  // namespace ipupod::host

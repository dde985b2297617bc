// Tests of the stream frame format: CRC-32C check value, round trips, and rejection of corrupt,
// foreign, oversized and over-ranked frames before any large allocation.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "host/stream_protocol.hpp"

namespace ipupod::host {
namespace {

std::span<const std::byte> bytes_of(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

Frame sample_frame() {
  Frame frame;
  frame.stream = 3;
  frame.step = 123456789012ULL;
  frame.array = HostArray::from_values<float>({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6.5f});
  return frame;
}

std::string rejection(const std::vector<std::byte>& bytes) {
  try {
    decode_frame(bytes);
  } catch (const StreamError& error) {
    return error.what();
  }
  return "accepted";
}

void put_u64(std::vector<std::byte>& bytes, std::size_t offset, std::uint64_t value) {
  std::memcpy(bytes.data() + offset, &value, 8);
}

TEST(Crc32c, KnownCheckValue) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c({}), 0u);
  // Continuing a checksum over pieces gives the same result as one pass.
  const std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32c(bytes_of(text.substr(10)), crc32c(bytes_of(text.substr(0, 10)))),
            crc32c(bytes_of(text)));
}

// CRC-32C one bit at a time, straight from the definition: the reference for the fast paths.
std::uint32_t crc32c_bitwise(std::span<const std::byte> data) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::byte byte : data) {
    crc ^= std::to_integer<std::uint32_t>(byte);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

// `size` bytes from a linear congruential generator (the same bytes every run).
std::vector<std::byte> pseudo_random_bytes(std::size_t size) {
  std::vector<std::byte> data(size);
  std::uint32_t state = 12345;
  for (std::byte& b : data) {
    state = state * 1664525u + 1013904223u;
    b = static_cast<std::byte>(state >> 24);
  }
  return data;
}

TEST(Crc32c, LongBuffersMatchTheDefinitionAtEveryLength) {
  // The hardware path runs three lanes over blocks of several KiB and joins them; lengths
  // around and between block multiples, odd offsets and split points exercise every join.
  std::vector<std::byte> data = pseudo_random_bytes(100003);
  for (std::size_t length :
       {std::size_t{7}, std::size_t{4095}, std::size_t{12287}, std::size_t{12288},
        std::size_t{12289}, std::size_t{24583}, std::size_t{36864}, std::size_t{99999}}) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{3}}) {
      const std::span<const std::byte> piece(data.data() + offset, length);
      const std::uint32_t expected = crc32c_bitwise(piece);
      EXPECT_EQ(crc32c(piece), expected) << "length " << length << " offset " << offset;
      const std::size_t split = length / 3 + 1;
      EXPECT_EQ(crc32c(piece.subspan(split), crc32c(piece.first(split))), expected)
          << "length " << length << " split at " << split;
    }
  }
  // A flipped bit anywhere changes the checksum.
  const std::uint32_t clean = crc32c(data);
  data[50001] ^= std::byte{0x10};
  EXPECT_NE(crc32c(data), clean);
}

TEST(Crc32c, PiecesGiveTheCrcOfTheirConcatenation) {
  const std::vector<std::byte> data = pseudo_random_bytes(200000);
  // Runs of equal pieces (three lanes), lengths not a multiple of 8, pieces too short for lanes,
  // an empty one, a run broken by an odd length, and pieces that overlap in memory.
  const std::vector<std::size_t> sizes = {4096, 4096, 4096, 4096, 8191, 8191, 8191, 17,
                                          17,   17,   0,    300,  300,  301,  300,  300,
                                          300,  8192, 8192, 8192, 8192, 8192, 8192};
  std::vector<std::span<const std::byte>> pieces;
  std::vector<std::byte> joined;
  std::size_t at = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::span<const std::byte> piece(data.data() + at, sizes[k]);
    pieces.push_back(piece);
    joined.insert(joined.end(), piece.begin(), piece.end());
    at = (at + 7919 * (k + 1)) % (data.size() - 9000);
  }
  EXPECT_EQ(crc32c_pieces(pieces), crc32c_bitwise(joined));
  EXPECT_EQ(crc32c_pieces(pieces, 0xDEADBEEFU), crc32c(joined, 0xDEADBEEFU));
  EXPECT_EQ(crc32c_pieces({}, 7U), 7U);
}

TEST(StreamProtocol, PayloadGoesIntoTheBufferGiven) {
  const std::vector<std::byte> bytes = encode_frame(FrameKind::data, sample_frame());
  std::size_t asked = 0;
  const WireFrame wire = decode_frame(bytes, kMaxPayloadBytes);
  const PayloadBuffer reuse = [&](std::size_t n) {
    asked = n;
    return std::vector<std::byte>(n, std::byte{0xAB});  // stale contents are overwritten
  };
  std::size_t offset = 0;
  const ReadExact read = [&](std::span<std::byte> out) {
    std::memcpy(out.data(), bytes.data() + offset, out.size());
    offset += out.size();
  };
  const WireFrame reused = read_frame(read, kMaxPayloadBytes, reuse);
  EXPECT_EQ(asked, 6 * sizeof(float));
  EXPECT_EQ(reused.frame.array.bytes, wire.frame.array.bytes);
  // A frame viewed in place (e.g. one micro-batch of a larger batch) encodes the same bytes.
  const Frame frame = sample_frame();
  const std::vector<std::size_t> shape = frame.array.shape;
  EXPECT_EQ(
      encode_frame(FrameKind::data, FrameView(frame.stream, frame.step, frame.array.dtype, shape,
                                              std::span<const std::byte>(frame.array.bytes))),
      bytes);
}

TEST(StreamProtocol, RoundTrip) {
  const Frame frame = sample_frame();
  const auto bytes = encode_frame(FrameKind::data, frame);
  EXPECT_EQ(bytes.size(), kFrameHeaderBytes + 2 * 8 + 24 + kFrameTrailerBytes);
  const WireFrame wire = decode_frame(bytes);
  EXPECT_EQ(wire.kind, FrameKind::data);
  EXPECT_EQ(wire.frame.stream, 3);
  EXPECT_EQ(wire.frame.step, 123456789012ULL);
  EXPECT_EQ(wire.frame.array.dtype, DType::f32);
  EXPECT_EQ(wire.frame.array.shape, frame.array.shape);
  EXPECT_EQ(wire.frame.array.bytes, frame.array.bytes);

  Frame scalar;
  scalar.array = HostArray::from_values<std::int32_t>({}, std::vector<std::int32_t>{-5});
  const WireFrame back = decode_frame(encode_frame(FrameKind::data, scalar));
  EXPECT_TRUE(back.frame.array.shape.empty());
  EXPECT_EQ(back.frame.array.as<std::int32_t>()[0], -5);

  const WireFrame close = decode_frame(encode_frame(FrameKind::close, {0, 0, text_array("bye")}));
  EXPECT_EQ(close.kind, FrameKind::close);
  EXPECT_EQ(array_text(close.frame.array), "bye");
}

TEST(StreamProtocol, PayloadInPiecesEncodesAsOneBuffer) {
  const Frame frame = sample_frame();
  const std::span<const std::byte> payload(frame.array.bytes);
  // Pieces of unequal sizes, an empty one among them, as a gather of samples would give.
  const std::vector<std::span<const std::byte>> pieces = {
      payload.subspan(0, 4), payload.subspan(4, 0), payload.subspan(4, 12), payload.subspan(16)};
  const FrameView gathered(frame.stream, frame.step, frame.array.dtype, frame.array.shape, pieces);
  EXPECT_EQ(gathered.payload_bytes(), payload.size());
  const std::vector<std::byte> expected = encode_frame(FrameKind::data, frame);
  EXPECT_EQ(encode_frame(FrameKind::data, gathered), expected);
  const std::vector<std::byte> head = encode_frame_head(FrameKind::data, gathered);
  EXPECT_EQ(frame_trailer(head, gathered), crc32c(payload, crc32c(head)));
  EXPECT_EQ(decode_frame(expected).frame.array.bytes, frame.array.bytes);

  // Too few bytes in the pieces for the shape, and a payload given both ways, are refused.
  const std::vector<std::span<const std::byte>> short_pieces = {payload.subspan(0, 20)};
  try {
    encode_frame(FrameKind::data, FrameView(3, 0, DType::f32, frame.array.shape, short_pieces));
    FAIL() << "a short payload was encoded";
  } catch (const StreamError& error) {
    EXPECT_NE(std::string(error.what()).find("holds 20 bytes but its shape needs 24"),
              std::string::npos)
        << error.what();
  }
  FrameView both = gathered;
  both.bytes = payload;
  EXPECT_THROW(encode_frame(FrameKind::data, both), StreamError);
}

TEST(StreamProtocol, CorruptCrcIsRejected) {
  auto bytes = encode_frame(FrameKind::data, sample_frame());
  bytes[kFrameHeaderBytes + 16 + 5] ^= std::byte{0x40};  // flip a payload bit
  EXPECT_NE(rejection(bytes).find("CRC32C mismatch"), std::string::npos) << rejection(bytes);
}

TEST(StreamProtocol, BadMagicIsRejected) {
  auto bytes = encode_frame(FrameKind::data, sample_frame());
  bytes[0] = std::byte{'X'};
  EXPECT_NE(rejection(bytes).find("bad magic"), std::string::npos) << rejection(bytes);
}

TEST(StreamProtocol, OversizedLengthIsRejectedBeforeAllocating) {
  auto bytes = encode_frame(FrameKind::data, sample_frame());
  put_u64(bytes, 20, kMaxPayloadBytes + 1);
  EXPECT_NE(rejection(bytes).find("exceeds the limit"), std::string::npos) << rejection(bytes);
  // Within the bound but disagreeing with the dims: also rejected before reading the payload.
  auto lying = encode_frame(FrameKind::data, sample_frame());
  put_u64(lying, 20, 1000);
  EXPECT_NE(rejection(lying).find("payload length says 1000"), std::string::npos)
      << rejection(lying);
  // Huge dims whose product overflows.
  auto huge = encode_frame(FrameKind::data, sample_frame());
  put_u64(huge, kFrameHeaderBytes, std::uint64_t{1} << 62);
  EXPECT_NE(rejection(huge).find("more than the limit"), std::string::npos) << rejection(huge);
  // A per-connection limit below the global one (as for unauthenticated peers).
  const auto normal = encode_frame(FrameKind::data, sample_frame());
  EXPECT_THROW(decode_frame(normal, 8), StreamError);
}

TEST(StreamProtocol, RankTooLargeIsRejected) {
  auto bytes = encode_frame(FrameKind::data, sample_frame());
  bytes[10] = std::byte{9};
  EXPECT_NE(rejection(bytes).find("rank 9 exceeds"), std::string::npos) << rejection(bytes);
  Frame deep;
  deep.array = HostArray::zeros(DType::u8, std::vector<std::size_t>(9, 1));
  EXPECT_THROW(encode_frame(FrameKind::data, deep), StreamError);
}

TEST(StreamProtocol, OtherHeaderChecks) {
  auto version = encode_frame(FrameKind::data, sample_frame());
  version[4] = std::byte{2};
  EXPECT_NE(rejection(version).find("version 2"), std::string::npos);
  auto kind = encode_frame(FrameKind::data, sample_frame());
  kind[6] = std::byte{77};
  EXPECT_NE(rejection(kind).find("frame kind 77"), std::string::npos);
  auto dtype = encode_frame(FrameKind::data, sample_frame());
  dtype[7] = std::byte{0};
  EXPECT_NE(rejection(dtype).find("unknown dtype"), std::string::npos);
  auto truncated = encode_frame(FrameKind::data, sample_frame());
  ASSERT_FALSE(truncated.empty());
  truncated.pop_back();  // the last byte of the CRC missing
  EXPECT_NE(rejection(truncated).find("truncated"), std::string::npos);
}

}  // namespace
}  // namespace ipupod::host

// Fuzz test of the stream frame parser: valid frames mutated (bits flipped, truncated, spliced,
// header fields set to extreme numbers, with and without a fresh CRC so that the checks behind
// it are reached too) and random bytes. Every input either decodes to a frame that encodes back
// to the same bytes or is refused with a FrameError that says why; nothing else may happen.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "host/stream_protocol.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

using ipupod::fuzz::Bytes;
using ipupod::fuzz::pick;
using ipupod::fuzz::Rng;
using namespace ipupod::host;

std::vector<Bytes> valid_frames() {
  std::vector<Bytes> frames;
  const auto add = [&](FrameKind kind, std::uint16_t stream, std::uint64_t step, HostArray array) {
    frames.push_back(encode_frame(kind, Frame{stream, step, std::move(array)}));
  };
  add(FrameKind::hello, 0, 3, text_array("secret-of-the-job"));
  add(FrameKind::hello, 0, 0, text_array(""));
  add(FrameKind::data, 1, 7, HostArray::from_values<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  add(FrameKind::data, 2, 7, HostArray::from_values<std::int32_t>({4}, {0, -1, 9, 3}));
  add(FrameKind::data, 4, 1, HostArray::zeros(DType::f16, {1, 1, 1, 1, 1, 1, 1, 5}));
  add(FrameKind::data, 5, 2, HostArray::zeros(DType::u32, {}));
  add(FrameKind::data, 6, 2, HostArray::zeros(DType::u8, {0, 3}));
  add(FrameKind::credit, 0, 4, HostArray::zeros(DType::u8, {0}));
  add(FrameKind::close, 0, 0, text_array("the IPU failed"));
  return frames;
}

// A fresh CRC over everything before the trailer: the mutated header or payload then meets the
// checks behind the CRC's.
void recompute_crc(Bytes& frame) {
  if (frame.size() < kFrameTrailerBytes) return;
  const std::size_t body = frame.size() - kFrameTrailerBytes;
  const std::uint32_t crc = crc32c(std::span<const std::byte>(frame.data(), body));
  std::memcpy(frame.data() + body, &crc, sizeof crc);
}

// A header field (offsets of the wire format in stream_protocol.hpp) set to an extreme value.
void set_header_field(Bytes& frame, Rng& rng) {
  struct Field {
    std::size_t offset, width;
  };
  static const Field fields[] = {{0, 4},  {4, 2},  {6, 1},  {7, 1},  {8, 2},
                                 {10, 1}, {11, 1}, {12, 8}, {20, 8}, {28, 8}};
  const Field field = fields[pick(rng, std::size(fields))];
  std::size_t offset = field.offset;
  if (offset == 28) offset += 8 * pick(rng, 8);  // one of the dims
  const std::uint64_t value = ipupod::fuzz::extreme_u64(rng);
  for (std::size_t k = 0; k < field.width && offset + k < frame.size(); ++k)
    frame[offset + k] = std::byte{static_cast<unsigned char>(value >> (8 * k))};
}

Bytes fuzz_input(const std::vector<Bytes>& frames, Rng& rng) {
  const Bytes& base = frames[pick(rng, frames.size())];
  const Bytes& other = frames[pick(rng, frames.size())];
  Bytes input;
  switch (pick(rng, 5)) {
    case 0:  // random bytes, sometimes behind a valid magic and version
      input.resize(pick(rng, 96));
      for (auto& b : input) b = std::byte{static_cast<unsigned char>(rng())};
      if (input.size() >= 6 && pick(rng, 2) == 0) std::memcpy(input.data(), base.data(), 6);
      break;
    case 1:
    case 2:
      input = base;
      set_header_field(input, rng);
      if (pick(rng, 2) == 0) set_header_field(input, rng);
      break;
    default:
      input = ipupod::fuzz::mutate_bytes(base, other, rng);
      break;
  }
  if (pick(rng, 2) == 0) recompute_crc(input);
  return input;
}

// Decoded or refused, nothing else: a decoded frame is consistent and encodes to its input.
void check_one(const Bytes& input, std::uint64_t max_payload_bytes) {
  try {
    const WireFrame wire = decode_frame(input, max_payload_bytes);
    const HostArray& array = wire.frame.array;
    ASSERT_LE(array.shape.size(), kMaxFrameRank);
    ASSERT_EQ(array.bytes.size(), array.elements() * dtype_size(array.dtype));
    ASSERT_LE(array.bytes.size(), max_payload_bytes);
    EXPECT_TRUE(encode_frame(wire.kind, wire.frame) == input) << "a frame that does not round-trip";
  } catch (const FrameError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("rejected stream frame: ", 0), 0u) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a FrameError: " << e.what();
  }
}

TEST(FuzzStreamFrames, MutatedFramesDecodeExactlyOrAreRefusedWithAReason) {
  const std::vector<Bytes> frames = valid_frames();
  for (const Bytes& frame : frames) check_one(frame, kMaxPayloadBytes);  // the seeds themselves
  ipupod::fuzz::fuzz_loop("stream frames", 200000, 1000, [&](std::size_t, Rng& rng) {
    const Bytes input = fuzz_input(frames, rng);
    // Sometimes a receiver's own smaller bound (the hello frame's, a small stream's).
    const std::uint64_t bound = pick(rng, 4) == 0 ? pick(rng, 64) : kMaxPayloadBytes;
    check_one(input, bound);
  });
}

// read_frame as a connection calls it: the reader may fail at any point (the peer went away) and
// the payload buffer comes from a pool; the reader's StreamError passes through unchanged.
TEST(FuzzStreamFrames, ReaderFailuresAtAnyPointPassThrough) {
  const std::vector<Bytes> frames = valid_frames();
  ipupod::fuzz::fuzz_loop("stream reads", 50000, 0, [&](std::size_t, Rng& rng) {
    const Bytes input = fuzz_input(frames, rng);
    const std::size_t fail_after = pick(rng, input.size() + 8);
    std::size_t offset = 0;
    const ReadExact read = [&](std::span<std::byte> buffer) {
      if (offset + buffer.size() > fail_after || offset + buffer.size() > input.size())
        throw StreamError("peer went away");
      if (!buffer.empty()) std::memcpy(buffer.data(), input.data() + offset, buffer.size());
      offset += buffer.size();
    };
    std::size_t asked = 0;
    const PayloadBuffer pool = [&](std::size_t bytes) {
      asked = bytes;
      return std::vector<std::byte>(bytes);
    };
    try {
      const WireFrame wire = read_frame(read, kMaxPayloadBytes, pool);
      EXPECT_EQ(asked, wire.frame.array.bytes.size());
    } catch (const FrameError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("rejected stream frame: ", 0), 0u) << e.what();
    } catch (const StreamError& e) {
      EXPECT_EQ(std::string(e.what()), "peer went away");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a StreamError: " << e.what();
    }
    // Nothing beyond the bound is ever allocated for a payload.
    EXPECT_LE(asked, kMaxPayloadBytes);
  });
}

}  // namespace

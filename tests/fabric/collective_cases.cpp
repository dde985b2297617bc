// The shared collective test bodies: deterministic inputs, a serial reference in ring order,
// and cross-rank agreement checked through the collectives themselves.
#include "collective_cases.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

namespace ipupod::fabric::testing {
namespace {

std::uint64_t fnv1a(std::span<const std::byte> bytes) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (std::byte b : bytes) {
    hash ^= static_cast<std::uint64_t>(b);
    hash *= 1099511628211ULL;
  }
  return hash;
}

std::uint32_t mix(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// Every rank sends its hash to rank 0's value via broadcast and compares.
void expect_same_on_every_rank(Transport& t, std::uint64_t hash, const char* what) {
  std::uint64_t root_hash = hash;
  broadcast(t, std::as_writable_bytes(std::span(&root_hash, 1)), 0);
  EXPECT_EQ(hash, root_hash) << what << ": rank " << t.rank() << " differs from rank 0";
}

}  // namespace

float input_value(int rank, std::size_t i) {
  const std::uint32_t h = mix(static_cast<std::uint32_t>(i) * 2654435761U ^
                              mix(static_cast<std::uint32_t>(rank) + 0x9e3779b9U));
  const float unit = static_cast<float>(h & 0xFFFFFFU) / static_cast<float>(1U << 24);  // [0,1)
  const float scale = static_cast<float>(1U << ((h >> 24) % 12));
  return (unit * 2.0F - 1.0F) * scale;
}

std::vector<float> reference_all_reduce(int participants, std::size_t length, ReduceOp op) {
  std::vector<float> result(length);
  for (int chunk = 0; chunk < participants; ++chunk) {
    const RingChunk range = ring_chunk(length, participants, chunk);
    for (std::size_t i = range.begin; i < range.end; ++i) {
      float accumulator = input_value(chunk, i);
      for (int k = 1; k < participants; ++k) {
        const float next = input_value((chunk + k) % participants, i);
        accumulator = op == ReduceOp::max ? std::max(accumulator, next) : accumulator + next;
      }
      if (op == ReduceOp::mean) accumulator = accumulator / static_cast<float>(participants);
      result[i] = accumulator;
    }
  }
  return result;
}

void check_all_reduce(Transport& t, std::size_t length, ReduceOp op) {
  SCOPED_TRACE(::testing::Message() << "all_reduce " << to_string(op) << " length " << length
                                    << " on rank " << t.rank() << " of " << t.size());
  std::vector<float> data(length);
  for (std::size_t i = 0; i < length; ++i) data[i] = input_value(t.rank(), i);
  all_reduce(t, data, op);

  const std::vector<float> expected = reference_all_reduce(t.size(), length, op);
  const auto got_bytes = std::as_bytes(std::span(data));
  const auto expected_bytes = std::as_bytes(std::span(expected));
  const bool identical =
      std::equal(got_bytes.begin(), got_bytes.end(), expected_bytes.begin(), expected_bytes.end());
  if (!identical) {
    std::size_t first = 0;
    while (first < length && std::memcmp(&data[first], &expected[first], sizeof(float)) == 0) {
      ++first;
    }
    ADD_FAILURE() << "result differs from the ring-order reference, first at element " << first
                  << ": got " << data[first] << ", expected " << expected[first];
  }
  expect_same_on_every_rank(t, fnv1a(got_bytes), "all_reduce result hash");
}

void check_broadcast(Transport& t, int root) {
  root = root % t.size();
  for (std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    SCOPED_TRACE(::testing::Message() << "broadcast from root " << root << ", " << length
                                      << " bytes, on rank " << t.rank() << " of " << t.size());
    std::vector<std::byte> data(length);
    for (std::size_t i = 0; i < length; ++i) {
      const auto value = t.rank() == root ? mix(static_cast<std::uint32_t>(i)) : 0xEEU;
      data[i] = static_cast<std::byte>(value & 0xFFU);
    }
    broadcast(t, data, root);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < length; ++i) {
      if (data[i] != static_cast<std::byte>(mix(static_cast<std::uint32_t>(i)) & 0xFFU)) ++wrong;
    }
    EXPECT_EQ(wrong, 0U) << "bytes that differ from the root's";
  }
}

void check_barrier(Transport& t) {
  using Clock = std::chrono::system_clock;  // shared by every process of one machine
  const int late = t.size() - 1;
  for (int round = 0; round < 3; ++round) {
    std::int64_t late_entry_ns = 0;
    if (t.rank() == late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      late_entry_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
              .count();
    }
    barrier(t);
    const std::int64_t exit_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count();
    broadcast(t, std::as_writable_bytes(std::span(&late_entry_ns, 1)), late);
    EXPECT_GE(exit_ns, late_entry_ns) << "rank " << t.rank() << " left barrier round " << round
                                      << " before rank " << late << " entered it";
  }
}

}  // namespace ipupod::fabric::testing

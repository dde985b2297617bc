// The shared collective test bodies: deterministic inputs, a serial reference in the
// documented order, and cross-rank agreement checked through the collectives themselves.
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

// Every rank compares its hash with rank 0's (sent with broadcast).
void expect_same_on_every_rank(Transport& t, std::uint64_t hash, const char* what) {
  std::uint64_t root_hash = hash;
  broadcast(t, std::as_writable_bytes(std::span(&root_hash, 1)), 0);
  EXPECT_EQ(hash, root_hash) << what << ": rank " << t.rank() << " differs from rank 0";
}

float typed_input(int rank, std::size_t i, DataType type) {
  const float value = input_value(rank, i);
  return type == DataType::float16 ? float16::to_float(float16::to_half(value)) : value;
}

float apply(ReduceOp op, float partial, float value) {
  return op == ReduceOp::max ? std::max(partial, value) : partial + value;
}

// Folds block by block as the documented order says; `values[r]` is rank r's buffer, `ranges`
// the range each rank works on; the owner of each block keeps the folded value. `reversed`
// runs every ring anticlockwise (the second lane of bidirectional_ring).
void reduce_scatter_serially(std::vector<std::vector<float>>& values,
                             std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                             const Rings& rings, ReduceOp op, bool reversed) {
  for (const auto& forward : rings) {
    std::vector<int> ring = forward;
    const int m = static_cast<int>(ring.size());
    const auto [begin, end] = ranges[static_cast<std::size_t>(ring.front())];
    std::vector<std::pair<std::size_t, std::size_t>> blocks;
    for (int p = 0; p < m; ++p) {
      const RingChunk chunk = ring_chunk(end - begin, m, p);
      blocks.emplace_back(begin + chunk.begin, begin + chunk.end);
    }
    if (reversed) {
      // The anticlockwise ring lists ring[0], ring[m-1], ..., ring[1]; blocks stay with ranks.
      std::vector<int> turned;
      std::vector<std::pair<std::size_t, std::size_t>> turned_blocks;
      for (int p = 0; p < m; ++p) {
        turned.push_back(ring[static_cast<std::size_t>((m - p) % m)]);
        turned_blocks.push_back(blocks[static_cast<std::size_t>((m - p) % m)]);
      }
      ring = turned;
      blocks = turned_blocks;
    }
    for (int q = 0; q < m; ++q) {
      const auto [block_begin, block_end] = blocks[static_cast<std::size_t>(q)];
      for (std::size_t i = block_begin; i < block_end; ++i) {
        float partial =
            values[static_cast<std::size_t>(ring[static_cast<std::size_t>((q + 1) % m)])][i];
        for (int k = 2; k <= m; ++k) {
          partial = apply(
              op, partial,
              values[static_cast<std::size_t>(ring[static_cast<std::size_t>((q + k) % m)])][i]);
        }
        values[static_cast<std::size_t>(ring[static_cast<std::size_t>(q)])][i] = partial;
      }
    }
    for (int p = 0; p < m; ++p) {
      ranges[static_cast<std::size_t>(ring[static_cast<std::size_t>(p)])] =
          blocks[static_cast<std::size_t>(p)];
    }
  }
}

}  // namespace

float input_value(int rank, std::size_t i) {
  const std::uint32_t h = mix(static_cast<std::uint32_t>(i) * 2654435761U ^
                              mix(static_cast<std::uint32_t>(rank) + 0x9e3779b9U));
  const float unit = static_cast<float>(h & 0xFFFFFFU) / static_cast<float>(1U << 24);  // [0,1)
  const float scale = static_cast<float>(1U << ((h >> 24) % 12));
  return (unit * 2.0F - 1.0F) * scale;
}

std::vector<Rings> flat_plan(int participants) {
  std::vector<int> ring;
  for (int r = 0; r < participants; ++r) ring.push_back(r);
  return {Rings{ring}};
}

int lanes_of(Algorithm algorithm) {
  return algorithm == Algorithm::bidirectional_ring ? 2 : 1;
}

std::vector<float> reference_all_reduce(int participants, std::size_t length, ReduceOp op,
                                        DataType type, const std::vector<Rings>& stages,
                                        int lanes) {
  const auto n = static_cast<std::size_t>(participants);
  std::vector<float> result(length);
  const auto finish = [&](float value) {
    if (op == ReduceOp::mean) value = value / static_cast<float>(participants);
    return type == DataType::float16 ? float16::to_float(float16::to_half(value)) : value;
  };
  if (stages.size() == 1 && stages.front().size() == 1) {
    // One ring: fold each element straight from the inputs, without n copies of the buffer.
    const std::vector<int>& ring = stages.front().front();
    const int m = static_cast<int>(ring.size());
    for (int p = 0; p < m; ++p) {
      const RingChunk block = ring_chunk(length, m, p);
      const std::size_t middle = block.begin + block.size() / 2;
      for (std::size_t i = block.begin; i < block.end; ++i) {
        const int step = (lanes == 2 && i >= middle) ? -1 : 1;  // anticlockwise second halves
        const auto at = [&](int k) {
          return ring[static_cast<std::size_t>(((p + step * k) % m + m) % m)];
        };
        float partial = typed_input(at(1), i, type);
        for (int k = 2; k <= m; ++k) partial = apply(op, partial, typed_input(at(k), i, type));
        result[i] = finish(partial);
      }
    }
    return result;
  }
  // With two lanes the first half of every block goes clockwise, the second anticlockwise;
  // each lane is simulated on its own copy and its elements are taken from it.
  for (int lane = 0; lane < lanes; ++lane) {
    std::vector<std::vector<float>> values(n, std::vector<float>(length));
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < length; ++i)
        values[r][i] = typed_input(static_cast<int>(r), i, type);
    }
    std::vector<std::pair<std::size_t, std::size_t>> ranges(n, {0, length});
    // Which elements this lane owns: for two lanes, halves of the final stage-0 blocks.
    std::vector<bool> in_lane(length, lanes == 1);
    if (lanes == 2) {
      const std::vector<int>& ring = stages.front().front();
      const int m = static_cast<int>(ring.size());
      for (int p = 0; p < m; ++p) {
        const RingChunk chunk = ring_chunk(length, m, p);
        const std::size_t middle = chunk.begin + chunk.size() / 2;
        for (std::size_t i = chunk.begin; i < chunk.end; ++i)
          in_lane[i] = (i >= middle) == (lane == 1);
      }
    }
    for (const Rings& rings : stages) {
      reduce_scatter_serially(values, ranges, rings, op, lane == 1);
    }
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t i = ranges[r].first; i < ranges[r].second; ++i) {
        if (in_lane[i]) result[i] = finish(values[r][i]);
      }
    }
  }
  return result;
}

namespace {

template <typename T>
T from_float(float value) {
  if constexpr (std::is_same_v<T, float16::Half>) {
    return float16::to_half(value);
  } else {
    return value;
  }
}

template <typename T>
float as_float(T value) {
  if constexpr (std::is_same_v<T, float16::Half>) {
    return float16::to_float(value);
  } else {
    return value;
  }
}

template <typename T>
void expect_bitwise(std::span<const T> got, std::span<const float> expected_float,
                    const char* what) {
  std::vector<T> expected(expected_float.size());
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = from_float<T>(expected_float[i]);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &expected[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << " differs from the documented-order reference, first at element "
                    << i << " of " << got.size() << ": got " << as_float(got[i]) << ", expected "
                    << as_float(expected[i]);
      return;
    }
  }
}

template <typename T>
void all_reduce_case(Transport& t, std::size_t length, ReduceOp op, const CaseOptions& options) {
  std::vector<T> data(length);
  for (std::size_t i = 0; i < length; ++i) data[i] = from_float<T>(input_value(t.rank(), i));
  const CollectiveReport report = all_reduce(t, std::span<T>(data), op, options.collective);
  if (options.collective.algorithm != Algorithm::automatic) {
    EXPECT_EQ(report.algorithm, options.collective.algorithm);
  }
  const auto stages = options.stages.empty() ? flat_plan(t.size()) : options.stages;
  const std::vector<float> expected =
      reference_all_reduce(t.size(), length, op, options.type, stages, lanes_of(report.algorithm));
  expect_bitwise<T>(data, expected, "all_reduce");
  expect_same_on_every_rank(t, fnv1a(std::as_bytes(std::span(data))), "all_reduce result hash");
}

template <typename T>
void reduce_scatter_case(Transport& t, std::size_t length, ReduceOp op,
                         const CaseOptions& options) {
  std::vector<T> input(length);
  for (std::size_t i = 0; i < length; ++i) input[i] = from_float<T>(input_value(t.rank(), i));
  const RingChunk mine = ring_chunk(length, t.size(), t.rank());
  std::vector<T> block(mine.size());
  const CollectiveReport report =
      reduce_scatter(t, std::span<const T>(input), std::span<T>(block), op, options.collective);
  const std::vector<float> expected = reference_all_reduce(
      t.size(), length, op, options.type, flat_plan(t.size()), lanes_of(report.algorithm));
  expect_bitwise<T>(block, std::span(expected).subspan(mine.begin, mine.size()),
                    "reduce_scatter block");
}

template <typename T>
void all_gather_case(Transport& t, std::size_t length, const CaseOptions& options) {
  const RingChunk mine = ring_chunk(length, t.size(), t.rank());
  std::vector<T> block(mine.size());
  for (std::size_t i = 0; i < block.size(); ++i) {
    block[i] = from_float<T>(input_value(t.rank(), mine.begin + i));
  }
  std::vector<T> output(length, from_float<T>(-1.0F));
  all_gather(t, std::span<const T>(block), std::span<T>(output), options.collective);
  std::vector<float> expected(length);
  for (int r = 0; r < t.size(); ++r) {
    const RingChunk chunk = ring_chunk(length, t.size(), r);
    for (std::size_t i = chunk.begin; i < chunk.end; ++i) {
      expected[i] = as_float(from_float<T>(input_value(r, i)));
    }
  }
  expect_bitwise<T>(output, expected, "all_gather");
}

}  // namespace

void check_all_reduce(Transport& t, std::size_t length, ReduceOp op, const CaseOptions& options) {
  SCOPED_TRACE(::testing::Message()
               << "all_reduce " << to_string(op) << " " << to_string(options.type) << " "
               << to_string(options.collective.algorithm) << " length " << length << " segment "
               << options.collective.segment_bytes << " on rank " << t.rank() << " of "
               << t.size());
  if (options.type == DataType::float16) {
    all_reduce_case<float16::Half>(t, length, op, options);
  } else {
    all_reduce_case<float>(t, length, op, options);
  }
}

void check_reduce_scatter(Transport& t, std::size_t length, ReduceOp op,
                          const CaseOptions& options) {
  SCOPED_TRACE(::testing::Message()
               << "reduce_scatter " << to_string(op) << " " << to_string(options.type) << " "
               << to_string(options.collective.algorithm) << " length " << length << " on rank "
               << t.rank() << " of " << t.size());
  if (options.type == DataType::float16) {
    reduce_scatter_case<float16::Half>(t, length, op, options);
  } else {
    reduce_scatter_case<float>(t, length, op, options);
  }
}

void check_all_gather(Transport& t, std::size_t length, const CaseOptions& options) {
  SCOPED_TRACE(::testing::Message() << "all_gather " << to_string(options.type) << " "
                                    << to_string(options.collective.algorithm) << " length "
                                    << length << " on rank " << t.rank() << " of " << t.size());
  if (options.type == DataType::float16) {
    all_gather_case<float16::Half>(t, length, options);
  } else {
    all_gather_case<float>(t, length, options);
  }
}

void check_broadcast(Transport& t, int root, Algorithm algorithm) {
  root = root % t.size();
  CollectiveOptions options;
  options.algorithm = algorithm;
  options.segment_bytes = 4096;
  for (std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    SCOPED_TRACE(::testing::Message()
                 << "broadcast (" << to_string(algorithm) << ") from root " << root << ", "
                 << length << " bytes, on rank " << t.rank() << " of " << t.size());
    std::vector<std::byte> data(length);
    for (std::size_t i = 0; i < length; ++i) {
      const auto value = t.rank() == root ? mix(static_cast<std::uint32_t>(i)) : 0xEEU;
      data[i] = static_cast<std::byte>(value & 0xFFU);
    }
    const CollectiveReport report = broadcast(t, data, root, options);
    if (algorithm != Algorithm::automatic) {
      EXPECT_EQ(report.algorithm, algorithm);
    }
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

void check_every_collective(Transport& t, std::span<const std::size_t> lengths) {
  for (std::size_t length : lengths) {
    for (Algorithm algorithm : {Algorithm::ring, Algorithm::bidirectional_ring}) {
      for (DataType type : {DataType::float32, DataType::float16}) {
        CaseOptions options;
        options.type = type;
        options.collective.algorithm = algorithm;
        // Small segments: blocks of the longer lengths travel as many pipelined messages.
        options.collective.segment_bytes = 512;
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
          check_all_reduce(t, length, op, options);
        }
        check_reduce_scatter(t, length, ReduceOp::sum, options);
        check_reduce_scatter(t, length, ReduceOp::mean, options);
        check_all_gather(t, length, options);
      }
    }
  }
}

}  // namespace ipupod::fabric::testing

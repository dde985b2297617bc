// The host bytes the device graph keeps per vertex and per copy run: the budgets a full-size
// model's compile rests on (a compiling rank should hold about 2x the tile memory it models).
// Live heap bytes are counted by replacing the global operator new and delete of this program.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/engine.hpp"
#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace {
std::atomic<long long> live_bytes{0};
}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  live_bytes += static_cast<long long>(malloc_usable_size(p));
  return p;
}
// (std::stable_sort's buffer comes from the nothrow form: replaced too, so that the sanitizer
// sees every allocation freed by its own kind.)
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p != nullptr) live_bytes += static_cast<long long>(malloc_usable_size(p));
  return p;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  live_bytes -= static_cast<long long>(malloc_usable_size(p));
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  operator delete(p);
}

namespace ipupod::ipu {
namespace {

// 8 vertices on each of an MK2's 1472 tiles, each an Add of three 8-element regions with two
// parameters: 11,776 vertices, the shape of an elementwise op on a full-size activation.
TEST(HostMemory, AVertexCostsTensOfBytesNotKilobytes) {
  Graph g(ArchPreset::get("mk2"));
  constexpr std::size_t kPerTile = 8, kElements = 8;
  const std::size_t n = g.tiles() * kPerTile * kElements;
  Tensor a = g.add_variable(DType::f32, {n}, "a"), b = g.add_variable(DType::f32, {n}, "b"),
         out = g.add_variable(DType::f32, {n}, "out");
  for (const Tensor& t : {a, b, out}) g.map_linearly(t, kPerTile * kElements);
  const ComputeSetId cs = g.add_compute_set("add");
  const long long before = live_bytes;
  std::size_t vertices = 0;
  for (unsigned tile = 0; tile < g.tiles(); ++tile)
    for (std::size_t k = 0; k < kPerTile; ++k, ++vertices) {
      const std::size_t at = vertices * kElements;
      g.add_vertex(cs, Vertex{"Add",
                              tile,
                              {{a.slice(at, at + kElements)},
                               {b.slice(at, at + kElements)},
                               {out.slice(at, at + kElements)}},
                              {1.0, 2.0}});
    }
  g.shrink_to_fit();
  const double per_vertex =
      static_cast<double>(live_bytes - before) / static_cast<double>(vertices);
  // A 32-byte record, three 12-byte regions, three 4-byte field ends, two parameters: 96.
  EXPECT_LE(per_vertex, 112.0) << "host bytes per vertex of three regions and two parameters";
  EXPECT_EQ(g.compute_sets()[cs].vertices.size(), vertices);
}

// Vertices of one geometry on many tiles carry the same parameters: a compute set keeps each
// distinct list once (bitwise: 0.0 and -0.0 are two lists), and every vertex points at its own.
TEST(HostMemory, VerticesWithEqualParametersShareOneList) {
  Graph g(ArchPreset::get("tiny"));
  Tensor a = g.add_variable(DType::f32, {64}, "a"), out = g.add_variable(DType::f32, {64}, "out");
  for (const Tensor& t : {a, out}) g.set_tile_mapping(t, 0);
  const ComputeSetId cs = g.add_compute_set("scale");
  const std::vector<std::vector<double>> lists = {
      {1.0, 2.0}, {3.0, 4.0}, {1.0, 2.0}, {1.0, 2.0, 5.0}, {0.0}, {-0.0}, {3.0, 4.0}, {}};
  for (std::size_t i = 0; i < lists.size(); ++i)
    g.add_vertex(cs, Vertex{"Add",
                            0,
                            {{a.slice(8 * i, 8 * i + 8)},
                             {a.slice(8 * i, 8 * i + 8)},
                             {out.slice(8 * i, 8 * i + 8)}},
                            lists[i]});
  const ComputeSet& set = g.compute_sets()[cs];
  // Distinct lists: {1, 2}, {3, 4}, {1, 2, 5}, {0}, {-0}, {}: 2 + 2 + 3 + 1 + 1 doubles.
  EXPECT_EQ(set.params.size(), 9u);
  for (std::size_t i = 0; i < lists.size(); ++i) {
    const VertexRecord& v = set.vertices[i];
    ASSERT_EQ(v.params, lists[i].size()) << i;
    ASSERT_LE(v.first_param + v.params, set.params.size()) << i;
    for (std::size_t k = 0; k < lists[i].size(); ++k)
      EXPECT_EQ(std::bit_cast<std::uint64_t>(set.params[v.first_param + k]),
                std::bit_cast<std::uint64_t>(lists[i][k]))
          << "vertex " << i << " points at another list";
  }
  EXPECT_EQ(set.vertices[2].first_param, set.vertices[0].first_param);
  EXPECT_EQ(set.vertices[6].first_param, set.vertices[1].first_param);
  EXPECT_NE(set.vertices[4].first_param, set.vertices[5].first_param);
}

// A copy of many small pairs between two variables keeps one run per pair that neither
// continues the run before it nor repeats its shape at its strides (here pairs at irregular
// offsets), tens of bytes each; pairs at regular strides (every other element: a block of
// channel planes) make one run of many rows, and contiguous pairs one run of one row.
TEST(HostMemory, ACopyRunCostsTensOfBytesAndRegularPairsMerge) {
  Graph g(ArchPreset::get("tiny"));
  constexpr std::size_t kPairs = 20000;
  Tensor src = g.add_variable(DType::f32, {3 * kPairs}, "src"),
         dst = g.add_variable(DType::f32, {3 * kPairs}, "dst");
  Program irregular, strided, contiguous;
  std::vector<std::pair<Tensor, Tensor>> odd, every_other, runs;
  for (std::size_t i = 0; i < kPairs; ++i) {
    // Gaps of 2 and 3 elements in turn: no pair continues the one before, no stride repeats.
    const std::size_t at = 5 * (i / 2) + 2 * (i % 2);
    odd.emplace_back(src.slice(at, at + 1), dst.slice(at, at + 1));
    every_other.emplace_back(src.slice(2 * i, 2 * i + 1), dst.slice(3 * i, 3 * i + 1));
    runs.emplace_back(src.slice(i, i + 1), dst.slice(i, i + 1));
  }
  const long long before = live_bytes;
  irregular = Program::copy(odd);  // a copy of the pairs, freed on return
  const long long after = live_bytes;
  strided = Program::copy(std::move(every_other));
  contiguous = Program::copy(std::move(runs));
  EXPECT_GE(irregular.runs().size(), kPairs / 2);  // at most two pairs share a run
  const double per_run =
      static_cast<double>(after - before) / static_cast<double>(irregular.runs().size());
  // 36 bytes a run (32-bit offsets within a variable) and the program's own few bytes.
  EXPECT_LE(per_run, 40.0) << "host bytes per copy run";
  ASSERT_EQ(strided.runs().size(), 1u);
  EXPECT_EQ(strided.runs()[0].rows, kPairs);
  EXPECT_EQ(strided.runs()[0].elements, 1u);
  EXPECT_EQ(strided.runs()[0].src_stride, 2u);
  EXPECT_EQ(strided.runs()[0].dst_stride, 3u);
  ASSERT_EQ(contiguous.runs().size(), 1u);
  EXPECT_EQ(contiguous.runs()[0].elements, kPairs);
  EXPECT_EQ(contiguous.runs()[0].rows, 1u);
}

// A transpose across tiles: row k of dst gathers element k of every tile's block of src, one
// 4-byte piece from each of an MK2's 1472 tiles (the shape of a channel block gathered from
// channel planes that lie on many tiles). No two pieces share their tiles and strides, so each
// would be a 32-byte transfer; as gathers the engine's run table keeps 4 bytes a piece.
TEST(HostMemory, AnExchangePieceCostsBytesNotARecord) {
  Graph g(ArchPreset::get("mk2"));
  const std::size_t tiles = g.tiles();
  constexpr std::size_t kBlock = 128;
  const std::size_t n = tiles * kBlock;
  Tensor src = g.add_variable(DType::f32, {n}, "src"), dst = g.add_variable(DType::f32, {n}, "dst");
  g.map_linearly(src, kBlock);  // tile t: src[t * kBlock, (t + 1) * kBlock)
  g.map_linearly(dst, tiles);   // tile k: dst[k * tiles, (k + 1) * tiles), for k < kBlock
  g.set_host_access(src);
  g.set_host_access(dst);
  CopyRuns runs;
  for (std::size_t k = 0; k < kBlock; ++k)
    for (std::size_t t = 0; t < tiles; ++t)
      runs.add(src.slice(t * kBlock + k, t * kBlock + k + 1),
               dst.slice(k * tiles + t, k * tiles + t + 1));
  std::map<std::string, Program> programs{{"p", Program::copy(std::move(runs))}};
  const long long before = live_bytes;
  Engine e(g, std::move(programs));
  const double per_piece = static_cast<double>(live_bytes - before) / static_cast<double>(n);
  EXPECT_LE(per_piece, 8.0) << "the engine's host bytes per piece of an exchange";

  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
  e.write(src, std::as_bytes(std::span(values)));
  e.run("p");
  const auto bytes = e.read(dst);
  std::vector<float> got(n);
  std::memcpy(got.data(), bytes.data(), bytes.size());
  for (std::size_t k = 0; k < kBlock; ++k)
    for (std::size_t t = 0; t < tiles; ++t)
      ASSERT_EQ(got[k * tiles + t], values[t * kBlock + k]) << k << ", " << t;
}

}  // namespace
}  // namespace ipupod::ipu

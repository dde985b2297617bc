// The host bytes the device graph keeps per vertex and per copy run: the budgets a full-size
// model's compile rests on (a compiling rank should hold about 2x the tile memory it models).
// Live heap bytes are counted by replacing the global operator new and delete of this program.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

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
  EXPECT_LE(per_run, 56.0) << "host bytes per copy run";
  ASSERT_EQ(strided.runs().size(), 1u);
  EXPECT_EQ(strided.runs()[0].rows, kPairs);
  EXPECT_EQ(strided.runs()[0].elements, 1u);
  EXPECT_EQ(strided.runs()[0].src_stride, 2u);
  EXPECT_EQ(strided.runs()[0].dst_stride, 3u);
  ASSERT_EQ(contiguous.runs().size(), 1u);
  EXPECT_EQ(contiguous.runs()[0].elements, kPairs);
  EXPECT_EQ(contiguous.runs()[0].rows, 1u);
}

}  // namespace
}  // namespace ipupod::ipu

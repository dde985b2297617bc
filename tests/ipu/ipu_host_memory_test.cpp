// The host bytes the device graph keeps per vertex and per copy run: the budgets a full-size
// model's compile rests on (a compiling rank should hold about 2x the tile memory it models).
// Live heap bytes are counted by replacing the global operator new and delete of this program.
#include <gtest/gtest.h>
#include <malloc.h>

#include <array>
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
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
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

// A field's regions of one variable and one size at a constant distance (a channel's rows, a
// block's planes) take two entries in the graph and in the engine, however many there are;
// the codelet still sees every region, and an irregular one starts a new entry.
TEST(HostMemory, RegionsAtAConstantDistanceAreOneEntry) {
  Graph g(ArchPreset::get("tiny"));
  constexpr std::size_t kPerTile = 32, kRows = 32, kRow = 4, kPitch = 8;
  const std::size_t kVertices = kPerTile * g.tiles();
  constexpr std::size_t kX = kRows * kPitch;  // per vertex: 32 rows of 4 of every 8 elements
  Tensor x = g.add_variable(DType::f32, {kVertices * kX}, "x");
  Tensor out = g.add_variable(DType::f32, {kVertices * kRow}, "out");
  g.map_linearly(x, kPerTile * kX);  // vertex v's data on tile v / kPerTile
  g.map_linearly(out, kPerTile * kRow);
  for (const Tensor& t : {x, out}) g.set_host_access(t);
  const ComputeSetId cs = g.add_compute_set("sum");
  for (std::size_t v = 0; v < kVertices; ++v) {
    std::vector<Tensor> rows;
    std::vector<double> params = {1.0};  // scale, then each region's offset in out
    for (std::size_t r = 0; r < kRows; ++r) {
      rows.push_back(x.slice(v * kX + r * kPitch, v * kX + r * kPitch + kRow));
      params.push_back(0.0);
    }
    rows.push_back(x.slice(v * kX + 1, v * kX + 3));  // another size: its own entry
    params.push_back(1.0);
    g.add_vertex(cs, Vertex{"SumRegions",
                            static_cast<unsigned>(v / kPerTile),
                            {rows, {out.slice(v * kRow, (v + 1) * kRow)}},
                            params});
  }
  g.shrink_to_fit();
  const ComputeSet& set = g.compute_sets()[cs];
  // Per vertex: the rows (2 entries), the odd region (1), the output (1).
  EXPECT_EQ(set.entries.size(), kVertices * 4);
  EXPECT_EQ(set.region_count, kVertices * (kRows + 2));
  std::vector<FieldRegion> seen;
  set.for_each_region(set.vertices[5], 0, [&](const FieldRegion& r) { seen.push_back(r); });
  ASSERT_EQ(seen.size(), kRows + 1);
  for (std::size_t r = 0; r < kRows; ++r) {
    EXPECT_EQ(seen[r].offset, 5 * kX + r * kPitch) << r;
    EXPECT_EQ(seen[r].elements, kRow) << r;
  }
  EXPECT_EQ(seen[kRows].offset, 5 * kX + 1);
  EXPECT_EQ(seen[kRows].elements, 2u);

  std::map<std::string, Program> programs{{"p", Program::execute(cs)}};
  const long long before = live_bytes;
  Engine e(g, std::move(programs));
  // 4 entries of 8 bytes, 2 field ends, a vertex's run record, its place in the tile's list:
  // ~76 bytes for 34 regions (8 bytes each without repeats: 272 for the regions alone).
  const double per_vertex =
      static_cast<double>(live_bytes - before) / static_cast<double>(kVertices);
  EXPECT_LE(per_vertex, 120.0) << "the engine's host bytes per vertex of 34 regions";

  std::vector<float> values(kVertices * kX);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) * 0.25f;
  e.write(x, std::as_bytes(std::span(values)));
  e.run("p");
  const auto bytes = e.read(out);
  std::vector<float> got(kVertices * kRow);
  std::memcpy(got.data(), bytes.data(), bytes.size());
  for (std::size_t v = 0; v < kVertices; ++v)
    for (std::size_t j = 0; j < kRow; ++j) {
      float want = 0.f;
      for (std::size_t r = 0; r < kRows; ++r) want += values[v * kX + r * kPitch + j];
      if (j == 1 || j == 2) want += values[v * kX + j];
      ASSERT_EQ(got[v * kRow + j], want) << v << ", " << j;
    }
}

// Parameters are kept as 16-bit integers while every value is one, as float32 while every
// value is one, and widen, bit for bit, from the first that is not.
TEST(HostMemory, ParametersTakeTheNarrowestWidthThatHoldsThemAll) {
  ParamTable t;
  const std::vector<double> small = {0.0, 7.0, 65535.0};
  t.append(small);
  EXPECT_EQ(t.width(), ParamTable::Width::u16);
  EXPECT_LT(t.bytes(), 3 * sizeof(float));
  EXPECT_TRUE(t.holds(0, small));
  const std::vector<double> exact = {1.0, -0.0, 3.5, 65536.0}, inexact = {0.1};
  t.append(exact);
  EXPECT_EQ(t.width(), ParamTable::Width::f32);
  ASSERT_EQ(t.size(), 7u);
  EXPECT_TRUE(t.holds(0, small));
  EXPECT_TRUE(t.holds(3, exact));
  EXPECT_FALSE(t.holds(3, std::vector<double>{1.0, 0.0}));  // -0.0 is not 0.0
  t.append(inexact);
  EXPECT_EQ(t.width(), ParamTable::Width::f64);
  ASSERT_EQ(t.size(), 8u);
  EXPECT_TRUE(t.holds(0, small));
  EXPECT_TRUE(t.holds(3, exact));
  for (double x : {-1.0, 65536.0, 2.5}) {  // each needs more than 16 bits
    ParamTable one;
    one.append(std::vector<double>{x});
    EXPECT_EQ(one.width(), ParamTable::Width::f32) << x;
  }
  EXPECT_EQ(std::bit_cast<std::uint64_t>(t[7]), std::bit_cast<std::uint64_t>(0.1));
}

// A training rank's engine (ReleaseGraphTables) frees the graph's vertex tables, the programs'
// copy runs and the tile mappings the host cannot use; the host still reads and writes what it
// may, and it runs alike.
TEST(HostMemory, ATrainingEngineKeepsOnlyTheMappingsTheHostUses) {
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {256}, "x"), tmp = g.add_variable(DType::f32, {256}, "tmp");
  Tensor out = g.add_variable(DType::f32, {256}, "out");
  for (const Tensor& t : {x, tmp, out}) g.map_linearly(t, 8);
  g.set_host_access(x);
  g.set_host_access(out);
  const auto add = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
    const ComputeSetId cs = g.add_compute_set("add");
    for (unsigned tile = 0; tile < g.tiles(); ++tile)
      g.add_vertex(cs, Vertex{"Add",
                              tile,
                              {{a.slice(8 * tile, 8 * tile + 8)},
                               {b.slice(8 * tile, 8 * tile + 8)},
                               {c.slice(8 * tile, 8 * tile + 8)}},
                              {1.0, 1.0}});
    return Program::execute(cs);
  };
  // tmp = 2x, then tmp moved a quarter of the way round (a copy through a second variable).
  Tensor moved = g.add_variable(DType::f32, {256}, "moved");
  g.map_linearly(moved, 8);
  CopyRuns rotate;
  rotate.add(tmp.slice(0, 192), moved.slice(64, 256));
  rotate.add(tmp.slice(192, 256), moved.slice(0, 64));
  const Program copy = Program::copy(std::move(rotate));
  ASSERT_FALSE(copy.runs().empty());
  Program p = Program::sequence({add(x, x, tmp), copy, add(moved, x, out)});
  Engine e(g, {{"p", p}}, EngineOptions{}, Engine::ReleaseGraphTables{});
  EXPECT_TRUE(copy.runs().empty());
  EXPECT_FALSE(g.variable(x.variable()).mapping.empty());
  EXPECT_FALSE(g.variable(out.variable()).mapping.empty());
  EXPECT_TRUE(g.variable(tmp.variable()).mapping.empty());
  EXPECT_TRUE(g.variable(moved.variable()).mapping.empty());
  EXPECT_TRUE(g.compute_sets()[0].vertices.empty());
  std::vector<float> values(256);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  for (int run = 0; run < 2; ++run) {
    e.write_values(x, values);
    e.run("p");
    const std::vector<float> got = e.read_values(out);
    for (std::size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(got[i], 2.f * values[(i + 192) % 256] + values[i]) << i;
  }
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

// Every vertex of `codelet` keeps only its own parameters (check(v) looks at each), and each
// compute set holding them keeps one head of `head_length` values and each vertex's own values
// at most once. Returns how many such vertices there are.
template <class Check>
std::size_t expect_one_head_per_compute_set(const Graph& g, const Codelet& codelet,
                                            std::size_t head_length, Check&& check) {
  std::size_t vertices = 0;
  for (const ComputeSet& set : g.compute_sets()) {
    std::size_t own = 0, here = 0;
    for (const VertexRecord& v : set.vertices) {
      if (v.codelet != codelet.index) continue;
      ++here;
      EXPECT_EQ(v.flags & VertexRecord::kHeaded, VertexRecord::kHeaded);
      check(v);
      own += v.params;
    }
    if (here == 0) continue;
    EXPECT_EQ(set.heads.size(), 1u);
    if (set.heads.empty()) continue;
    EXPECT_EQ(set.heads[0].length, head_length) << set.name;
    EXPECT_LE(set.params.size(), own + head_length)
        << "the head is kept once, each vertex's own parameters at most once";
    vertices += here;
  }
  return vertices;
}

// A convolution's vertices open their parameters with its geometry (15 values): the compute set
// keeps it once, and each vertex only what is its own; the engine gives the codelet the whole
// list again (the convolution tests check the values).
TEST(HostMemory, AConvolutionKeepsItsGeometryOncePerComputeSet) {
  Graph g(ArchPreset::get("mk2"));
  Tensor x = g.add_variable(DType::f32, {2, 16, 32, 32}, "x");
  Tensor w = g.add_variable(DType::f32, {32, 16, 3, 3}, "w");
  g.map_linearly(x, 32 * 32);
  g.map_linearly(w, 16 * 9);
  Program prog;
  ops::conv2d(g, prog, x, w,
              ops::ConvParams{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1},
              "conv");
  const auto& registry = CodeletRegistry::builtin();
  const Codelet& forward = registry.get("ConvForward");
  ASSERT_EQ(forward.shared_params, 15u);
  EXPECT_GT(expect_one_head_per_compute_set(g, forward, 15, [](const VertexRecord&) {}), 100u);
}

// A map's vertices (a broadcast add of [8, 64, 64] and [64, 1] spread over an MK2) share its
// geometry (op, scale, rank, window, shape, strides: the values after the piece begin and the
// offsets): the compute set keeps it once, each vertex keeps its piece begin and offsets (and
// its slices' steps), and the result is right.
TEST(HostMemory, AMapKeepsItsShapeAndStridesOncePerComputeSet) {
  Graph g(ArchPreset::get("mk2"));
  Tensor a = g.add_variable(DType::f32, {8, 64, 64}, "a");
  Tensor b = g.add_variable(DType::f32, {64, 1}, "b");
  g.map_linearly(a, 64);
  g.set_tile_mapping(b, 5);
  Program prog;
  Tensor c = ops::binary(g, prog, ops::BinaryOp::add, a, b, "add");
  const Codelet& map = CodeletRegistry::builtin().get("MapAffineBinary");
  ASSERT_EQ(map.shared_params, Codelet::kSharedToEnd);
  // Own: piece begin, two offsets, and per further slice three values (or three steps). The
  // head: op .. window (7), the shape and a's and b's strides (3 each).
  const std::size_t vertices = expect_one_head_per_compute_set(
      g, map, 7 + 3 * 3,
      [](const VertexRecord& v) { EXPECT_LE(v.params, 3u + 3u * (v.slices - 1)); });
  EXPECT_GT(vertices, 100u);
  for (const Tensor& t : {a, b, c}) g.set_host_access(t);
  Engine e(g, {{"p", prog}});
  std::vector<float> av(a.elements()), bv(64);
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = static_cast<float>(i % 1000) * 0.25f;
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<float>(i) * 3.f;
  e.write_values(a, av);
  e.write_values(b, bv);
  e.run("p");
  const std::vector<float> got = e.read_values(c);
  for (std::size_t i = 0; i < av.size(); ++i) ASSERT_EQ(got[i], av[i] + bv[i / 64 % 64]) << i;
}

// A step's run table says where each tile's vertices start in 16 bits while it holds fewer than
// 2^16 of them, else in 32: compute sets of 1,000 and of 70,000 one-element vertices on every
// tile run right either way.
TEST(HostMemory, StepsOfMoreThan65535VerticesRunRight) {
  Graph g(ArchPreset::get("tiny"));
  for (const std::size_t n : {std::size_t{1000}, std::size_t{70000}}) {
    Tensor x = g.add_variable(DType::f32, {n}, "x"), y = g.add_variable(DType::f32, {n}, "y");
    g.map_linearly(x, 1);
    g.map_linearly(y, 1);
    const ComputeSetId cs = g.add_compute_set("scaled");
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned tile = g.tile_mapping(y.slice(i, i + 1)).at(0).tile;
      g.add_vertex(cs, Vertex{"ScaledAddInPlace",
                              tile,
                              {{y.slice(i, i + 1)}, {x.slice(i, i + 1)}},
                              {static_cast<double>(i % 3)}});
    }
    for (const Tensor& t : {x, y}) g.set_host_access(t);
    Engine e(g, {{"p", Program::execute(cs)}});
    std::vector<float> xs(n);
    for (std::size_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i % 977);
    e.write_values(x, xs);
    e.write_values(y, std::vector<float>(n, 1.f));
    e.run("p");
    const std::vector<float> got = e.read_values(y);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(got[i], 1.f + static_cast<float>(i % 3) * xs[i]) << n << ", " << i;
  }
}

// Three float32 variables x, y, z of n elements on tile 0, which the host reads and writes.
std::array<Tensor, 3> host_variables_on_tile_0(Graph& g, std::size_t n) {
  std::array<Tensor, 3> t = {g.add_variable(DType::f32, {n}, "x"),
                             g.add_variable(DType::f32, {n}, "y"),
                             g.add_variable(DType::f32, {n}, "z")};
  for (const Tensor& v : t) {
    g.set_tile_mapping(v, 0);
    g.set_host_access(v);
  }
  return t;
}

// Two maps of different rank in one compute set: the first one's geometry is the head, the
// second (a longer list) keeps its whole list, and both run right.
TEST(HostMemory, AMapOfAnotherRankInTheSameComputeSetKeepsItsWholeList) {
  Graph g(ArchPreset::get("tiny"));
  const auto [x, y, z] = host_variables_on_tile_0(g, 24);
  const ComputeSetId cs = g.add_compute_set("maps");
  // y = 2 * x as a rank-1 map of 24; z = 3 * x^T as a rank-2 map of [4, 6] reading x as [6, 4]
  // (strides 1, 4): piece begin, offsets, op (copy scaled), scale, inputs, rank, window axis
  // (none: the rank), window, shape, strides.
  g.add_vertex(cs, Vertex{"MapAffine", 0, {{x}, {y}}, {0, 0, 0, 0, 2, 1, 1, 1, 0, 0, 24, 1}});
  g.add_vertex(cs, Vertex{"MapAffine", 0, {{x}, {z}}, {0, 0, 0, 0, 3, 1, 2, 2, 0, 0, 4, 6, 1, 4}});
  const ComputeSet& set = g.compute_sets()[cs];
  ASSERT_EQ(set.heads.size(), 1u);
  EXPECT_EQ(set.heads[0].length, 9u);
  EXPECT_EQ(set.vertices[0].flags & VertexRecord::kHeaded, VertexRecord::kHeaded);
  EXPECT_EQ(set.vertices[0].params, 3u);
  EXPECT_EQ(set.vertices[1].flags & VertexRecord::kHeaded, 0);
  EXPECT_EQ(set.vertices[1].params, 14u);
  Engine e(g, {{"p", Program::execute(cs)}});
  std::vector<float> xs(24);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i) + 0.25f;
  e.write_values(x, xs);
  e.run("p");
  const std::vector<float> ys = e.read_values(y), zs = e.read_values(z);
  for (std::size_t i = 0; i < 24; ++i) ASSERT_EQ(ys[i], 2.f * xs[i]) << i;
  for (std::size_t r = 0; r < 4; ++r)
    for (std::size_t c = 0; c < 6; ++c) ASSERT_EQ(zs[r * 6 + c], 3.f * xs[c * 4 + r]) << r << c;
}

// A vertex whose head differs from the one its compute set keeps for the codelet keeps its
// whole list, and the engine runs both alike, with the parameters as 16-bit integers, as
// float32 once another codelet's 0.5 comes, and as float64 once its 0.1 comes.
TEST(HostMemory, AVertexWithAnotherHeadKeepsItsWholeList) {
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {64}, "x"), w = g.add_variable(DType::f32, {64}, "w");
  Tensor y = g.add_variable(DType::f32, {64}, "y");
  for (const Tensor& t : {x, w, y}) g.set_tile_mapping(t, 0);
  const ComputeSetId cs = g.add_compute_set("conv");
  // 1x1 convolutions of one 4x4 plane: h w oh ow kh kw sh sw dh dw pt pl cig cog half, then
  // local channels, local rows, first row, channels per group, output rows, and per output
  // region batch, weight offset, first input channel.
  const auto params = [](double h) {
    return std::vector<double>{h, 4, h, 4, 1, 1, 1, 1, 1, 1, 0, 0,
                               1, 1, 0, 1, h, 0, 1, 0, h, 0, 0, 0};
  };
  g.add_vertex(
      cs,
      Vertex{"ConvForward", 0, {{x.slice(0, 16)}, {w.slice(0, 1)}, {y.slice(0, 16)}}, params(4)});
  g.add_vertex(
      cs,
      Vertex{"ConvForward", 0, {{x.slice(16, 24)}, {w.slice(1, 2)}, {y.slice(16, 24)}}, params(2)});
  const ComputeSet& set = g.compute_sets()[cs];
  EXPECT_EQ(set.vertices[0].flags & VertexRecord::kHeaded, VertexRecord::kHeaded);
  EXPECT_EQ(set.vertices[0].params, params(4).size() - 15);
  EXPECT_EQ(set.vertices[1].flags & VertexRecord::kHeaded, 0);
  EXPECT_EQ(set.vertices[1].params, params(2).size());
  for (const Tensor& t : {x, w, y}) g.set_host_access(t);
  std::vector<float> xs(64), ws(64, 0.f);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i);
  ws[0] = 2.f, ws[1] = 3.f;
  std::vector<double> scales;  // of the ScaledAddInPlace vertices, each on 8 more of y
  const auto run = [&] {
    Engine e(g, {{"p", Program::execute(cs)}});
    e.write_values(x, xs);
    e.write_values(w, ws);
    e.write_values(y, std::vector<float>(64, 0.f));
    e.run("p");
    const std::vector<float> got = e.read_values(y);
    for (std::size_t i = 0; i < 16; ++i) ASSERT_EQ(got[i], 2.f * xs[i]) << i;
    for (std::size_t i = 16; i < 24; ++i) ASSERT_EQ(got[i], 3.f * xs[i]) << i;
    for (std::size_t k = 0; k < scales.size(); ++k)
      for (std::size_t i = 0; i < 8; ++i)
        ASSERT_EQ(got[32 + 8 * k + i], static_cast<float>(scales[k]) * xs[i]) << k << ", " << i;
  };
  ASSERT_EQ(set.params.width(), ParamTable::Width::u16);
  run();
  for (const double scale : {0.5, 0.1}) {  // a float32 value, then one that is not
    g.add_vertex(
        cs, Vertex{"ScaledAddInPlace",
                   0,
                   {{y.slice(32 + 8 * scales.size(), 40 + 8 * scales.size())}, {x.slice(0, 8)}},
                   {scale}});
    scales.push_back(scale);
    ASSERT_EQ(set.params.width(), scale == 0.5 ? ParamTable::Width::f32 : ParamTable::Width::f64);
    run();
  }
}

// A reduction's first step does one vertex per tile, a worker slice per piece of x there (a
// MultiVertex), however many separate pieces of x the tile holds; the sum is right.
TEST(HostMemory, AReductionKeepsOneVertexPerTile) {
  Graph g(ArchPreset::get("tiny"));
  constexpr std::size_t kRows = 64, kCols = 48;
  Tensor x = g.add_variable(DType::f32, {kRows, kCols}, "x");
  for (std::size_t i = 0; i < kRows * kCols / 16; ++i)  // 192 intervals, round the tiles
    g.set_tile_mapping(x.flatten().slice(16 * i, 16 * (i + 1)),
                       static_cast<unsigned>(i % g.tiles()));
  g.set_host_access(x);
  Program prog;
  Tensor sum = ops::reduce_sum(g, prog, x, {0}, false, 1.f, "sum");
  g.set_host_access(sum);
  const Codelet& partial = CodeletRegistry::builtin().get("ReducePartial");
  std::size_t slices = 0;
  for (const ComputeSet& set : g.compute_sets()) {
    std::vector<int> on_tile(g.tiles(), 0);
    for (const VertexRecord& v : set.vertices) {
      if (v.codelet != partial.index) continue;
      EXPECT_EQ(++on_tile[v.tile], 1) << "tile " << v.tile << " has two ReducePartial vertices";
      slices += v.slices;
    }
  }
  EXPECT_GE(slices, kRows * kCols / 16) << "a worker slice per piece";
  Engine e(g, {{"p", prog}});
  std::vector<float> xs(kRows * kCols);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(i % 7) * 0.1f + static_cast<float>(i % 5) * 0.013f;
  e.write_values(x, xs);
  e.run("p");
  const std::vector<float> got = e.read_values(sum);
  // Each piece holds a third of one row: its partial is its values, and a column's sum adds
  // the partials in element order (row by row), bit for bit.
  for (std::size_t c = 0; c < kCols; ++c) {
    float expect = 0.f;
    for (std::size_t r = 0; r < kRows; ++r) expect += xs[r * kCols + c];
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[c]), std::bit_cast<std::uint32_t>(expect)) << c;
  }
}

// A MultiVertex whose worker slices' parameters step evenly (pieces one after another) keeps
// slice 0's values and one step per slice parameter; one whose pieces do not keeps every
// slice's values. The engine gives each slice its own values either way.
TEST(HostMemory, AMultiVertexWithEvenlySteppingSlicesKeepsOnlyTheSteps) {
  Graph g(ArchPreset::get("tiny"));
  const auto [x, y, z] = host_variables_on_tile_0(g, 48);
  // MapAffine, out = 2 * in[piece begin + i]: piece begin, offset of in, 0, op (copy scaled),
  // scale, inputs, rank, window axis (none), window, shape, stride; then per further slice its
  // piece begin and offset.
  const auto map_vertex = [&](const Tensor& out, const std::vector<std::size_t>& begins) {
    Vertex v{"MapAffine", 0, {{}, {}}, {0, 0, 0, 0, 2, 1, 1, 1, 0, 0, 48, 1}};
    v.slices = begins.size();
    for (std::size_t k = 0; k < begins.size(); ++k) {
      v.fields[0].push_back(x);
      v.fields[1].push_back(out.slice(begins[k], begins[k] + 12));
      if (k == 0) {
        v.params[0] = static_cast<double>(begins[k]);
      } else {
        v.params.push_back(static_cast<double>(begins[k]));
        v.params.push_back(0);
      }
    }
    const ComputeSetId cs = g.add_compute_set("map");
    g.add_vertex(cs, v);
    return cs;
  };
  const ComputeSetId even = map_vertex(y, {0, 12, 24, 36}), uneven = map_vertex(z, {0, 12, 36});
  const VertexRecord& stepped = g.compute_sets()[even].vertices[0];
  EXPECT_EQ(stepped.flags & VertexRecord::kStepped, VertexRecord::kStepped);
  // The map's geometry (9 values after the piece begin and the offsets) is its compute set's
  // head; the vertex keeps slice 0's piece begin and offsets, and a step per slice parameter.
  EXPECT_EQ(stepped.flags & VertexRecord::kHeaded, VertexRecord::kHeaded);
  EXPECT_EQ(stepped.params, 3u + 2u) << "slice 0's own values and a step per slice parameter";
  EXPECT_EQ(g.compute_sets()[even].heads.at(0).length, 9u);
  const VertexRecord& listed = g.compute_sets()[uneven].vertices[0];
  EXPECT_EQ(listed.flags & VertexRecord::kStepped, 0);
  EXPECT_EQ(listed.params, 3u + 2u * 2u);

  Program p = Program::sequence({Program::execute(even), Program::execute(uneven)});
  Engine e(g, {{"p", p}});
  std::vector<float> values(48), zeros(48, 0.f);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) + 0.5f;
  e.write_values(x, values);
  e.write_values(z, zeros);
  e.run("p");
  const std::vector<float> got_y = e.read_values(y), got_z = e.read_values(z);
  for (std::size_t i = 0; i < 48; ++i) {
    ASSERT_EQ(got_y[i], 2.f * values[i]) << i;
    ASSERT_EQ(got_z[i], i >= 24 && i < 36 ? 0.f : 2.f * values[i]) << i;
  }
}

}  // namespace
}  // namespace ipupod::ipu

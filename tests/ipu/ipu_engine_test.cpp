// The device's rules: tile memory limits, tile locality of vertices, and the cycle model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <tuple>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "ipu_process/ops/tensor_ops.hpp"

namespace ipupod::ipu {
namespace {

const ArchPreset& tiny() {
  return ArchPreset::get("tiny");
}

TEST(TileMemory, FitsExactlyAtCapacityAndFailsOneByteOver) {
  {
    Graph g(tiny());
    Tensor t = g.add_variable(DType::u8, {tiny().bytes_per_tile}, "exact");
    g.set_tile_mapping(t, 3);
    Engine e(g, {});
    EXPECT_EQ(e.memory().tiles[3].total(), tiny().bytes_per_tile);
    EXPECT_EQ(e.memory().tiles_over(), 0u);
  }
  Graph g(tiny());
  Tensor t = g.add_variable(DType::u8, {tiny().bytes_per_tile + 1}, "one_too_many",
                            MemoryCategory::weight);
  g.set_tile_mapping(t, 3);
  try {
    Engine e(g, {});
    FAIL() << "expected an out-of-memory error";
  } catch (const OutOfMemoryError& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("Out of memory: Cannot fit all variable data onto one or more tiles"),
              std::string::npos);
    EXPECT_NE(msg.find("tile 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("+1 B over"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'one_too_many'"), std::string::npos) << msg;
    EXPECT_EQ(err.report().tiles_over(), 1u);
  }
}

TEST(TileMemory, AllowOutOfMemoryFinishesAndReports) {
  Graph g(tiny());
  Tensor t = g.add_variable(DType::f32, {tiny().bytes_per_tile}, "big");  // 4x a tile
  g.map_linearly(t, 1, 0, 2);
  g.set_host_access(t);
  Engine e(g, {}, {.allow_out_of_memory = true});
  EXPECT_EQ(e.memory().tiles_over(), 2u);
  EXPECT_EQ(e.memory().tiles[0].not_always_live, 2 * tiny().bytes_per_tile);
  EXPECT_THROW(e.run("none"), std::logic_error);
  // No tile memory backs a graph that does not fit: the host cannot write or read it either.
  std::vector<float> values(t.elements(), 1.0f);
  EXPECT_THROW(e.write_values(t, values), std::logic_error);
  EXPECT_THROW(e.read(t), std::logic_error);
}

// An engine built to plan only (what `ipupod compile` builds) lays memory out exactly as one
// that can run, makes the same checks, and refuses to run or to touch tile memory.
TEST(TileMemory, APlanHasTheRunnableEnginesMemoryAndCannotRun) {
  Graph g(tiny());
  Tensor a = g.add_variable(DType::f32, {64, 48}, "a"),
         b = g.add_variable(DType::f32, {48, 40}, "b");
  g.map_linearly(a);
  g.map_linearly(b);
  g.set_host_access(a);
  Program p;
  ops::matmul(g, p, a, b, false, false, "ab");
  const Engine runnable(g, {{"p", p}}), plan(g, {{"p", p}}, {.executable = false});
  ASSERT_EQ(plan.memory().tiles.size(), runnable.memory().tiles.size());
  for (std::size_t t = 0; t < plan.memory().tiles.size(); ++t) {
    EXPECT_EQ(plan.memory().tiles[t].total(), runnable.memory().tiles[t].total()) << "tile " << t;
    EXPECT_EQ(plan.memory().tiles[t].peak_live, runnable.memory().tiles[t].peak_live);
  }
  Engine planned(g, {{"p", p}}, {.executable = false});
  EXPECT_THROW(planned.run("p"), std::logic_error);
  EXPECT_THROW(planned.read(a), std::logic_error);
  // The tile checks still apply: a vertex reading another tile's memory is refused.
  Graph bad(tiny());
  Tensor x = bad.add_variable(DType::f32, {8}, "x"), y = bad.add_variable(DType::f32, {8}, "y");
  bad.set_tile_mapping(x, 0);
  bad.set_tile_mapping(y, 1);
  const ComputeSetId cs = bad.add_compute_set("cross");
  bad.add_vertex(cs, {"Add", 0, {{x}, {y}, {x}}, {1.0, 1.0}});
  EXPECT_THROW(Engine(bad, {{"p", Program::execute(cs)}}, {.executable = false}), std::logic_error);
}

// A graph that drops its vertices' parameters (what `ipupod compile` lowers) plans to the same
// memory as one that keeps them; an engine that could run refuses it.
TEST(TileMemory, AGraphWithoutVertexParametersPlansTheSameAndCannotRun) {
  const auto build = [](Graph& g) {
    Tensor a = g.add_variable(DType::f32, {64, 48}, "a"),
           b = g.add_variable(DType::f32, {48, 40}, "b");
    g.map_linearly(a);
    g.map_linearly(b);
    Program p;
    ops::matmul(g, p, a, b, false, false, "ab");
    return p;
  };
  Graph kept(tiny()), dropped(tiny());
  dropped.drop_vertex_params();
  const Program pk = build(kept), pd = build(dropped);
  std::size_t params = 0;
  for (const auto& cs : dropped.compute_sets()) params += cs.params.size();
  EXPECT_EQ(params, 0u);
  const Engine a(kept, {{"p", pk}}, {.executable = false}),
      b(dropped, {{"p", pd}}, {.executable = false});
  for (std::size_t t = 0; t < a.memory().tiles.size(); ++t)
    EXPECT_EQ(a.memory().tiles[t].total(), b.memory().tiles[t].total()) << "tile " << t;
  EXPECT_THROW(Engine(dropped, {{"p", pd}}), std::logic_error);
}

TEST(TileMemory, AlwaysLiveCountedApartFromNotAlwaysLive) {
  Graph g(tiny());
  Tensor w = g.add_variable(DType::f32, {100}, "w", MemoryCategory::weight);
  Tensor a = g.add_variable(DType::f32, {50}, "a", MemoryCategory::activation);
  g.set_tile_mapping(w, 0);
  g.set_tile_mapping(a, 0);
  Engine e(g, {});
  EXPECT_EQ(e.memory().tiles[0].always_live, 400u);
  EXPECT_EQ(e.memory().tiles[0].not_always_live, 200u);
}

TEST(TileLocality, VertexTouchingAnotherTilesMemoryIsRejected) {
  Graph g(tiny());
  Tensor in = g.add_variable(DType::f32, {64}, "in");
  Tensor out = g.add_variable(DType::f32, {64}, "out");
  g.set_tile_mapping(in, 0);
  g.set_tile_mapping(out, 1);
  ComputeSetId cs = g.add_compute_set("bad");
  g.add_vertex(cs, {"Relu", 0, {{in}, {out}}, {}});
  try {
    Engine e(g, {{"p", Program::execute(cs)}});
    FAIL() << "expected a tile-locality error";
  } catch (const std::logic_error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("Relu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("field 'out'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tile 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("own tile"), std::string::npos) << msg;
  }
}

TEST(Exchange, CopyMovesBytesBetweenTilesAndCosts) {
  Graph g(tiny());
  Tensor src = g.add_variable(DType::f32, {1000}, "src");
  Tensor dst = g.add_variable(DType::f32, {1000}, "dst");
  g.map_linearly(src);
  g.set_tile_mapping(dst, 5);
  g.set_host_access(src);
  g.set_host_access(dst);
  Engine e(g, {{"copy", Program::copy(src, dst)}});
  std::vector<float> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  e.write(src, std::as_bytes(std::span(v)));
  e.run("copy");
  const auto back = e.read(dst);
  EXPECT_EQ(std::memcmp(back.data(), v.data(), back.size()), 0);
  // Tile 5 receives all 4000 bytes at the exchange rate.
  const auto expected = tiny().exchange_latency_cycles +
                        static_cast<std::uint64_t>(4000 / tiny().exchange_bytes_per_cycle_per_tile);
  EXPECT_EQ(e.cycles().exchange, expected);
}

// Reads a float32 tensor back from the engine.
std::vector<float> floats(const Engine& e, const Tensor& t) {
  const auto bytes = e.read(t);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::vector<float> ramp(std::size_t n, float first) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = first + static_cast<float>(i);
  return v;
}

// The engine fills tiles in parallel, each tile's transfers in program order, unless a transfer
// reads bytes that another writes: then the whole exchange runs in program order.
TEST(Exchange, ATransferReadingWhatAnotherWritesKeepsProgramOrder) {
  for (unsigned threads : {1u, 2u}) {
    Graph g(tiny());
    Tensor x = g.add_variable(DType::f32, {64}, "x");
    Tensor y = g.add_variable(DType::f32, {64}, "y");
    Tensor z = g.add_variable(DType::f32, {64}, "z");
    for (unsigned i = 0; const Tensor& t : {x, y, z}) {
      g.set_tile_mapping(t, i++);
      g.set_host_access(t);
    }
    // z on tile 2 takes y's bytes before tile 1's y is overwritten by x.
    Engine e(g, {{"p", Program::copy({{y, z}, {x, y}})}}, {.threads = threads});
    e.write(x, std::as_bytes(std::span<const float>(ramp(64, 100))));
    e.write(y, std::as_bytes(std::span<const float>(ramp(64, 200))));
    e.run("p");
    EXPECT_EQ(floats(e, z), ramp(64, 200)) << threads << " threads";
    EXPECT_EQ(floats(e, y), ramp(64, 100)) << threads << " threads";
  }
}

// Rows of one size from many tiles that fill a destination one after another are a gather,
// and the next block of the same rows a gather with shifted sources; in an exchange that must
// keep program order (one transfer reads what another writes) each row still lands after the
// one before it.
TEST(Exchange, GathersInAnOrderedExchangeFillTheirDestinationsRowAfterRow) {
  for (unsigned threads : {1u, 2u}) {
    Graph g(tiny());
    constexpr std::size_t kRows = 8, kW = 8;
    Tensor x = g.add_variable(DType::f32, {kRows, kW}, "x");
    Tensor d1 = g.add_variable(DType::f32, {kRows, kW / 2}, "d1");
    Tensor d2 = g.add_variable(DType::f32, {kRows, kW / 2}, "d2");
    Tensor y = g.add_variable(DType::f32, {16}, "y");
    Tensor z = g.add_variable(DType::f32, {16}, "z");
    Tensor w = g.add_variable(DType::f32, {16}, "w");
    for (unsigned r = 0; r < kRows; ++r) g.set_tile_mapping(x.row(r), r);
    g.set_tile_mapping(d1, 8);
    g.set_tile_mapping(d2, 9);
    g.set_tile_mapping(y, 10);
    g.set_tile_mapping(z, 11);
    g.set_tile_mapping(w, 12);
    for (const Tensor& t : {x, d1, d2, y, z, w}) g.set_host_access(t);
    std::vector<std::pair<Tensor, Tensor>> pairs = {{y, z}, {w, y}};
    for (std::size_t r = 0; r < kRows; ++r)
      pairs.emplace_back(x.row(r).slice(0, kW / 2), d1.row(r));
    for (std::size_t r = 0; r < kRows; ++r)
      pairs.emplace_back(x.row(r).slice(kW / 2, kW), d2.row(r));
    Engine e(g, {{"p", Program::copy(std::move(pairs))}}, {.threads = threads});
    const auto values = ramp(kRows * kW, 1);
    e.write(x, std::as_bytes(std::span<const float>(values)));
    e.write(y, std::as_bytes(std::span<const float>(ramp(16, 200))));
    e.write(w, std::as_bytes(std::span<const float>(ramp(16, 300))));
    e.run("p");
    const auto got1 = floats(e, d1), got2 = floats(e, d2);
    for (std::size_t r = 0; r < kRows; ++r)
      for (std::size_t c = 0; c < kW / 2; ++c) {
        ASSERT_EQ(got1[r * kW / 2 + c], values[r * kW + c]) << r << "," << c;
        ASSERT_EQ(got2[r * kW / 2 + c], values[r * kW + kW / 2 + c]) << r << "," << c;
      }
    EXPECT_EQ(floats(e, z), ramp(16, 200)) << threads << " threads";
    EXPECT_EQ(floats(e, y), ramp(16, 300)) << threads << " threads";
  }
}

// A block of channel planes copied row by row (as a convolution brings its input rows to a
// tile) is one strided run and, per source tile, one strided transfer; the bytes arrive where
// the pairs say, the transposed view moves element by element, and the exchange costs what
// the bytes per tile cost.
TEST(Exchange, StridedBlocksOfRowsMoveAsThePairsSay) {
  for (unsigned threads : {1u, 2u}) {
    Graph g(tiny());
    constexpr std::size_t kC = 6, kH = 8, kW = 5;
    Tensor x = g.add_variable(DType::f32, {kC, kH, kW}, "x");
    Tensor xl = g.add_variable(DType::f32, {kC, 4, kW}, "xl");
    Tensor t = g.add_variable(DType::f32, {kW, kC}, "t");
    for (std::size_t c = 0; c < kC; ++c)  // channels 0-2 on tiles 0 and 1, 3-5 on tiles 2 and 3
      for (std::size_t half = 0; half < 2; ++half)
        g.set_tile_mapping(x.row(c).rows(4 * half, 4 * half + 4),
                           static_cast<unsigned>(2 * (c / 3) + half));
    g.set_tile_mapping(xl, 4);
    g.set_tile_mapping(t, 5);
    for (const Tensor& v : {x, xl, t}) g.set_host_access(v);
    std::vector<std::pair<Tensor, Tensor>> pairs;
    for (std::size_t c = 0; c < kC; ++c)
      pairs.emplace_back(x.row(c).rows(2, 6).flatten(), xl.row(c).flatten());
    const Program block = Program::copy(std::move(pairs));
    ASSERT_EQ(block.runs().size(), 1u);
    EXPECT_EQ(block.runs()[0].rows, kC);
    // Row 3 of every channel, transposed: t[w][c] = x[c][3][w].
    const Program transposed = Program::copy(View(x).index(3, 1).transpose(), View(t));
    Engine e(g, {{"block", block}, {"transposed", transposed}}, {.threads = threads});
    const auto values = ramp(kC * kH * kW, 1);
    e.write(x, std::as_bytes(std::span<const float>(values)));
    e.run("block");
    const auto got = floats(e, xl);
    for (std::size_t c = 0; c < kC; ++c)
      for (std::size_t r = 0; r < 4; ++r)
        for (std::size_t w = 0; w < kW; ++w)
          ASSERT_EQ(got[(c * 4 + r) * kW + w], values[(c * kH + r + 2) * kW + w])
              << c << "," << r << "," << w << " with " << threads << " threads";
    // Tile 4 receives all 6 x 4 x 5 floats.
    EXPECT_EQ(e.cycles().exchange,
              tiny().exchange_latency_cycles +
                  static_cast<std::uint64_t>(std::ceil(kC * 4 * kW * sizeof(float) /
                                                       tiny().exchange_bytes_per_cycle_per_tile)));
    e.run("transposed");
    const auto tr = floats(e, t);
    for (std::size_t w = 0; w < kW; ++w)
      for (std::size_t c = 0; c < kC; ++c)
        ASSERT_EQ(tr[w * kC + c], values[(c * kH + 3) * kW + w]) << threads << " threads";
  }
}

// An exchange and the compute set after it run tile by tile when no vertex touches an exchange
// source; this one changes the source, so the whole exchange must finish first.
TEST(Exchange, AComputeSetThatChangesAnExchangeSourceRunsAfterTheWholeExchange) {
  for (unsigned threads : {1u, 2u}) {
    Graph g(tiny());
    Tensor x = g.add_variable(DType::f32, {256}, "x");
    Tensor w = g.add_variable(DType::f32, {256}, "w");
    Tensor y = g.add_variable(DType::f32, {256}, "y");
    g.set_tile_mapping(x, 0);
    g.set_tile_mapping(w, 0);
    g.set_tile_mapping(y, 5);  // filled after tile 0's vertices would have run
    for (const Tensor& t : {x, w, y}) g.set_host_access(t);
    Program p;
    p.add(Program::copy(x, y));
    ops::scaled_add_in_place(g, p, x, w, 1.0f, "x+=w");
    Engine e(g, {{"p", p}}, {.threads = threads});
    e.write(x, std::as_bytes(std::span<const float>(ramp(256, 1))));
    e.write(w, std::as_bytes(std::span<const float>(ramp(256, 1000))));
    e.run("p");
    EXPECT_EQ(floats(e, y), ramp(256, 1)) << threads << " threads";
    const auto sum = floats(e, x);
    for (std::size_t i = 0; i < sum.size(); ++i)
      ASSERT_EQ(sum[i], 1001.f + 2.f * static_cast<float>(i)) << threads << " threads, " << i;
  }
}

// Exchange-and-compute steps after one another, each tile's input from another tile: step 1
// brings x from the next tile and doubles it, the later steps each add a value from a
// neighbouring tile (t ^ 1, then t ^ 2), so tiles form groups of 2, then 4, that the engine may
// run group by group. Each step also keeps a copy of its result that no exchange reads, for the
// next step's vertex (a vertex touching an exchange source would keep the exchange whole).
struct NeighbourSteps {
  static constexpr std::size_t kTiles = 16, kWidth = 8;
  Graph g{tiny()};
  Tensor x, in, mid, keep, got, y, keep2, got2, z;
  Program p;

  // With second_step_writes_x, the second step writes its result into x and is the last.
  explicit NeighbourSteps(bool second_step_writes_x) {
    const std::pair<Tensor*, const char*> tensors[] = {
        {&x, "x"}, {&in, "in"},       {&mid, "mid"},   {&keep, "keep"}, {&got, "got"},
        {&y, "y"}, {&keep2, "keep2"}, {&got2, "got2"}, {&z, "z"}};
    for (const auto& [t, name] : tensors) {
      *t = g.add_variable(DType::f32, {kTiles, kWidth}, name);
      for (unsigned tile = 0; tile < kTiles; ++tile) g.set_tile_mapping(t->row(tile), tile);
      g.set_host_access(*t);  // live for the whole run: no two tensors share bytes
    }
    step([](unsigned t) { return (t + 1) % kTiles; }, x, in, in, {mid, keep});
    if (second_step_writes_x) {
      step([](unsigned t) { return t ^ 1U; }, mid, got, keep, {x});
      return;
    }
    step([](unsigned t) { return t ^ 1U; }, mid, got, keep, {y, keep2});
    step([](unsigned t) { return t ^ 2U; }, y, got2, keep2, {z});
  }
  // Tile t copies from.row(source(t)) into to.row(t), then out.row(t) = own.row(t) + to.row(t)
  // for each out.
  template <class Source>
  void step(Source source, const Tensor& from, const Tensor& to, const Tensor& own,
            const std::vector<Tensor>& outs) {
    std::vector<std::pair<Tensor, Tensor>> copies;
    const ComputeSetId cs = g.add_compute_set("add");
    for (unsigned t = 0; t < kTiles; ++t) {
      copies.emplace_back(from.row(source(t)), to.row(t));
      for (const Tensor& out : outs)
        g.add_vertex(cs, {"MatMulReduce", t, {{own.row(t), to.row(t)}, {out.row(t)}}, {}});
    }
    p.add(Program::copy(std::move(copies)));
    p.add(Program::execute(cs));
  }
  // x's element j on tile t in run r, and what the second step makes of x.
  static float value(std::size_t t, std::size_t j, int r) {
    return static_cast<float>(r * 1000 + static_cast<int>(t * kWidth + j));
  }
  static float doubled_pair(std::size_t t, std::size_t j, int r) {
    return 2 * value((t + 1) % kTiles, j, r) + 2 * value(((t ^ 1) + 1) % kTiles, j, r);
  }
};

TEST(Exchange, StepsThatRunGroupByGroupOfTilesGiveTheStepByStepResult) {
  for (unsigned threads : {1u, 2u}) {
    NeighbourSteps s(false);
    Engine e(s.g, {{"p", s.p}}, {.threads = threads});
    for (int run = 1; run <= 2; ++run) {  // the second run must not see the first's values
      std::vector<float> x(NeighbourSteps::kTiles * NeighbourSteps::kWidth);
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = NeighbourSteps::value(i / NeighbourSteps::kWidth, i % NeighbourSteps::kWidth, run);
      e.write(s.x, std::as_bytes(std::span<const float>(x)));
      e.run("p");
      const auto y = floats(e, s.y), z = floats(e, s.z);
      for (std::size_t t = 0; t < NeighbourSteps::kTiles; ++t)
        for (std::size_t j = 0; j < NeighbourSteps::kWidth; ++j) {
          const std::size_t i = t * NeighbourSteps::kWidth + j;
          ASSERT_EQ(y[i], NeighbourSteps::doubled_pair(t, j, run)) << threads << " threads, " << i;
          ASSERT_EQ(z[i], NeighbourSteps::doubled_pair(t, j, run) +
                              NeighbourSteps::doubled_pair(t ^ 2, j, run))
              << threads << " threads, " << i;
        }
    }
  }
}

// Here the second step overwrites x, which the first step's exchange reads for the previous
// tile, in another group: the first step must finish on every tile before the second starts.
TEST(Exchange, AStepThatChangesAnEarlierExchangeSourceWaitsForEveryTile) {
  for (unsigned threads : {1u, 2u}) {
    NeighbourSteps s(true);
    Engine e(s.g, {{"p", s.p}}, {.threads = threads});
    std::vector<float> x(NeighbourSteps::kTiles * NeighbourSteps::kWidth);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = NeighbourSteps::value(i / NeighbourSteps::kWidth, i % NeighbourSteps::kWidth, 1);
    e.write(s.x, std::as_bytes(std::span<const float>(x)));
    e.run("p");
    const auto after = floats(e, s.x);
    for (std::size_t i = 0; i < after.size(); ++i)
      ASSERT_EQ(after[i], NeighbourSteps::doubled_pair(i / NeighbourSteps::kWidth,
                                                       i % NeighbourSteps::kWidth, 1))
          << threads << " threads, " << i;
  }
}

// Compute-set cycles of n Relu vertices of `elements` each, placed on the given tiles in turn.
std::uint64_t relu_cycles(std::size_t vertices, std::size_t elements, unsigned tiles) {
  Graph g(tiny());
  ComputeSetId cs = g.add_compute_set("relu");
  for (std::size_t i = 0; i < vertices; ++i) {
    const unsigned tile = static_cast<unsigned>(i % tiles);
    Tensor in = g.add_variable(DType::f32, {elements}, "in" + std::to_string(i));
    Tensor out = g.add_variable(DType::f32, {elements}, "out" + std::to_string(i));
    g.set_tile_mapping(in, tile);
    g.set_tile_mapping(out, tile);
    g.add_vertex(cs, {"Relu", tile, {{in}, {out}}, {}});
  }
  Engine e(g, {{"p", Program::execute(cs)}});
  e.run("p");
  return e.cycles().compute;
}

TEST(CycleModel, TwiceTheWorkOnOneTileCostsTwiceAndTwiceTheTilesHalf) {
  const auto one = relu_cycles(12, 200, 1);  // two vertices per worker
  const auto twice = relu_cycles(24, 200, 1);
  const auto spread = relu_cycles(24, 200, 2);
  EXPECT_EQ(twice, 2 * one);
  EXPECT_EQ(spread, one);
  EXPECT_GT(one, 0u);
}

// An elementwise op makes one vertex per tile with a worker slice per worker piece (Poplar's
// MultiVertex); it computes and costs what one vertex per piece did: each slice goes to the
// least-loaded worker in the same order.
TEST(MultiVertex, OneVertexPerTileComputesAndCostsAsOneVertexPerPiece) {
  const auto build = [](Graph& g, bool multi) {
    // Intervals of 1 to 6 worker pieces, alternating between tiles 0 and 1.
    const std::vector<std::size_t> sizes = {10, 200, 70, 400, 130, 64, 390, 5, 260, 129};
    std::size_t n = 0;
    for (std::size_t s : sizes) n += s;
    Tensor x = g.add_variable(DType::f32, {n}, "x");
    std::size_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); at += sizes[i], ++i)
      g.set_tile_mapping(x.slice(at, at + sizes[i]), static_cast<unsigned>(i % 2));
    g.set_host_access(x);
    Program prog;
    Tensor out;
    if (multi) {
      out = ops::unary(g, prog, ops::UnaryOp::square, x, 0.f, "square");
    } else {
      out = ops::clone_like(g, x, "square");
      const ComputeSetId cs = g.add_compute_set("square");
      ops::for_each_worker_piece(g, x, 64, [&](unsigned tile, std::size_t b, std::size_t e) {
        g.add_vertex(cs, {"Unary",
                          tile,
                          {{x.slice(b, e)}, {out.slice(b, e)}},
                          {static_cast<double>(ops::UnaryOp::square), 0.0}});
      });
      prog.add(Program::execute(cs));
    }
    g.set_host_access(out);
    return std::tuple{x, out, prog};
  };
  Graph multi(tiny()), single(tiny());
  auto [mx, mout, mprog] = build(multi, true);
  auto [sx, sout, sprog] = build(single, false);
  const ComputeSet& cs = multi.compute_sets().back();
  ASSERT_EQ(cs.vertices.size(), 2u);  // one per tile
  std::size_t slices = 0;
  for (const VertexRecord& v : cs.vertices) slices += v.slices;
  EXPECT_EQ(slices, single.compute_sets().back().vertices.size());
  EXPECT_GT(slices, 10u);

  Engine me(multi, {{"square", mprog}}), se(single, {{"square", sprog}});
  const std::vector<float> values = ramp(mx.elements(), -800.f);
  me.write(mx, std::as_bytes(std::span(values)));
  se.write(sx, std::as_bytes(std::span(values)));
  me.run("square");
  se.run("square");
  const std::vector<float> got = floats(me, mout);
  EXPECT_EQ(got, floats(se, sout));
  for (std::size_t i = 0; i < values.size(); ++i) ASSERT_EQ(got[i], values[i] * values[i]);
  EXPECT_EQ(me.cycles().compute, se.cycles().compute);
  EXPECT_GT(me.cycles().compute, 0u);
}

// Vertex state: a field's regions that follow each other in the tile's memory (a variable's
// elements on a tile lie in element order) are one region, however many intervals and worker
// slices they span; out of order, or skipping an interval, they are not. The same with and
// without the graph keeping its regions.
TEST(VertexState, ATilesRunOfOneVariableCountsAsOneRegion) {
  for (const bool keep : {true, false}) {
    Graph g(tiny());
    if (!keep) g.drop_vertex_regions();
    // Intervals alternating between tiles 0 and 1: tile 0 holds [0,10) [210,280) [680,810).
    const std::vector<std::size_t> sizes = {10, 200, 70, 400, 130};
    Tensor x = g.add_variable(DType::f32, {810}, "x");
    std::size_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); at += sizes[i], ++i)
      g.set_tile_mapping(x.slice(at, at + sizes[i]), static_cast<unsigned>(i % 2));
    Tensor y = ops::clone_like(g, x, "y");
    const ComputeSetId cs = g.add_compute_set("square");
    const double square = static_cast<double>(ops::UnaryOp::square);
    const auto add = [&](std::vector<std::pair<std::size_t, std::size_t>> runs) {
      Vertex v{"Unary", 0, {{}, {}}, {square, 0.0}};
      for (const auto& [b, e] : runs) {
        v.fields[0].push_back(x.slice(b, e));
        v.fields[1].push_back(y.slice(b, e));
      }
      g.add_vertex(cs, v);
      return g.compute_sets()[cs].regions_of(g.compute_sets()[cs].vertices.back());
    };
    EXPECT_EQ(add({{0, 10}, {210, 280}, {680, 810}}), 2u) << keep;  // in memory order
    EXPECT_EQ(add({{0, 5}, {5, 10}, {210, 250}}), 2u) << keep;      // touching, then next
    EXPECT_EQ(add({{210, 280}, {0, 10}}), 4u) << keep;              // out of order
    EXPECT_EQ(add({{0, 10}, {680, 810}}), 4u) << keep;              // skips [210,280)
    EXPECT_EQ(add({{0, 5}, {210, 280}}), 4u) << keep;               // [5,10) between
    std::size_t total = 0;
    for (const VertexRecord& v : g.compute_sets()[cs].vertices)
      total += g.compute_sets()[cs].regions_of(v);
    EXPECT_EQ(total, 16u) << keep;
  }
}

TEST(Streams, HostToDeviceAndBackThroughCallbacks) {
  Graph g(tiny());
  Tensor t = g.add_variable(DType::f32, {300}, "t");
  g.map_linearly(t, 7);
  Program p = Program::sequence();
  p.add(Program::stream_to_device("in", t));
  Tensor r = ops::relu(g, p, t, "relu");
  p.add(Program::stream_from_device("out", r));
  Engine e(g, {{"p", p}});
  std::vector<float> got;
  e.connect_input_stream("in", [](std::span<std::byte> dst) {
    auto f = std::span(reinterpret_cast<float*>(dst.data()), dst.size() / 4);
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) - 150.f;
  });
  e.connect_output_stream("out", [&](std::span<const std::byte> src) {
    got.resize(src.size() / 4);
    std::memcpy(got.data(), src.data(), src.size());
  });
  e.run("p");
  ASSERT_EQ(got.size(), 300u);
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], std::max(0.f, static_cast<float>(i) - 150.f));
  EXPECT_GT(e.cycles().host, 0u);
}

TEST(HostAccess, ReadingATensorWithoutHostAccessIsRefused) {
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {8}, "scratch");
  g.set_tile_mapping(x, 0);
  Engine e(g, {});
  try {
    e.read(x);
    FAIL();
  } catch (const std::logic_error& err) {
    EXPECT_NE(std::string(err.what()).find("set_host_access"), std::string::npos);
  }
}

TEST(ControlFlow, IfAndRepeatWhileTrueFollowTheDevicePredicate) {
  Graph g(tiny());
  Tensor n = g.add_variable(DType::f32, {1}, "n");  // counts down from 4 by adding -1
  Tensor minus_one = g.add_variable(DType::f32, {1}, "minus_one");
  Tensor hits = g.add_variable(DType::f32, {1}, "hits");
  Tensor one = g.add_variable(DType::f32, {1}, "one");
  for (const Tensor& t : {n, minus_one, hits, one}) {
    g.set_tile_mapping(t, 2);
    g.set_host_access(t);
  }
  Program body;
  ops::scaled_add_in_place(g, body, n, one, -1.0f, "n-=1");
  ops::scaled_add_in_place(g, body, hits, one, 1.0f, "hits+=1");
  Program loop = Program::repeat_while_true(Program(), n, body);
  Program branch = Program::if_else(n, Program(), body);  // n is 0 here: runs the else body
  Engine e(g, {{"loop", loop}, {"branch", branch}});
  const auto set = [&](const Tensor& t, float v) { e.write(t, std::as_bytes(std::span(&v, 1))); };
  const auto get = [&](const Tensor& t) {
    float v;
    std::memcpy(&v, e.read(t).data(), 4);
    return v;
  };
  set(n, 4);
  set(one, 1);
  set(hits, 0);
  e.run("loop");
  EXPECT_EQ(get(hits), 4.0f);
  EXPECT_EQ(get(n), 0.0f);
  e.run("branch");
  EXPECT_EQ(get(hits), 5.0f);
  EXPECT_EQ(get(n), -1.0f);
}

TEST(Threads, ResultsAreBitwiseIdenticalWithOneOrTwoThreads) {
  const auto run = [](unsigned threads) {
    Graph g(tiny());
    Tensor a = g.add_variable(DType::f32, {50, 70}, "a");
    Tensor b = g.add_variable(DType::f32, {70, 30}, "b");
    g.map_linearly(a);
    g.map_linearly(b);
    g.set_host_access(a);
    g.set_host_access(b);
    Program p;
    Tensor c = ops::relu(g, p, ops::matmul(g, p, a, b, false, false, "mm"), "r");
    g.set_host_access(c);
    Engine e(g, {{"p", p}}, {.threads = threads, .trace_events = 100});
    std::vector<float> av(3500), bv(2100);
    for (std::size_t i = 0; i < av.size(); ++i) av[i] = std::sin(static_cast<float>(i));
    for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = std::cos(static_cast<float>(i) * 0.7f);
    e.write(a, std::as_bytes(std::span(av)));
    e.write(b, std::as_bytes(std::span(bv)));
    e.run("p");
    EXPECT_FALSE(e.trace().empty());
    return std::make_pair(e.read(c), e.cycles().total());
  };
  const auto one = run(1), two = run(2);
  EXPECT_EQ(one.first, two.first);
  EXPECT_EQ(one.second, two.second);
}

TEST(Trace, EventsTileThePredictedTimeline) {
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {1000}, "x", MemoryCategory::weight);
  g.map_linearly(x);
  Program p;
  ops::relu(g, p, ops::relu(g, p, x, "first"), "second");
  Engine e(g, {{"p", p}}, {.trace_events = 1000});
  e.run("p");
  ASSERT_EQ(e.trace().size(), 4u);  // compute + sync per compute set
  EXPECT_EQ(e.trace()[0].name, "first");
  EXPECT_STREQ(e.trace()[0].category, "compute");
  std::uint64_t end = 0;
  for (const auto& ev : e.trace()) {
    EXPECT_EQ(ev.start_cycles, end);
    end = ev.start_cycles + ev.cycles;
  }
  EXPECT_EQ(end, e.cycles().total());
}

// Every figure of every hardware preset names its source (public, derived from public facts,
// or fitted by scripts/calibration), and none is merely assumed.
TEST(ArchPresets, EveryFigureOfAHardwarePresetNamesItsSource) {
  // The struct's fields, counted by hand, so that a figure missing from figures() fails too.
  ASSERT_EQ(ArchPreset::figures().size(), 17u);
  for (const ArchPreset& p : ArchPreset::all()) {
    if (p.name == "tiny") continue;  // not hardware
    for (const std::string& line : p.sources)
      EXPECT_EQ(line.find("assumed"), std::string::npos) << p.name << ": " << line;
    for (const std::string& figure : ArchPreset::figures()) {
      // Named in the list of fields before a line's colon.
      const bool named = std::any_of(p.sources.begin(), p.sources.end(), [&](const auto& line) {
        const std::string fields = line.substr(0, line.find(':'));
        std::size_t at = fields.find(figure);
        while (at != std::string::npos) {
          const std::size_t end = at + figure.size();
          if ((at == 0 || fields[at - 1] == ' ') && (end == fields.size() || fields[end] == ','))
            return true;
          at = fields.find(figure, at + 1);
        }
        return false;
      });
      EXPECT_TRUE(named) << p.name << ": no source names " << figure;
    }
  }
}

TEST(ArchPresets, UserPresetFromAFileOverridesABase) {
  const std::string path = ::testing::TempDir() + "half_mk2.json";
  {
    std::ofstream out(path);
    out << R"({"base": "mk2", "name": "half-mk2", "tiles": 736, "sources": ["hypothetical"]})";
  }
  const ArchPreset& p = ArchPreset::get(path);
  EXPECT_EQ(p.name, "half-mk2");
  EXPECT_EQ(p.tiles, 736u);
  EXPECT_EQ(p.bytes_per_tile, ArchPreset::get("mk2").bytes_per_tile);
  EXPECT_EQ(p.sources.back(), "hypothetical");
  EXPECT_EQ(&ArchPreset::get(path), &p);  // loaded once, references stay valid

  const std::string bad = ::testing::TempDir() + "bad_arch.json";
  std::ofstream(bad) << R"({"base": "mk2", "tilez": 3})";
  try {
    ArchPreset::get(bad);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown field 'tilez'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ArchPreset::get("no-such-arch"), std::invalid_argument);
}

// Every field of a preset file is checked for type, sign and range, and named: a negative size
// used to wrap to 1.8e19 bytes per tile and turn every memory check off.
TEST(ArchPresets, FileFieldsAreCheckedForTypeSignAndRange) {
  int n = 0;
  const auto refused = [&](const std::string& fields, const std::string& needle) {
    const std::string path = ::testing::TempDir() + "arch_" + std::to_string(n++) + ".json";
    std::ofstream(path) << R"({"base": "mk2", )" << fields << "}";
    try {
      ArchPreset::get(path);
      ADD_FAILURE() << fields << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_NE(message.find(needle), std::string::npos) << message;
    }
  };
  refused(R"("bytes_per_tile": -1)", "field 'bytes_per_tile' must be a whole number in [1, ");
  refused(R"("bytes_per_tile": 1e30)", "field 'bytes_per_tile' must be a whole number");
  refused(R"("bytes_per_tile": 8589934592)", "field 'bytes_per_tile' must be a whole number");
  refused(R"("tiles": 0)", "field 'tiles' must be a whole number in [1, ");
  refused(R"("tiles": 1.5)", "field 'tiles' must be a whole number");
  refused(R"("tiles": 4294967297)", "field 'tiles' must be a whole number");
  refused(R"("workers_per_tile": "six")", "field 'workers_per_tile' must be a whole number");
  refused(R"("sync_cycles_external": -5)", "field 'sync_cycles_external' must be a whole number");
  refused(R"("codelet_code_bytes": 18446744073709551615)", "field 'codelet_code_bytes'");
  refused(R"("clock_hz": -1.33e9)", "field 'clock_hz' must be a finite number > 0, got");
  refused(R"("clock_hz": 0)", "field 'clock_hz' must be a finite number > 0");
  refused(R"("exchange_bytes_per_cycle_per_tile": null)",
          "field 'exchange_bytes_per_cycle_per_tile' must be a finite number > 0");
  refused(R"("fp16_flops_per_cycle_per_tile": -2)",
          "field 'fp16_flops_per_cycle_per_tile' must be a finite number >= 0");
  refused(R"("name": 3)", "field 'name' must be a string");
  refused(R"("sources": ["ok", 4])", "field 'sources' must be a list of strings");
  const std::string bad_base = ::testing::TempDir() + "arch_base.json";
  std::ofstream(bad_base) << R"({"base": 2})";
  EXPECT_THROW(
      {
        try {
          ArchPreset::get(bad_base);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("field 'base' must be a string"), std::string::npos)
              << e.what();
          throw;
        }
      },
      std::invalid_argument);
  // In range, they are taken as given.
  const std::string fine = ::testing::TempDir() + "arch_fine.json";
  std::ofstream(fine)
      << R"({"base": "tiny", "bytes_per_tile": 4294967295, "sync_cycles_external": 0})";
  EXPECT_EQ(ArchPreset::get(fine).bytes_per_tile, 4294967295u);
  EXPECT_EQ(ArchPreset::get(fine).sync_cycles_external, 0u);
}

}  // namespace
}  // namespace ipupod::ipu

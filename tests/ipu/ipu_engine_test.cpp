// The device's rules: tile memory limits, tile locality of vertices, and the cycle model.
#include <gtest/gtest.h>

#include <cstring>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/elementwise.hpp"

namespace ipupod::ipu {
namespace {

const ArchPreset& tiny() { return ArchPreset::get("tiny"); }

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
    EXPECT_NE(msg.find("Out of memory: Cannot fit all variable data onto one or more tiles"), std::string::npos);
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
  Engine e(g, {}, {.allow_out_of_memory = true});
  EXPECT_EQ(e.memory().tiles_over(), 2u);
  EXPECT_EQ(e.memory().tiles[0].not_always_live, 2 * tiny().bytes_per_tile);
  EXPECT_THROW(e.run("none"), std::logic_error);
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
  const auto one = relu_cycles(12, 200, 1);   // two vertices per worker
  const auto twice = relu_cycles(24, 200, 1);
  const auto spread = relu_cycles(24, 200, 2);
  EXPECT_EQ(twice, 2 * one);
  EXPECT_EQ(spread, one);
  EXPECT_GT(one, 0u);
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

}  // namespace
}  // namespace ipupod::ipu

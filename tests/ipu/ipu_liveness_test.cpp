// Liveness: which variables' bytes the memory plan lets others share, and that values carried
// across loop iterations or branches keep theirs.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/tensor_ops.hpp"

namespace ipupod::ipu {
namespace {

const ArchPreset& tiny() {
  return ArchPreset::get("tiny");
}

TEST(Liveness, DisjointTemporariesShareBytes) {
  // Two chains in sequence: temporaries of the first are dead before the second starts.
  const auto build = [](bool second_chain_reuses) {
    Graph g(tiny());
    Tensor x = g.add_variable(DType::f32, {4096}, "x", MemoryCategory::weight);
    g.set_tile_mapping(x, 0);
    Program p;
    Tensor a = ops::relu(g, p, x, "a");
    Tensor b = ops::relu(g, p, a, "b");
    Tensor c = ops::relu(g, p, x, "c");
    [[maybe_unused]] Tensor d =
        second_chain_reuses ? ops::relu(g, p, c, "d") : ops::add(g, p, b, c, "d");
    Engine e(g, {{"p", p}});
    return e.memory().tiles[0];
  };
  const TileMemory shared = build(true), chained = build(false);
  // a and b die before c and d are born (when d reads only c), so at most two temporaries are
  // live at once; when d = b + c, b stays live across c and three are live together.
  EXPECT_EQ(shared.not_always_live, 2 * 4096 * 4u);
  EXPECT_EQ(chained.not_always_live, 3 * 4096 * 4u);
  EXPECT_EQ(shared.by_category.at(MemoryCategory::activation), 4 * 4096 * 4u);
  EXPECT_EQ(shared.always_live, 4096 * 4u);
  EXPECT_EQ(shared.gaps(), 0u);
}

// The memory plan says where it stands: once per tile laid out, in order, up to every tile.
TEST(Liveness, TheMemoryPlanReportsEachTileItLaysOut) {
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {4096}, "x", MemoryCategory::weight);
  g.map_linearly(x);
  Program p;
  [[maybe_unused]] Tensor y = ops::relu(g, p, x, "y");
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  Engine e(g, {{"p", p}}, {.memory_plan_progress = [&](std::size_t done, std::size_t tiles) {
             calls.emplace_back(done, tiles);
           }});
  ASSERT_EQ(calls.size(), tiny().tiles);
  for (std::size_t i = 0; i < calls.size(); ++i)
    EXPECT_EQ(calls[i], std::make_pair(i + 1, std::size_t{tiny().tiles}));
  EXPECT_GT(e.memory().tiles[0].total(), 0u);
}

// Tiles are laid out on the engine's threads: one thread or several give every tile the same
// plan, the same bytes at the same addresses, so a run computes the same values.
TEST(Liveness, TheMemoryPlanIsTheSameOnAnyNumberOfThreads) {
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {16, 512}, "x", MemoryCategory::weight);
  g.map_linearly(x);
  g.set_host_access(x);
  // Temporaries of uneven sizes on every tile, inside and outside a loop, some carried over.
  Program body, p;
  Tensor a = ops::relu(g, body, x, "a");
  Tensor b = ops::binary(g, body, ops::BinaryOp::mul, a, x, "b");
  Tensor c = ops::add(g, body, ops::relu(g, body, b, "r"), a, "c");
  ops::scaled_add_in_place(g, body, x, c, 0.25f, "x+=c/4");
  p.add(Program::repeat(3, body));
  Tensor tail = ops::slice(g, p, ops::relu(g, p, x, "t"), 1, 0, 96, "tail");
  Tensor y = ops::add(g, p, tail, ops::relu(g, p, tail, "u"), "y");
  g.set_host_access(y);
  std::vector<float> in(16 * 512);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 97) / 50.0f - 0.9f;
  const auto plan = [&](unsigned threads) {
    Engine e(g, {{"p", p}}, {.threads = threads});
    e.write(x, std::as_bytes(std::span(in)));
    e.run("p");
    return std::pair{e.memory(), e.read(y)};
  };
  const auto [one, one_out] = plan(1);
  for (unsigned threads : {2U, 3U}) {
    const auto [many, many_out] = plan(threads);
    ASSERT_EQ(many.tiles.size(), one.tiles.size());
    for (std::size_t t = 0; t < one.tiles.size(); ++t) {
      EXPECT_EQ(many.tiles[t].always_live, one.tiles[t].always_live) << "tile " << t;
      EXPECT_EQ(many.tiles[t].not_always_live, one.tiles[t].not_always_live) << "tile " << t;
      EXPECT_EQ(many.tiles[t].peak_live, one.tiles[t].peak_live) << "tile " << t;
    }
    EXPECT_EQ(many_out, one_out);
  }
  EXPECT_GT(one.busiest().not_always_live, 0u);
}

TEST(Liveness, ValuesCarriedAroundALoopStayLive) {
  Graph g(tiny());
  Tensor acc = g.add_variable(DType::f32, {256}, "acc");
  Tensor x = g.add_variable(DType::f32, {256}, "x");
  g.set_tile_mapping(acc, 1);
  g.set_tile_mapping(x, 1);
  g.set_host_access(x);
  g.set_host_access(acc);
  Program zero, body;
  ops::zero(g, zero, acc, "zero");
  Tensor t = ops::relu(g, body, x, "t");  // a temporary born and dead inside each iteration
  ops::scaled_add_in_place(g, body, acc, t, 1.0f, "acc+=t");
  Program p = Program::sequence({zero, Program::repeat(3, body)});
  Engine e(g, {{"p", p}});
  std::vector<float> v(256, 2.0f);
  e.write(x, std::as_bytes(std::span(v)));
  e.run("p");
  const auto out = e.read(acc);
  const float* f = reinterpret_cast<const float*>(out.data());
  for (std::size_t i = 0; i < 256; ++i) ASSERT_EQ(f[i], 6.0f);
}

TEST(Liveness, ValuesWrittenWholeInALoopBodyShareBytesAcrossIterations) {
  // The same two chains inside a loop: each temporary is written whole before it is read in
  // every iteration, so nothing carries from one iteration to the next and the chains still
  // share bytes as they do outside a loop.
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {4096}, "x", MemoryCategory::weight);
  g.set_tile_mapping(x, 0);
  Program body;
  ops::relu(g, body, ops::relu(g, body, x, "a"), "b");
  ops::relu(g, body, ops::relu(g, body, x, "c"), "d");
  Engine e(g, {{"p", Program::repeat(3, body)}});
  EXPECT_EQ(e.memory().tiles[0].not_always_live, 2 * 4096 * 4u);
}

TEST(Liveness, BroadcastBinaryOutputsAreWrittenWholeInALoopBody) {
  // As above, with NumPy-broadcasting binary ops (a per-column scale and shift): their outputs
  // are overwritten whole, so each is live only from its op to its last read, not carried
  // around the loop (a whole training step: every activation live all the time).
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {64, 64}, "x", MemoryCategory::weight);
  Tensor s = g.add_variable(DType::f32, {64}, "s", MemoryCategory::weight);
  g.set_tile_mapping(x, 0);
  g.set_tile_mapping(s, 0);
  Program body;
  using ops::BinaryOp;
  ops::binary(g, body, BinaryOp::mul, ops::binary(g, body, BinaryOp::mul, x, s, "a"), s, "b");
  ops::binary(g, body, BinaryOp::add, ops::binary(g, body, BinaryOp::add, x, s, "c"), s, "d");
  Engine e(g, {{"p", Program::repeat(3, body)}});
  EXPECT_EQ(e.memory().tiles[0].not_always_live, 2 * 4096 * 4u);
  EXPECT_EQ(e.memory().tiles[0].by_category.at(MemoryCategory::activation), 4 * 4096 * 4u);
}

TEST(Liveness, AValueReadBeforeItIsRewrittenInALoopKeepsItsBytes) {
  // h is read at the top of the body and rewritten at its end: its value crosses iterations,
  // so the temporary u made in between must not take its bytes.
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {64}, "x", MemoryCategory::weight);
  Tensor h = g.add_variable(DType::f32, {64}, "h");
  Tensor out = g.add_variable(DType::f32, {64}, "out");
  for (const Tensor& t : {x, h, out}) g.set_tile_mapping(t, 2);
  g.set_host_access(out);
  Program body;
  Tensor twice = ops::add(g, body, h, h, "twice");
  Tensor u = ops::relu(g, body, x, "u");
  body.add(Program::copy(twice, h));
  ops::scaled_add_in_place(g, body, out, u, 0.0f, "use u");
  Program p =
      Program::sequence({Program::copy(x, h), Program::repeat(3, body), Program::copy(h, out)});
  Engine e(g, {{"p", p}});
  std::vector<float> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 10.f;
  e.write(x, std::as_bytes(std::span(v)));
  e.write(out, std::as_bytes(std::span(v)));
  e.run("p");
  const auto got = e.read(out);
  const float* f = reinterpret_cast<const float*>(got.data());
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(f[i], 8.f * v[i]) << i;
}

// Slot tests: x (weight, host-written with (i % 7) - 3) and acc (zeroed), both host-accessed on
// tile 0; sums() runs program p and gives acc's values.
struct SlotSums {
  Graph g{tiny()};  // first: x and acc are made in it
  explicit SlotSums(std::size_t n)
      : x(g.add_variable(DType::f32, {n}, "x", MemoryCategory::weight)),
        acc(g.add_variable(DType::f32, {n}, "acc")) {
    for (const Tensor& t : {x, acc}) {
      g.set_tile_mapping(t, 0);
      g.set_host_access(t);
    }
    for (std::size_t i = 0; i < n; ++i) v.push_back(static_cast<float>(i % 7) - 3.0f);
  }
  std::vector<float> sums(Engine& e) const {
    const std::vector<float> zero(v.size(), 0.0f);
    e.write(x, std::as_bytes(std::span(v)));
    e.write(acc, std::as_bytes(std::span(zero)));
    e.run("p");
    return e.read_values(acc);
  }
  Tensor x, acc;
  std::vector<float> v;
};

TEST(Liveness, ValuesLiveInInterleavedStretchesShareBytes) {
  // As in a grouped pipeline's slots: f is made and used in slots 1 and 3, b in slots 2 and 4.
  // Their first-to-last spans overlap but they are never live at the same step, so they share
  // bytes; the sums show neither overwrote the other while it was live.
  SlotSums t(4096);
  Graph& g = t.g;
  Program forward, backward;
  ops::scaled_add_in_place(g, forward, t.acc, ops::relu(g, forward, t.x, "f"), 1.0f, "acc+=f");
  Tensor negative = ops::unary(g, backward, ops::UnaryOp::neg, t.x, 0.0f, "minus x");
  ops::scaled_add_in_place(g, backward, t.acc, ops::relu(g, backward, negative, "b"), 10.0f,
                           "acc+=10b");
  Engine e(g, {{"p", Program::sequence({forward, backward, forward, backward})}});
  // acc (host access: live throughout), f sharing with minus x, and b: three, not four.
  EXPECT_EQ(e.memory().tiles[0].not_always_live, 3 * 4096 * 4u);
  const std::vector<float> f = t.sums(e);
  for (std::size_t i = 0; i < t.v.size(); ++i)
    ASSERT_EQ(f[i], 2.0f * std::max(t.v[i], 0.0f) + 20.0f * std::max(-t.v[i], 0.0f)) << i;
}

TEST(Liveness, ValuesThatNeverMeetStackAtOneOffsetAndAValueMeetingOneGoesAbove) {
  // Slots A B C A U B C V: t1 is live in the A slots, t2 in the B slots, t3 in the C slots:
  // never at the same step, they share one block (the memory plan keeps them as one column of
  // live steps). u, made in U and read in V, meets t2 and t3, so it needs a block of its own:
  // acc, the column and u make three. The sum shows no value was overwritten while live.
  SlotSums t(2048);
  Graph& g = t.g;
  const float scales[3] = {1.0f, 10.0f, 100.0f};
  std::vector<Program> slot(3);
  for (int i = 0; i < 3; ++i) {
    const std::string name = "t" + std::to_string(i + 1);
    ops::scaled_add_in_place(g, slot[i], t.acc, ops::relu(g, slot[i], t.x, name), scales[i],
                             name + "+");
  }
  Program make_u, use_u;
  Tensor u = ops::relu(g, make_u, t.x, "u");
  ops::scaled_add_in_place(g, use_u, t.acc, u, 1000.0f, "u+");
  Engine e(g, {{"p", Program::sequence(
                         {slot[0], slot[1], slot[2], slot[0], make_u, slot[1], slot[2], use_u})}});
  EXPECT_EQ(e.memory().tiles[0].not_always_live, 3 * 2048 * 4u);
  const std::vector<float> f = t.sums(e);
  for (std::size_t i = 0; i < t.v.size(); ++i)
    ASSERT_EQ(f[i], 1222.0f * std::max(t.v[i], 0.0f)) << i;
}

TEST(Liveness, AValueAWriteInABranchMayReplaceStaysLiveAcrossTheBranch) {
  // h is set, a temporary u lives and dies, a branch that is not taken would overwrite h, then
  // h is read: since the branch may not run, u must not take h's bytes.
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {512}, "x", MemoryCategory::weight);
  Tensor h = g.add_variable(DType::f32, {512}, "h");
  Tensor out = g.add_variable(DType::f32, {512}, "out");
  Tensor take = g.add_variable(DType::i32, {1}, "take");
  for (const Tensor& t : {x, h, out, take}) g.set_tile_mapping(t, 3);
  for (const Tensor& t : {x, out, take}) g.set_host_access(t);
  Program p;
  p.add(Program::copy(x, h));
  Tensor u = ops::relu(g, p, ops::relu(g, p, x, "t"), "u");
  ops::scaled_add_in_place(g, p, out, u, 0.0f, "use u");
  p.add(Program::if_else(take, Program::copy(x, h)));
  p.add(Program::copy(h, out));
  Engine e(g, {{"p", p}});
  std::vector<float> v(512);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 1000.0f;
  const std::int32_t no = 0;
  e.write(x, std::as_bytes(std::span(v)));
  e.write(out, std::as_bytes(std::span(v)));
  e.write(take, std::as_bytes(std::span(&no, 1)));
  e.run("p");
  const auto got = e.read(out);
  const float* f = reinterpret_cast<const float*>(got.data());
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(f[i], v[i]) << i;
}

}  // namespace
}  // namespace ipupod::ipu

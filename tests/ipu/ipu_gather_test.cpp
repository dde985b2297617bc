// The lookup op library (gather, scatter-add, vector quantisation) against plain CPU references
// written here, on awkward shapes (primes, wide rows, a table over one tile's memory) on the tiny
// IPU, each run with 1 and 2 engine threads and required to give bitwise identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/gather.hpp"
#include "tests/ipu/op_run.hpp"

namespace ipupod::ipu {
namespace {

// ---- lookups ----

std::vector<std::int32_t> random_indices(std::size_t n, std::size_t rows, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(rows) - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = d(gen);
  v.front() = 0;  // both ends of the table, and a repeat
  v.back() = static_cast<std::int32_t>(rows) - 1;
  if (n > 2) v[1] = v.back();
  return v;
}

struct LookupCase {
  std::size_t rows, dim;
  std::vector<std::size_t> index_shape;
  bool planned_table;  // made by create_lookup_table: no rearrangement needed
};

class LookupTest : public ::testing::TestWithParam<LookupCase> {};

TEST_P(LookupTest, GatherAndScatterAddMatchReferenceExactly) {
  const auto& [rows, dim, index_shape, planned] = GetParam();
  const std::size_t n = product(index_shape);
  std::vector<std::size_t> dy_shape = index_shape;
  dy_shape.push_back(dim);
  OpRun op;
  op.input_values = {random_floats(rows * dim, 8), random_floats(n * dim, 9)};
  op.int_values = {random_indices(n, rows, 10)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor table = planned ? ops::create_lookup_table(g, rows, dim, n, "table")
                           : input(g, {rows, dim}, "table", {3, 1, 0});
    Tensor idx = g.add_variable(DType::i32, index_shape, "indices");
    g.map_linearly(idx, 1, 7);
    Tensor dy = input(g, dy_shape, "dy", {1, 4, 9});
    in = {table, dy, idx};
    out = {ops::gather_rows(g, p, table, idx, "gather"),
           ops::scatter_add_rows(g, p, dy, idx, rows, "scatter")};
  };
  const auto out = op.run_checked();
  const Floats &table = op.input_values[0], &dy = op.input_values[1];
  const auto& idx = op.int_values[0];
  Floats gathered(n * dim), scattered(rows * dim, 0.f);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < dim; ++j) {
      gathered[i * dim + j] = table[std::size_t(idx[i]) * dim + j];
      scattered[std::size_t(idx[i]) * dim + j] += dy[i * dim + j];  // in order of i
    }
  EXPECT_EQ(out[0], gathered);
  EXPECT_EQ(out[1], scattered);
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, LookupTest,
    ::testing::Values(LookupCase{37, 5, {3, 7}, false},     // fewer rows than... a prime table
                      LookupCase{1000, 3, {11}, false},     // many rows per tile
                      LookupCase{5, 301, {4}, false},       // wide rows: columns split over tiles
                      LookupCase{3001, 13, {2, 29}, true},  // table > one tile's 128 KiB
                      LookupCase{1, 1, {1}, true}));

TEST(Lookup, PlanSplitsColumnsOnlyForWideRows) {
  Graph g(ArchPreset::get("tiny"));
  const auto wide = ops::LookupPlan::make(g, 5, 301, 4);
  EXPECT_GT(wide.col_blocks, 1u);
  EXPECT_LE(wide.row_blocks * wide.col_blocks, g.tiles());
  const auto tall = ops::LookupPlan::make(g, 3001, 13, 58);
  EXPECT_EQ(tall.col_blocks, 1u);
  EXPECT_EQ(tall.row_blocks, g.tiles());
}

TEST(Lookup, IndexOutsideTheTableStopsTheRunWithItsPosition) {
  for (bool scatter : {false, true}) {
    Graph g(ArchPreset::get("tiny"));
    Program p;
    Tensor table = input(g, {37, 4}, "table", {});
    Tensor dy = input(g, {5, 4}, "dy", {});
    Tensor idx = g.add_variable(DType::i32, {5}, "indices");
    g.map_linearly(idx);
    if (scatter)
      ops::scatter_add_rows(g, p, dy, idx, 37, "scatter");
    else
      ops::gather_rows(g, p, table, idx, "gather");
    g.set_host_access(idx);
    Engine e(g, {{"p", p}});
    const std::vector<std::int32_t> bad = {0, 3, 37, 1, -2};
    e.write(idx, std::as_bytes(std::span(bad)));
    try {
      e.run("p");
      ADD_FAILURE() << "an index outside the table was accepted";
    } catch (const std::out_of_range& error) {
      EXPECT_NE(std::string(error.what()).find("index 37 at position 2 is outside [0, 37)"),
                std::string::npos)
          << error.what();
    }
  }
}

TEST(Lookup, BadShapesGetClearErrors) {
  Graph g(ArchPreset::get("tiny"));
  Program p;
  Tensor table = input(g, {10, 4}, "table", {});
  Tensor fidx = input(g, {3}, "float_indices", {});
  Tensor dy = input(g, {3, 5}, "dy", {});
  Tensor idx = g.add_variable(DType::i32, {3}, "indices");
  g.map_linearly(idx);
  EXPECT_THROW(ops::gather_rows(g, p, table, fidx, "gather"), std::invalid_argument);
  EXPECT_THROW(ops::gather_rows(g, p, fidx, idx, "gather"), std::invalid_argument);
  try {
    ops::vq_nearest(g, p, dy, table, "vq");
    ADD_FAILURE() << "a codebook of the wrong width was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("codebook float32[codes >= 1, 5], got float32[10,4]"),
              std::string::npos)
        << error.what();
  }
}

// ---- vector quantisation ----

std::vector<std::int32_t> ref_nearest(const Floats& z, const Floats& codebook, std::size_t dim) {
  const std::size_t n = z.size() / dim, k = codebook.size() / dim;
  std::vector<std::int32_t> out(n);
  for (std::size_t r = 0; r < n; ++r) {
    double best = INFINITY;
    for (std::size_t c = 0; c < k; ++c) {
      double dist = 0;
      for (std::size_t j = 0; j < dim; ++j) {
        const double d = double(z[r * dim + j]) - codebook[c * dim + j];
        dist += d * d;
      }
      if (dist < best) best = dist, out[r] = static_cast<std::int32_t>(c);
    }
  }
  return out;
}

struct VqCase {
  std::size_t n, codes, dim;
};

class VqTest : public ::testing::TestWithParam<VqCase> {};

TEST_P(VqTest, NearestCodeAndEmaUpdateMatchReference) {
  const auto [n, codes, dim] = GetParam();
  const double decay = 0.9, eps = 1e-5;
  OpRun op;
  Floats codebook = random_floats(codes * dim, 11);
  // Duplicate codes tie: the lowest index must win. Some rows sit exactly on a code.
  for (std::size_t j = 0; j < dim; ++j) codebook[(codes - 1) * dim + j] = codebook[j];
  Floats z = random_floats(n * dim, 12);
  for (std::size_t j = 0; j < dim; ++j) z[j] = codebook[j];
  Floats cluster = random_floats(codes, 13, 0.f, 3.f);
  cluster[1 % codes] = 0.f;  // a code with no history
  op.input_values = {z, codebook, cluster, random_floats(codes * dim, 14)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor zt = input(g, {n, dim}, "z", {1, 2, 0});
    Tensor cb = input(g, {codes, dim}, "codebook", {dim, 5, 3});
    Tensor cs = input(g, {codes}, "cluster_size", {1, 30, 2});
    Tensor es = input(g, {codes, dim}, "embed_sum", {1, 0, 0});
    Tensor nearest = ops::vq_nearest(g, p, zt, cb, "vq");
    ops::vq_ema_update(g, p, zt, nearest, cb, cs, es, decay, eps, "vq_ema");
    in = {zt, cb, cs, es};
    out = {nearest, cb, cs, es};
  };
  const auto out = op.run_checked();
  const auto nearest = ref_nearest(z, codebook, dim);
  EXPECT_EQ(ints(out[0]), nearest);
  EXPECT_EQ(nearest[0], 0);
  // The reference EMA update (the model interpreter's formula, in double).
  Floats ref_cb = codebook, ref_cs = cluster, ref_es = op.input_values[3];
  std::vector<double> counts(codes, 0), sums(codes * dim, 0);
  for (std::size_t r = 0; r < n; ++r) {
    counts[std::size_t(nearest[r])] += 1;
    for (std::size_t j = 0; j < dim; ++j) sums[std::size_t(nearest[r]) * dim + j] += z[r * dim + j];
  }
  double total = 0;
  for (std::size_t c = 0; c < codes; ++c) {
    ref_cs[c] = float(decay * ref_cs[c] + (1 - decay) * counts[c]);
    total += ref_cs[c];
    for (std::size_t j = 0; j < dim; ++j)
      ref_es[c * dim + j] = float(decay * ref_es[c * dim + j] + (1 - decay) * sums[c * dim + j]);
  }
  for (std::size_t c = 0; c < codes; ++c) {
    if (ref_cs[c] <= 0.f) continue;
    const double smoothed = (ref_cs[c] + eps) / (total + double(codes) * eps) * total;
    for (std::size_t j = 0; j < dim; ++j)
      ref_cb[c * dim + j] = float(ref_es[c * dim + j] / smoothed);
  }
  EXPECT_EQ(out[1], ref_cb);
  EXPECT_EQ(out[2], ref_cs);
  EXPECT_EQ(out[3], ref_es);
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, VqTest,
                         ::testing::Values(VqCase{29, 11, 3}, VqCase{300, 64, 8}, VqCase{1, 2, 1},
                                           VqCase{4001, 7, 5}));

}  // namespace
}  // namespace ipupod::ipu

// Softmax, normalisation and lookup op libraries against plain CPU references written here, on
// awkward shapes (primes, fewer rows than tiles, more than one tile's memory) on the tiny IPU,
// each run with 1 and 2 engine threads and required to give bitwise identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/gather.hpp"
#include "ipu_process/ops/norm.hpp"
#include "ipu_process/ops/softmax.hpp"

namespace ipupod::ipu {
namespace {

using Floats = std::vector<float>;

Floats random_floats(std::size_t n, unsigned seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Floats v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Builds a graph on the tiny IPU, writes the inputs (int32 inputs from int_values, the others
// from input_values, each in order), runs once and reads the outputs' bytes into Floats (int32
// outputs are read back with ints()), for a given number of engine threads.
struct OpRun {
  std::function<void(Graph&, Program&, std::vector<Tensor>& inputs, std::vector<Tensor>& outputs)>
      build;
  std::vector<Floats> input_values;
  std::vector<std::vector<std::int32_t>> int_values;

  std::vector<Floats> run(unsigned threads) const {
    Graph g(ArchPreset::get("tiny"));
    Program p;
    std::vector<Tensor> inputs, outputs;
    build(g, p, inputs, outputs);
    for (const Tensor& t : inputs) g.set_host_access(t);
    for (const Tensor& t : outputs) g.set_host_access(t);
    Engine e(g, {{"p", p}}, {.threads = threads});
    std::size_t next_float = 0, next_int = 0;
    for (const Tensor& t : inputs) {
      if (t.dtype() == DType::i32)
        e.write(t, std::as_bytes(std::span(int_values.at(next_int++))));
      else
        e.write(t, std::as_bytes(std::span(input_values.at(next_float++))));
    }
    e.run("p");
    EXPECT_GT(e.cycles().compute, 0u);
    std::vector<Floats> out;
    for (const Tensor& t : outputs) {
      const auto bytes = e.read(t);
      Floats v(bytes.size() / sizeof(float));
      std::memcpy(v.data(), bytes.data(), bytes.size());
      out.push_back(std::move(v));
    }
    return out;
  }
  // Runs with 1 and 2 threads, requires identical bits, returns the outputs.
  std::vector<Floats> run_checked() const {
    const auto one = run(1), two = run(2);
    EXPECT_EQ(one.size(), two.size());
    for (std::size_t i = 0; i < one.size() && i < two.size(); ++i)
      EXPECT_EQ(0, std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(float)))
          << "output " << i << " differs between 1 and 2 engine threads";
    return one;
  }
};

std::vector<std::int32_t> ints(const Floats& raw) {
  std::vector<std::int32_t> v(raw.size());
  std::memcpy(v.data(), raw.data(), raw.size() * sizeof(float));
  return v;
}

void expect_near_all(const Floats& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

std::size_t product(const std::vector<std::size_t>& s) {
  std::size_t p = 1;
  for (auto d : s) p *= d;
  return p;
}

// A variable spread over the tiles: grain, first tile and tile count pick awkward layouts.
struct Layout {
  std::size_t grain = 1;
  unsigned first_tile = 0, tile_count = 0;
};

Tensor input(Graph& g, std::vector<std::size_t> shape, const std::string& name, Layout l) {
  Tensor t = g.add_variable(DType::f32, std::move(shape), name);
  g.map_linearly(t, l.grain, l.first_tile, l.tile_count);
  return t;
}

// ---- CPU references (double precision) ----

std::vector<double> ref_softmax(const Floats& x, std::size_t n) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r * n < x.size(); ++r) {
    double mx = -INFINITY, s = 0;
    for (std::size_t c = 0; c < n; ++c) mx = std::max<double>(mx, x[r * n + c]);
    for (std::size_t c = 0; c < n; ++c) s += std::exp(x[r * n + c] - mx);
    for (std::size_t c = 0; c < n; ++c) y[r * n + c] = std::exp(x[r * n + c] - mx) / s;
  }
  return y;
}

// Element indices of every normalisation set of x.
std::vector<std::vector<std::size_t>> norm_sets(const std::vector<std::size_t>& shape,
                                                ops::NormKind kind, std::size_t groups) {
  const std::size_t total = product(shape);
  std::vector<std::vector<std::size_t>> sets;
  if (kind == ops::NormKind::batch) {
    const std::size_t n = shape[0], c = shape[1], sp = total / (n * c);
    sets.resize(c);
    for (std::size_t i = 0; i < total; ++i) sets[(i / sp) % c].push_back(i);
    return sets;
  }
  const std::size_t count =
      kind == ops::NormKind::layer ? shape.back() : total / (shape[0] * groups);
  sets.resize(total / count);
  for (std::size_t i = 0; i < total; ++i) sets[i / count].push_back(i);
  return sets;
}

std::pair<double, double> mean_var(const Floats& x, const std::vector<std::size_t>& set) {
  double m = 0, v = 0;
  for (auto i : set) m += x[i];
  m /= double(set.size());
  for (auto i : set) v += (x[i] - m) * (x[i] - m);
  return {m, v / double(set.size())};
}

std::vector<double> ref_normalize(const Floats& x, const std::vector<std::size_t>& shape,
                                  const ops::NormParams& p) {
  std::vector<double> y(x.size());
  for (const auto& set : norm_sets(shape, p.kind, p.groups)) {
    const auto [m, v] = mean_var(x, set);
    for (auto i : set) y[i] = (x[i] - m) / std::sqrt(v + p.eps);
  }
  return y;
}

std::vector<double> ref_normalize_grad(const Floats& dy, const Floats& x,
                                       const std::vector<std::size_t>& shape,
                                       const ops::NormParams& p) {
  std::vector<double> dx(x.size());
  for (const auto& set : norm_sets(shape, p.kind, p.groups)) {
    const auto [m, v] = mean_var(x, set);
    const double inv = 1 / std::sqrt(v + p.eps);
    double mdy = 0, mdyx = 0;
    for (auto i : set) mdy += dy[i], mdyx += dy[i] * (x[i] - m) * inv;
    mdy /= double(set.size());
    mdyx /= double(set.size());
    for (auto i : set) dx[i] = inv * (dy[i] - mdy - (x[i] - m) * inv * mdyx);
  }
  return dx;
}

// ---- softmax ----

struct SoftmaxCase {
  std::vector<std::size_t> shape;
  Layout layout;
};

class SoftmaxTest : public ::testing::TestWithParam<SoftmaxCase> {};

TEST_P(SoftmaxTest, ForwardAndGradientMatchReference) {
  const auto& [shape, layout] = GetParam();
  const std::size_t total = product(shape), n = shape.back();
  OpRun op;
  op.input_values = {random_floats(total, 1, -4.f, 4.f), random_floats(total, 2)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor x = input(g, shape, "x", layout);
    // dy laid out differently from y: softmax_grad must rearrange it
    Tensor dy = input(g, shape, "dy", {3, 5, 7});
    Tensor y = ops::softmax(g, p, x, "softmax");
    Tensor dx = ops::softmax_grad(g, p, dy, y, "softmax_grad");
    in = {x, dy};
    out = {y, dx};
  };
  const auto out = op.run_checked();
  const auto y = ref_softmax(op.input_values[0], n);
  expect_near_all(out[0], y, 1e-5, "softmax");
  std::vector<double> dx(total);
  const Floats& dy = op.input_values[1];
  for (std::size_t r = 0; r * n < total; ++r) {
    double dot = 0;
    for (std::size_t c = 0; c < n; ++c) dot += dy[r * n + c] * double(out[0][r * n + c]);
    for (std::size_t c = 0; c < n; ++c) dx[r * n + c] = out[0][r * n + c] * (dy[r * n + c] - dot);
  }
  expect_near_all(out[1], dx, 1e-5, "softmax_grad");
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, SoftmaxTest,
    ::testing::Values(SoftmaxCase{{7, 13}, {1, 0, 0}},       // rows cut mid-way across tiles
                      SoftmaxCase{{1, 1}, {1, 0, 0}},        // one element
                      SoftmaxCase{{2, 3, 5}, {4, 9, 2}},     // rank 3 on two tiles
                      SoftmaxCase{{97, 3}, {1, 30, 1}},      // every row on one tile
                      SoftmaxCase{{2, 40009}, {1, 0, 0}}));  // a row > one tile's 128 KiB

// ---- normalisation ----

struct NormCase {
  std::vector<std::size_t> shape;
  ops::NormParams params;
  Layout layout;
};

class NormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormTest, ForwardAndGradientMatchReference) {
  const auto& [shape, params, layout] = GetParam();
  const std::size_t total = product(shape);
  OpRun op;
  // An offset keeps the mean away from zero, which a one-pass variance would get wrong.
  op.input_values = {random_floats(total, 3, 2.f, 5.f), random_floats(total, 4)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor x = input(g, shape, "x", layout);
    Tensor dy = input(g, shape, "dy", {2, 1, 13});
    in = {x, dy};
    out = {ops::normalize(g, p, x, params, "norm"),
           ops::normalize_grad(g, p, dy, x, params, "norm_grad")};
  };
  const auto out = op.run_checked();
  const std::string kind = ops::norm_kind_name(params.kind);
  expect_near_all(out[0], ref_normalize(op.input_values[0], shape, params), 2e-4, kind);
  expect_near_all(out[1], ref_normalize_grad(op.input_values[1], op.input_values[0], shape, params),
                  2e-4, kind + " grad");
}

ops::NormParams norm(ops::NormKind kind, double eps, std::size_t groups = 1) {
  return {kind, eps, groups};
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, NormTest,
    ::testing::Values(
        NormCase{{3, 5, 7, 11}, norm(ops::NormKind::batch, 1e-5), {1, 0, 0}},
        NormCase{{13, 17}, norm(ops::NormKind::batch, 1e-3), {5, 2, 9}},       // channels strided
        NormCase{{2, 3, 20011}, norm(ops::NormKind::batch, 1e-5), {1, 0, 0}},  // > one tile
        NormCase{{5, 3, 97}, norm(ops::NormKind::layer, 1e-5), {1, 0, 0}},
        NormCase{{3, 40009}, norm(ops::NormKind::layer, 1e-6), {1, 0, 0}},  // row > one tile
        NormCase{{1, 2}, norm(ops::NormKind::layer, 1e-5), {1, 31, 1}},
        NormCase{{3, 6, 5, 7}, norm(ops::NormKind::group, 1e-5, 3), {7, 1, 0}},
        NormCase{{2, 4, 17}, norm(ops::NormKind::group, 1e-5, 4), {1, 0, 3}},
        NormCase{{2, 5, 3}, norm(ops::NormKind::group, 1e-5, 1), {1, 0, 0}}));

TEST(BatchNorm, InferenceAndRunningStatisticsMatchReference) {
  const std::vector<std::size_t> shape = {5, 7, 3, 11};
  const std::size_t total = product(shape), c = 7, sp = 33;
  const double eps = 1e-3, momentum = 0.1;
  OpRun op;
  op.input_values = {random_floats(total, 5, -2.f, 3.f), random_floats(c, 6, -1.f, 1.f),
                     random_floats(c, 7, 0.5f, 2.f)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor x = input(g, shape, "x", {1, 0, 0});
    Tensor mean = input(g, {c}, "running_mean", {1, 20, 3});
    Tensor var = input(g, {c}, "running_var", {2, 5, 2});
    for (Tensor* t : {&mean, &var}) *t = t->reshape({c});
    Tensor y = ops::batch_norm_inference(g, p, x, mean, var, eps, "bn_inference");
    ops::batch_norm_stats_update(g, p, x, mean, var, momentum, "bn_update");
    in = {x, mean, var};
    out = {y, mean, var};
  };
  const auto out = op.run_checked();
  const Floats &x = op.input_values[0], &rm = op.input_values[1], &rv = op.input_values[2];
  std::vector<double> y(total), mean(c), var(c);
  const auto sets = norm_sets(shape, ops::NormKind::batch, 1);
  for (std::size_t ch = 0; ch < c; ++ch) {
    for (auto i : sets[ch]) y[i] = (x[i] - rm[ch]) / std::sqrt(rv[ch] + eps);
    const auto [m, v] = mean_var(x, sets[ch]);
    const double n = double(sets[ch].size());
    mean[ch] = (1 - momentum) * rm[ch] + momentum * m;
    var[ch] = (1 - momentum) * rv[ch] + momentum * v * n / (n - 1);
  }
  ASSERT_EQ(sets[0].size(), 5 * sp);
  expect_near_all(out[0], y, 1e-5, "batch_norm_inference");
  expect_near_all(out[1], mean, 1e-5, "running mean");
  expect_near_all(out[2], var, 1e-5, "running var");
}

// Predicted compute cycles of layer normalisation with its rows on the given tiles.
std::uint64_t layer_norm_compute_cycles(std::size_t rows, std::size_t length, unsigned tiles) {
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {rows, length}, "x");
  g.map_linearly(x, length, 0, tiles);
  Program p;
  ops::normalize(g, p, x, norm(ops::NormKind::layer, 1e-5), "ln");
  Engine e(g, {{"p", p}});
  e.run("p");
  return e.cycles().compute;
}

TEST(Norm, CycleEstimatesScaleWithWorkAndTiles) {
  const double one = double(layer_norm_compute_cycles(32, 200, 1));
  const double twice_the_work = double(layer_norm_compute_cycles(64, 200, 1));
  const double twice_the_tiles = double(layer_norm_compute_cycles(64, 200, 2));
  std::cout << "layer norm [32,200] on 1 tile: " << one
            << " cycles; [64,200] on 1 tile: " << twice_the_work
            << "; on 2 tiles: " << twice_the_tiles << "\n";
  EXPECT_GT(twice_the_work / one, 1.7);
  EXPECT_LT(twice_the_work / one, 2.3);
  EXPECT_GT(twice_the_tiles / twice_the_work, 0.4);
  EXPECT_LT(twice_the_tiles / twice_the_work, 0.65);
}

TEST(Norm, BadInputsGetClearErrors) {
  Graph g(ArchPreset::get("tiny"));
  Program p;
  Tensor x = input(g, {4, 6, 5}, "x", {});
  Tensor v = input(g, {6}, "v", {});
  Tensor wrong = input(g, {5}, "wrong", {});
  const auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              ops::normalize(g, p, x, norm(ops::NormKind::group, 1e-5, 4), "gn");
            }).find("6 channels into 4 groups"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops::normalize(g, p, v, norm(ops::NormKind::batch, 1e-5), "bn");
            }).find("needs x [n, c, ...], got shape [6]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops::batch_norm_inference(g, p, x, v, wrong, 1e-5, "bni");
            }).find("must be float32[6]"),
            std::string::npos);
  EXPECT_NE(message([&] { ops::softmax_grad(g, p, v, x, "sg"); }).find("dy shaped like y"),
            std::string::npos);
}

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

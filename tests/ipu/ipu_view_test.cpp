// Views that copy nothing (slice, reshape, transpose, broadcast, concat over regions of
// variables) checked against a plain CPU model of the same index arithmetic, through copies and
// vertices run on the engine; and WriteUndef, which ends live ranges.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <numeric>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {
namespace {

const ArchPreset& tiny() {
  return ArchPreset::get("tiny");
}

// The CPU model: a view is a shape and, for each logical element in row-major order, the id of
// the variable element it names (the variable's base id plus the element's index).
struct Ref {
  std::vector<std::size_t> shape;
  std::vector<std::size_t> ids;
};

std::vector<std::size_t> unflatten(std::size_t flat, const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

std::size_t flatten_index(const std::vector<std::size_t>& idx,
                          const std::vector<std::size_t>& shape) {
  std::size_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// Builds out element by element: out[idx] = in[source(idx)], both as multi-indices.
Ref gather(const Ref& in, std::vector<std::size_t> shape,
           const std::function<std::vector<std::size_t>(const std::vector<std::size_t>&)>& source) {
  Ref out{shape, std::vector<std::size_t>(count(shape))};
  for (std::size_t j = 0; j < out.ids.size(); ++j)
    out.ids[j] = in.ids[flatten_index(source(unflatten(j, shape)), in.shape)];
  return out;
}

Ref ref_slice(const Ref& in, std::size_t b, std::size_t e, std::size_t dim) {
  auto shape = in.shape;
  shape[dim] = e - b;
  return gather(in, shape, [&](std::vector<std::size_t> idx) {
    idx[dim] += b;
    return idx;
  });
}

Ref ref_permute(const Ref& in, const std::vector<std::size_t>& perm) {
  std::vector<std::size_t> shape(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) shape[i] = in.shape[perm[i]];
  return gather(in, shape, [&](const std::vector<std::size_t>& idx) {
    std::vector<std::size_t> old(idx.size());
    for (std::size_t i = 0; i < perm.size(); ++i) old[perm[i]] = idx[i];
    return old;
  });
}

Ref ref_broadcast(const Ref& in, std::size_t n, std::size_t dim) {
  auto shape = in.shape;
  shape[dim] *= n;
  return gather(in, shape, [&](std::vector<std::size_t> idx) {
    idx[dim] %= in.shape[dim];
    return idx;
  });
}

Ref ref_expand(const Ref& in, const std::vector<std::size_t>& shape) {
  const std::size_t lead = shape.size() - in.shape.size();
  return gather(in, shape, [&](const std::vector<std::size_t>& idx) {
    std::vector<std::size_t> old(in.shape.size());
    for (std::size_t d = 0; d < old.size(); ++d) old[d] = in.shape[d] == 1 ? 0 : idx[d + lead];
    return old;
  });
}

Ref ref_concat(const std::vector<Ref>& parts, std::size_t dim) {
  auto shape = parts[0].shape;
  shape[dim] = 0;
  for (const auto& p : parts) shape[dim] += p.shape[dim];
  Ref out{shape, std::vector<std::size_t>(count(shape))};
  for (std::size_t j = 0; j < out.ids.size(); ++j) {
    auto idx = unflatten(j, shape);
    std::size_t k = 0;
    while (idx[dim] >= parts[k].shape[dim]) idx[dim] -= parts[k++].shape[dim];
    out.ids[j] = parts[k].ids[flatten_index(idx, parts[k].shape)];
  }
  return out;
}

Ref ref_index(const Ref& in, std::size_t i, std::size_t dim) {
  Ref r = ref_slice(in, i, i + 1, dim);
  r.shape.erase(r.shape.begin() + static_cast<std::ptrdiff_t>(dim));
  return r;
}

Ref ref_reshape(Ref in, std::vector<std::size_t> shape) {
  in.shape = std::move(shape);
  return in;
}

// Variables whose elements' ids are base + index; filled on the device with their ids.
struct Source {
  Tensor t;
  std::size_t base;
  Ref ref() const {
    Ref r{t.shape(), std::vector<std::size_t>(t.elements())};
    std::iota(r.ids.begin(), r.ids.end(), base);
    return r;
  }
};

// The ids a view names, read off its regions: what it would copy, in order.
std::vector<std::size_t> ids_of(const View& v, const std::vector<Source>& sources) {
  std::vector<std::size_t> ids;
  for (const auto& r : v.view_regions())
    for (std::size_t i = r.begin; i < r.end; ++i) ids.push_back(sources.at(r.var).base + i);
  return ids;
}

struct Case {
  std::string name;
  View view;
  Ref ref;
};

// Three variables of prime-sized dimensions, each spread over several tiles in pieces that do
// not line up with rows, and views of them built by every operation and by compositions.
struct ViewGraph {
  Graph g{tiny()};
  std::vector<Source> sources;
  std::vector<Case> cases;

  ViewGraph() {
    const auto add = [&](std::vector<std::size_t> shape, const char* name, unsigned first_tile,
                         unsigned tiles) {
      Tensor t = g.add_variable(DType::f32, shape, name);
      g.map_linearly(t, 3, first_tile, tiles);
      g.set_host_access(t);
      const std::size_t base =
          sources.empty() ? 0 : sources.back().base + sources.back().t.elements();
      sources.push_back({t, base});
    };
    add({3, 5, 7}, "a", 0, 4);  // 105 elements over tiles 0-3
    add({3, 2, 7}, "b", 4, 3);
    add({1, 5, 1}, "c", 7, 2);
    const View a = sources[0].t, b = sources[1].t, c = sources[2].t;
    const Ref ra = sources[0].ref(), rb = sources[1].ref(), rc = sources[2].ref();
    const auto add_case = [&](std::string name, View v, Ref r) {
      cases.push_back({std::move(name), std::move(v), std::move(r)});
    };
    for (std::size_t d = 0; d < 3; ++d) {
      add_case("slice dim " + std::to_string(d), a.slice(1, a.dim(d), d),
               ref_slice(ra, 1, a.dim(d), d));
      add_case("index dim " + std::to_string(d), a.index(a.dim(d) - 1, d),
               ref_index(ra, a.dim(d) - 1, d));
    }
    std::vector<std::size_t> perm = {0, 1, 2};
    do {
      add_case(
          "permute " + std::to_string(perm[0]) + std::to_string(perm[1]) + std::to_string(perm[2]),
          a.permute(perm), ref_permute(ra, perm));
    } while (std::next_permutation(perm.begin(), perm.end()));
    add_case("transpose", a.transpose(), ref_permute(ra, {0, 2, 1}));
    add_case("flatten of a transpose", a.transpose().flatten(),
             ref_reshape(ref_permute(ra, {0, 2, 1}), {105}));
    add_case("broadcast size-1 dim", c.broadcast(3, 0), ref_broadcast(rc, 3, 0));
    add_case("broadcast repeats a dim", a.broadcast(2, 1), ref_broadcast(ra, 2, 1));
    add_case("expand", c.expand({2, 3, 5, 7}), ref_expand(rc, {2, 3, 5, 7}));
    add_case("concat dim 1", View::concat({a, b}, 1), ref_concat({ra, rb}, 1));
    add_case(
        "concat dim 0 of slices",
        View::concat({a.slice(2, 3, 0), a.slice(0, 2, 0), a.slice(1, 2, 0)}, 0),
        ref_concat({ref_slice(ra, 2, 3, 0), ref_slice(ra, 0, 2, 0), ref_slice(ra, 1, 2, 0)}, 0));
    add_case(
        "concat dim 2 of a transpose and a broadcast",
        View::concat({a.slice(0, 2, 1), c.expand({3, 5, 3}).slice(0, 2, 1), b}, 2),
        ref_concat({ref_slice(ra, 0, 2, 1), ref_slice(ref_expand(rc, {3, 5, 3}), 0, 2, 1), rb}, 2));
    // Compositions: reshapes of non-contiguous views, slices of transposes, and back again.
    {
      View v = a.transpose().reshape({105}).slice(10, 50).reshape({8, 5}).transpose();
      Ref r = ref_permute(
          ref_reshape(ref_slice(ref_reshape(ref_permute(ra, {0, 2, 1}), {105}), 10, 50, 0), {8, 5}),
          {1, 0});
      add_case("reshape-slice-transpose chain", v, r);
    }
    {
      View v = View::concat(
                   {a.permute({2, 0, 1}).slice(1, 4, 0), b.permute({2, 0, 1}).slice(0, 3, 0)}, 2)
                   .permute({1, 2, 0})
                   .broadcast(2, 0)
                   .slice(2, 5, 0);
      Ref r = ref_slice(
          ref_broadcast(ref_permute(ref_concat({ref_slice(ref_permute(ra, {2, 0, 1}), 1, 4, 0),
                                                ref_slice(ref_permute(rb, {2, 0, 1}), 0, 3, 0)},
                                               2),
                                    {1, 2, 0}),
                        2, 0),
          2, 5, 0);
      add_case("concat of permuted slices, permuted, broadcast, sliced", v, r);
    }
  }
};

TEST(Views, RegionsMatchTheIndexArithmeticOfACpuReference) {
  ViewGraph vg;
  for (const auto& c : vg.cases) {
    EXPECT_EQ(c.view.shape(), c.ref.shape) << c.name;
    EXPECT_EQ(ids_of(c.view, vg.sources), c.ref.ids) << c.name;
    // Adjacent runs are merged: no two consecutive regions continue one another.
    const auto& rs = c.view.view_regions();
    for (std::size_t i = 1; i < rs.size(); ++i)
      EXPECT_FALSE(rs[i].var == rs[i - 1].var && rs[i].begin == rs[i - 1].end) << c.name;
  }
}

TEST(Views, ContiguousOperationsStayOneRegion) {
  ViewGraph vg;
  const View a = vg.sources[0].t;
  EXPECT_EQ(a.view_regions().size(), 1u);
  EXPECT_EQ(a.permute({0, 1, 2}).view_regions().size(), 1u);
  EXPECT_EQ(a.transpose().transpose().view_regions().size(), 1u);
  EXPECT_EQ(a.slice(1, 3, 0).view_regions().size(), 1u);
  EXPECT_EQ(View::concat({a.slice(0, 1, 0), a.slice(1, 3, 0)}, 0).view_regions().size(), 1u);
  EXPECT_EQ(a.slice(1, 3, 1).view_regions().size(), 3u);  // one run per outer index
  // Element by element, except where one 5 x 7 block's last element meets the next's first.
  EXPECT_EQ(a.transpose().view_regions().size(), 103u);
  EXPECT_TRUE(View(vg.sources[2].t).expand({4, 5, 1}).has_repeats());
  EXPECT_FALSE(a.transpose().has_repeats());
  const auto regions = a.slice(1, 3, 1).regions();
  EXPECT_EQ(regions[1].offset(), 42u);  // [1][1][0]
  EXPECT_EQ(regions[1].elements(), 14u);
}

TEST(Views, BadShapesAreRejected) {
  ViewGraph vg;
  const View a = vg.sources[0].t, b = vg.sources[1].t;
  EXPECT_THROW(a.reshape({104}), std::invalid_argument);
  EXPECT_THROW(a.slice(2, 6, 1), std::out_of_range);
  EXPECT_THROW(a.slice(0, 1, 3), std::out_of_range);
  EXPECT_THROW(a.permute({0, 0, 1}), std::invalid_argument);
  EXPECT_THROW(a.permute({0, 1}), std::invalid_argument);
  EXPECT_THROW(a.expand({3, 6, 7}), std::invalid_argument);
  EXPECT_THROW(View::concat({a, b}, 0), std::invalid_argument);
  EXPECT_THROW(View(a.flatten()).transpose(), std::invalid_argument);
  // A destination naming an element twice would make the result depend on transfer order.
  Tensor dst = vg.g.add_variable(DType::f32, {3, 5, 7}, "dst");
  EXPECT_THROW(Program::copy(View(dst), View(vg.sources[2].t).expand({3, 5, 7})),
               std::invalid_argument);
  EXPECT_THROW(Program::copy(a, View(dst).slice(0, 2, 0)), std::invalid_argument);
}

TEST(Views, CreatingViewsAddsNoVariableAndNoBytes) {
  const auto memory = [](bool through_views) {
    Graph g(tiny());
    Tensor m = g.add_variable(DType::f32, {13, 17}, "m");
    Tensor t = g.add_variable(DType::f32, {17, 13}, "t");
    g.map_linearly(m, 1, 0, 4);
    g.map_linearly(t, 1, 8, 3);
    g.set_host_access(t);
    const std::size_t variables = g.variables().size();
    Program p;
    if (through_views) {
      const View v = View(m).transpose();
      const View w = View::concat({v, v.slice(0, 1, 0).broadcast(3, 0)}, 0).slice(0, 17, 0);
      EXPECT_EQ(g.variables().size(), variables);
      p.add(Program::copy(w, t));
    } else {
      p.add(Program::copy(m, t));
    }
    EXPECT_EQ(g.variables().size(), variables);
    Engine e(g, {{"p", p}});
    return e.memory().total_bytes();
  };
  EXPECT_EQ(memory(true), memory(false));
}

// Every case copied on the engine from its variables (over tiles 0-8) into a variable of its
// own spread over other tiles: the copied values are the ids the CPU model names.
std::vector<std::vector<float>> copy_cases(unsigned threads) {
  ViewGraph vg;
  Program p;
  std::vector<Tensor> dsts;
  std::vector<std::pair<View, View>> pairs;
  for (std::size_t i = 0; i < vg.cases.size(); ++i) {
    const auto& c = vg.cases[i];
    Tensor d = vg.g.add_variable(DType::f32, c.ref.shape, "dst" + std::to_string(i));
    vg.g.map_linearly(d, 2, 10 + static_cast<unsigned>(i % 20), 2);
    vg.g.set_host_access(d);
    dsts.push_back(d);
    // Half the cases one copy program each, half in one exchange together.
    if (i % 2 == 0)
      p.add(Program::copy(c.view, d));
    else
      pairs.emplace_back(c.view, d);
  }
  p.add(Program::copy_views(pairs));
  Engine e(vg.g, {{"p", p}}, {.threads = threads});
  for (const auto& s : vg.sources) {
    std::vector<float> v(s.t.elements());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(s.base + i);
    write_floats(e, s.t, v);
  }
  e.run("p");
  EXPECT_GT(e.cycles().exchange, 0u);
  std::vector<std::vector<float>> out;
  for (std::size_t i = 0; i < vg.cases.size(); ++i) {
    out.push_back(read_floats(e, dsts[i]));
    std::vector<float> want;
    for (std::size_t id : vg.cases[i].ref.ids) want.push_back(static_cast<float>(id));
    EXPECT_EQ(out.back(), want) << vg.cases[i].name << ", " << threads << " threads";
  }
  return out;
}

TEST(Views, CopiesOnTheEngineMatchTheCpuReference) {
  copy_cases(1);
}

TEST(Views, OneAndTwoEngineThreadsAreBitwiseIdentical) {
  EXPECT_EQ(copy_cases(1), copy_cases(2));
}

TEST(Views, TransposeBroadcastAndConcatCopiedOverTiles) {
  Graph g(tiny());
  Tensor m = g.add_variable(DType::f32, {13, 17}, "m");
  Tensor n = g.add_variable(DType::f32, {13, 5}, "n");
  Tensor row = g.add_variable(DType::f32, {17}, "row");
  Tensor t = g.add_variable(DType::f32, {17, 13}, "t");
  Tensor bc = g.add_variable(DType::f32, {13, 17}, "bc");
  Tensor cat = g.add_variable(DType::f32, {13, 22}, "cat");
  g.map_linearly(m, 1, 0, 4);
  g.set_tile_mapping(n, 5);
  g.set_tile_mapping(row, 6);
  g.map_linearly(t, 1, 10, 3);
  g.set_tile_mapping(bc, 20);
  g.map_linearly(cat, 4, 28, 4);
  for (const Tensor& x : {m, n, row, t, bc, cat}) g.set_host_access(x);
  Program p;
  p.add(Program::copy(View(m).transpose(), t));
  p.add(Program::copy(View(row).expand({13, 17}), bc));
  p.add(Program::copy(View::concat({m, n}, 1), cat));
  Engine e(g, {{"p", p}});
  const auto mv = random_floats(13 * 17, 1), nv = random_floats(13 * 5, 2),
             rv = random_floats(17, 3);
  write_floats(e, m, mv);
  write_floats(e, n, nv);
  write_floats(e, row, rv);
  e.run("p");
  const auto tv = read_floats(e, t), bv = read_floats(e, bc), cv = read_floats(e, cat);
  for (std::size_t i = 0; i < 13; ++i)
    for (std::size_t j = 0; j < 17; ++j) {
      ASSERT_EQ(tv[j * 13 + i], mv[i * 17 + j]) << i << "," << j;
      ASSERT_EQ(bv[i * 17 + j], rv[j]) << i << "," << j;
    }
  for (std::size_t i = 0; i < 13; ++i)
    for (std::size_t j = 0; j < 22; ++j)
      ASSERT_EQ(cv[i * 22 + j], j < 17 ? mv[i * 17 + j] : nv[i * 5 + j - 17]) << i << "," << j;
  // The tile mapping of a view follows its elements: the broadcast row lives on tile 6 only,
  // the transpose alternates between m's tiles.
  const auto bm = g.tile_mapping(View(row).expand({13, 17}));
  ASSERT_EQ(bm.size(), 1u);
  EXPECT_EQ(bm[0].tile, 6u);
  EXPECT_EQ(bm[0].end, 13u * 17u);
  const auto tm = g.tile_mapping(View(m).transpose());
  std::size_t covered = 0;
  for (const auto& iv : tm) {
    EXPECT_EQ(iv.begin, covered);
    covered = iv.end;
    for (std::size_t k = iv.begin; k < iv.end; ++k) {  // logical k is m[i][j], j = k / 13
      const std::size_t flat = (k % 13) * 17 + k / 13;
      const auto mm = g.tile_mapping(m);
      for (const auto& w : mm) {
        if (flat >= w.begin && flat < w.end) {
          ASSERT_EQ(w.tile, iv.tile) << k;
        }
      }
    }
  }
  EXPECT_EQ(covered, 13u * 17u);
  EXPECT_GT(tm.size(), 4u);
}

// A vertex field connected to a view's regions: SumRegions adds region k at its logical offset,
// so it materialises the view on the tile in element order.
TEST(Views, VertexFieldsConnectToAViewsRegions) {
  Graph g(tiny());
  Tensor x = g.add_variable(DType::f32, {6, 7}, "x");  // rows 0-2 on tile 0, rows 3-5 on tile 1
  g.map_linearly(x, 7, 0, 2);
  g.set_host_access(x);
  const auto connect = [&](const View& v, unsigned tile, const std::string& name) {
    Tensor out = g.add_variable(DType::f32, {v.elements()}, name);
    g.set_tile_mapping(out, tile);
    g.set_host_access(out);
    std::vector<double> params = {1.0};
    std::size_t offset = 0;
    for (const auto& r : v.regions()) {
      params.push_back(static_cast<double>(offset));
      offset += r.elements();
    }
    ComputeSetId cs = g.add_compute_set(name);
    g.add_vertex(cs, {"SumRegions", tile, {v.regions(), {out}}, params});
    return std::make_pair(out, cs);
  };
  // Rows 0-2 transposed and broadcast twice: every region on tile 0.
  const View local = View(x).slice(0, 3, 0).transpose().broadcast(2, 0);
  auto [out, cs] = connect(local, 0, "local");
  {
    Engine e(g, {{"p", Program::execute(cs)}});
    const auto xv = random_floats(42, 7);
    write_floats(e, x, xv);
    e.run("p");
    const auto got = read_floats(e, out);
    ASSERT_EQ(got.size(), 42u);
    for (std::size_t r = 0; r < 14; ++r)
      for (std::size_t c = 0; c < 3; ++c) ASSERT_EQ(got[r * 3 + c], xv[c * 7 + r % 7]) << r;
  }
  // The whole transpose reaches rows on tile 1 from a vertex on tile 0: rejected, naming the
  // vertex, the field and the tiles.
  auto [bad_out, bad] = connect(View(x).transpose(), 0, "remote");
  try {
    Engine e(g, {{"p", Program::execute(bad)}});
    FAIL() << "expected a tile-locality error";
  } catch (const std::logic_error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("SumRegions"), std::string::npos) << msg;
    EXPECT_NE(msg.find("on tile 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("field 'regions'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lives on tile 1"), std::string::npos) << msg;
  }
}

// The WriteUndef tests' graph: a weight w, a result out that the host reads, and two scratch
// buffers x and y, all of kScratch float32 on one tile.
constexpr std::size_t kScratch = 4096;  // 16 KiB per buffer

struct UndefRun {
  TileMemory memory;
  std::vector<float> out;
  std::uint64_t cycles;
};

struct ScratchGraph {
  Graph g{tiny()};
  unsigned tile;
  Tensor w, out, x, y;
  explicit ScratchGraph(unsigned tile) : tile(tile) {
    w = g.add_variable(DType::f32, {kScratch}, "w", MemoryCategory::weight);
    out = g.add_variable(DType::f32, {kScratch}, "out");
    x = g.add_variable(DType::f32, {kScratch}, "x", MemoryCategory::temporary);
    y = g.add_variable(DType::f32, {kScratch}, "y", MemoryCategory::temporary);
    for (const Tensor& t : {w, out, x, y}) g.set_tile_mapping(t, tile);
    g.set_host_access(out);
  }
  // Runs p with w = random_floats(kScratch, seed), out all `out_init`, and what `setup` writes.
  UndefRun run(const Program& p, unsigned seed, float out_init,
               const std::function<void(Engine&)>& setup = {}) {
    Engine e(g, {{"p", p}});
    write_floats(e, w, random_floats(kScratch, seed));
    write_floats(e, out, std::vector<float>(kScratch, out_init));
    if (setup) setup(e);
    e.run("p");
    return {e.memory().tiles[tile], read_floats(e, out), e.cycles().total()};
  }
};

// x used twice with y in between, rewritten the second time in two halves (liveness cannot
// tell that those end the old value). Without WriteUndef x is live from its first write to its
// last read and y needs bytes of its own; with it, x's range has a hole where y lives, and y
// takes x's bytes. Same results, same cycles.
UndefRun straight_line(bool write_undef) {
  ScratchGraph s(0);
  Program p;
  p.add(Program::copy(s.w, s.x));
  ops::scaled_add_in_place(s.g, p, s.out, s.x, 1.0f, "out+=x");
  if (write_undef) p.add(Program::write_undef(s.x));
  p.add(Program::copy(s.w, s.y));
  ops::scaled_add_in_place(s.g, p, s.out, s.y, 2.0f, "out+=2y");
  const std::size_t half = kScratch / 2;
  p.add(Program::copy(s.w.slice(0, half), s.x.slice(0, half)));
  p.add(Program::copy(s.w.slice(half, kScratch), s.x.slice(half, kScratch)));
  ops::scaled_add_in_place(s.g, p, s.out, s.x, 4.0f, "out+=4x");
  // z, born after x's last use, takes x's or y's bytes (x's: they are free for good again once
  // x's second piece ends).
  Tensor z = s.g.add_variable(DType::f32, {kScratch}, "z", MemoryCategory::temporary);
  s.g.set_tile_mapping(z, s.tile);
  p.add(Program::copy(s.w, z));
  ops::scaled_add_in_place(s.g, p, s.out, z, 8.0f, "out+=8z");
  return s.run(p, 11, 0.f);
}

TEST(WriteUndef, EndsALiveRangeSoALaterTemporaryTakesItsBytes) {
  const UndefRun plain = straight_line(false), undef = straight_line(true);
  const std::size_t buffer = kScratch * 4;
  EXPECT_EQ(plain.memory.not_always_live, 3 * buffer);  // out, x, and y then z
  EXPECT_EQ(undef.memory.not_always_live, 2 * buffer);  // out, and x, y, x, z in turn
  EXPECT_EQ(plain.memory.peak_live, 3 * buffer);
  EXPECT_EQ(undef.memory.peak_live, 2 * buffer);
  EXPECT_EQ(undef.memory.gaps(), 0u);
  EXPECT_LT(undef.memory.total(), plain.memory.total());
  EXPECT_EQ(undef.out, plain.out);
  EXPECT_EQ(undef.cycles, plain.cycles);  // WriteUndef costs nothing
  const auto wv = random_floats(kScratch, 11);
  for (std::size_t i = 0; i < kScratch; ++i)
    ASSERT_EQ(undef.out[i], ((wv[i] + 2.f * wv[i]) + 4.f * wv[i]) + 8.f * wv[i]) << i;
}

// In a loop: x is written in two halves at the top of the body, so liveness cannot tell that
// its value does not carry from one iteration to the next and keeps it live around the whole
// loop, across y. A WriteUndef of x (given as a view) at the top of the body says it does not.
UndefRun in_a_loop(bool write_undef) {
  ScratchGraph s(1);
  const std::size_t half = kScratch / 2;
  Program body;
  if (write_undef)
    body.add(
        Program::write_undef(View::concat({s.x.slice(half, kScratch), s.x.slice(0, half)}, 0)));
  body.add(Program::copy(s.w.slice(0, half), s.x.slice(0, half)));
  body.add(Program::copy(s.w.slice(half, kScratch), s.x.slice(half, kScratch)));
  ops::scaled_add_in_place(s.g, body, s.out, s.x, 1.0f, "out+=x");
  body.add(Program::copy(s.w, s.y));
  ops::scaled_add_in_place(s.g, body, s.out, s.y, 0.5f, "out+=y/2");
  return s.run(Program::repeat(3, body), 12, 1.f);
}

TEST(WriteUndef, AtTheTopOfALoopBodyTheValueDoesNotCarryAcrossIterations) {
  const UndefRun plain = in_a_loop(false), undef = in_a_loop(true);
  const std::size_t buffer = kScratch * 4;
  EXPECT_EQ(plain.memory.not_always_live, 3 * buffer);
  EXPECT_EQ(undef.memory.not_always_live, 2 * buffer);
  EXPECT_EQ(undef.memory.peak_live, 2 * buffer);
  EXPECT_EQ(undef.out, plain.out);
  EXPECT_EQ(undef.cycles, plain.cycles);
  const auto wv = random_floats(kScratch, 12);
  for (std::size_t i = 0; i < kScratch; ++i) {
    float want = 1.f;
    for (int k = 0; k < 3; ++k) want = (want + wv[i]) + 0.5f * wv[i];
    ASSERT_EQ(undef.out[i], want) << i;
  }
}

// A WriteUndef of part of a variable frees nothing (the variable is the unit of allocation),
// and one of a variable never used again changes nothing.
TEST(WriteUndef, OfPartOfAVariableOrAtTheEndChangesNothing) {
  const auto build = [](int variant) {
    ScratchGraph s(2);
    Program p;
    p.add(Program::copy(s.w, s.x));
    if (variant == 1) p.add(Program::write_undef(s.x.slice(0, kScratch - 1)));
    p.add(Program::copy(s.w, s.y));
    ops::scaled_add_in_place(s.g, p, s.out, s.y, 1.0f, "out+=y");
    ops::scaled_add_in_place(s.g, p, s.out, s.x, 1.0f, "out+=x");
    if (variant == 2) p.add(Program::write_undef(s.x));
    return s.run(p, 13, 0.f).memory.not_always_live;
  };
  EXPECT_EQ(build(0), 3 * kScratch * 4);
  EXPECT_EQ(build(1), build(0));
  EXPECT_EQ(build(2), build(0));
}

// A WriteUndef in a branch ends no live range: on the path that skips it the value lives on,
// so y may not take x's bytes even though one path kills x before y is born.
TEST(WriteUndef, InABranchEndsNoLiveRange) {
  ScratchGraph s(4);
  Tensor flag = s.g.add_variable(DType::i32, {1}, "flag");
  s.g.set_tile_mapping(flag, 4);
  s.g.set_host_access(flag);
  Program p;
  p.add(Program::copy(s.w, s.x));
  p.add(Program::if_else(flag, Program::write_undef(s.x)));
  p.add(Program::copy(s.w, s.y));
  ops::scaled_add_in_place(s.g, p, s.out, s.y, 1.0f, "out+=y");
  ops::scaled_add_in_place(s.g, p, s.out, s.x, 2.0f, "out+=2x");
  const std::int32_t skip = 0;
  const UndefRun r =
      s.run(p, 14, 0.f, [&](Engine& e) { e.write(flag, std::as_bytes(std::span(&skip, 1))); });
  EXPECT_EQ(r.memory.not_always_live, 3 * kScratch * 4 + 8);  // out, x, y, flag
  const auto wv = random_floats(kScratch, 14);
  for (std::size_t i = 0; i < kScratch; ++i) ASSERT_EQ(r.out[i], wv[i] + 2.f * wv[i]) << i;
}

// Random straight-line programs over scratch buffers that are written, accumulated into one
// another, read into a result and killed by WriteUndef at random: every variable's bytes are
// shared with others in the holes of its live range, and the result must still be exactly
// what a CPU computes (a buffer given bytes that a live one holds would corrupt it).
TEST(WriteUndef, RandomProgramsWithHolesComputeWhatTheCpuDoes) {
  constexpr std::size_t kVars = 6, kWeights = 3, kN = 96;
  std::size_t holes = 0, shared = 0;
  for (unsigned seed = 0; seed < 40; ++seed) {
    std::mt19937 gen(seed);
    const auto pick = [&](std::size_t n) { return static_cast<std::size_t>(gen() % n); };
    Graph g(tiny());
    std::vector<Tensor> w, x;
    std::vector<std::vector<float>> wv, xv(kVars);
    for (std::size_t k = 0; k < kWeights; ++k) {
      w.push_back(
          g.add_variable(DType::f32, {kN}, "w" + std::to_string(k), MemoryCategory::weight));
      wv.push_back(random_floats(kN, 100 * seed + static_cast<unsigned>(k)));
      g.set_tile_mapping(w.back(), 3);
    }
    for (std::size_t i = 0; i < kVars; ++i) {
      x.push_back(g.add_variable(DType::f32, {kN * (1 + i % 3)}, "x" + std::to_string(i)));
      g.set_tile_mapping(x.back(), 3);
    }
    Tensor out = g.add_variable(DType::f32, {kN}, "out");
    g.set_tile_mapping(out, 3);
    g.set_host_access(out);
    std::vector<float> ref(kN, 0.f);
    std::vector<bool> defined(kVars, false);
    Program p;
    int step = 0;
    const auto name = [&] { return "s" + std::to_string(step++); };
    for (int op = 0; op < 30; ++op) {
      const std::size_t i = pick(kVars), j = pick(kVars);
      const std::size_t r = pick(10);
      if (r < 3 || !defined[i]) {  // write x_i whole from a weight (repeated to its size)
        const std::size_t k = pick(kWeights);
        const View src = View(w[k]).broadcast(x[i].elements() / kN, 0);
        p.add(Program::copy(src, x[i]));
        xv[i].clear();
        for (std::size_t c = 0; c < x[i].elements() / kN; ++c)
          xv[i].insert(xv[i].end(), wv[k].begin(), wv[k].end());
        defined[i] = true;
      } else if (r < 6 && defined[j] && i != j && x[i].elements() == x[j].elements()) {
        ops::scaled_add_in_place(g, p, x[i], x[j], 0.5f, name());
        for (std::size_t e = 0; e < xv[i].size(); ++e) xv[i][e] += 0.5f * xv[j][e];
      } else if (r < 8) {
        ops::scaled_add_in_place(g, p, out, x[i].slice(0, kN), 1.0f, name());
        for (std::size_t e = 0; e < kN; ++e) ref[e] += xv[i][e];
      } else {
        p.add(Program::write_undef(x[i]));
        defined[i] = false;
        ++holes;
      }
    }
    for (std::size_t i = 0; i < kVars; ++i)
      if (defined[i]) {
        ops::scaled_add_in_place(g, p, out, x[i].slice(0, kN), 1.0f, name());
        for (std::size_t e = 0; e < kN; ++e) ref[e] += xv[i][e];
      }
    Engine e(g, {{"p", p}});
    for (std::size_t k = 0; k < kWeights; ++k) e.write(w[k], std::as_bytes(std::span(wv[k])));
    write_floats(e, out, std::vector<float>(kN, 0.f));
    e.run("p");
    ASSERT_EQ(read_floats(e, out), ref) << "seed " << seed;
    const TileMemory& tm = e.memory().tiles[3];
    if (tm.not_always_live < tm.by_category.at(MemoryCategory::activation)) ++shared;
  }
  EXPECT_GT(holes, 40u);
  EXPECT_GT(shared, 10u);  // without the WriteUndefs: 7 of 40
}

}  // namespace
}  // namespace ipupod::ipu

// Lookups by run-time indices (gather, scatter-add) and vector-quantisation, with their codelets.
#include "ipu_process/ops/gather.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/elementwise.hpp"

namespace ipupod::ipu {

namespace {

std::string index_error(const char* op, std::int64_t index, std::size_t position,
                        std::size_t rows) {
  return std::string(op) + ": index " + std::to_string(index) + " at position " +
         std::to_string(position) + " is outside [0, " + std::to_string(rows) +
         ") (the table's rows); check the indices fed to the device";
}

// Row r of a table block: one region per row when the block is narrower than the table,
// else one region holding the whole block.
template <class T>
std::span<T> block_row(const VertexContext& c, std::size_t field, std::size_t r,
                       std::size_t width) {
  if (c.regions(field) == 1) return c.region<T>(field).subspan(r * width, width);
  return c.region<T>(field, r);
}

// Distances travel between tiles as the two 32-bit halves of a double.
double load_double(const std::uint32_t* p) {
  double d;
  std::memcpy(&d, p, sizeof d);
  return d;
}
void store_double(std::uint32_t* p, double d) {
  std::memcpy(p, &d, sizeof d);
}

std::size_t field_elements(const Vertex& v, std::size_t field) {
  std::size_t n = 0;
  for (const auto& t : v.fields[field]) n += t.elements();
  return n;
}

// Scalar work per index (load, compare, branch): one instruction each, one worker slot in six.
std::uint64_t scalar_cycles(const ArchPreset& a, std::size_t instructions) {
  return static_cast<std::uint64_t>(instructions) * a.workers_per_tile;
}

}  // namespace

void register_gather_codelets(CodeletRegistry& r) {
  r.add({"LookupRows",
         "partial[i] = table[idx[i] - r0] if r0 <= idx[i] < r1, else zeros; params: r0, r1, "
         "block width",
         {"idx", "table", "partial"},
         [](const VertexContext& c) {
           auto idx = c.region<const std::int32_t>(0);
           auto part = c.region<float>(2);
           const auto r0 = static_cast<std::int64_t>(c.param(0)),
                      r1 = static_cast<std::int64_t>(c.param(1));
           const std::size_t w = c.size_param(2);
           for (std::size_t i = 0; i < idx.size(); ++i) {
             float* o = part.data() + i * w;
             if (idx[i] >= r0 && idx[i] < r1) {
               auto row = block_row<const float>(c, 1, static_cast<std::size_t>(idx[i] - r0), w);
               std::copy(row.begin(), row.end(), o);
             } else {
               std::fill(o, o + w, 0.f);
             }
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, field_elements(v, 2), 1) +
                  scalar_cycles(a, 3 * field_elements(v, 0));
         }});
  r.add({"SelectOwnerAnswers",
         "out[i] = parts[idx[i] / rows_per_block][i] (the answer of the row block owning the "
         "index; zeros for an index outside the table); params: table rows, rows per block, "
         "block width",
         {"idx", "parts", "out"},
         [](const VertexContext& c) {
           auto idx = c.region<const std::int32_t>(0);
           auto out = c.region<float>(2);
           const std::size_t rows = c.size_param(0), rpb = c.size_param(1), w = c.size_param(2);
           for (std::size_t i = 0; i < idx.size(); ++i) {
             float* o = out.data() + i * w;
             if (idx[i] < 0 || static_cast<std::size_t>(idx[i]) >= rows) {
               std::fill(o, o + w, 0.f);  // reported by AssembleLookedUpRows
               continue;
             }
             auto part = c.region<const float>(1, static_cast<std::size_t>(idx[i]) / rpb);
             std::copy_n(part.data() + i * w, w, o);
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, field_elements(v, 2), 1) +
                  scalar_cycles(a, 3 * field_elements(v, 0));
         }});
  r.add(
      {"AssembleLookedUpRows",
       "out[i] = the column blocks' answers for position i side by side; stops the run on an "
       "index outside the table; params: table rows, columns per block, dim, first position",
       {"idx", "parts", "out"},
       [](const VertexContext& c) {
         auto idx = c.region<const std::int32_t>(0);
         auto out = c.region<float>(2);
         const std::size_t rows = c.size_param(0), cpb = c.size_param(1), dim = c.size_param(2),
                           first = c.size_param(3);
         for (std::size_t i = 0; i < idx.size(); ++i) {
           if (idx[i] < 0 || static_cast<std::size_t>(idx[i]) >= rows)
             throw std::out_of_range(index_error("gather_rows", idx[i], first + i, rows));
           for (std::size_t cb = 0; cb < c.regions(1); ++cb) {
             const std::size_t c0 = cb * cpb, w = std::min(dim, c0 + cpb) - c0;
             std::copy_n(c.region<const float>(1, cb).data() + i * w, w, out.data() + i * dim + c0);
           }
         }
       },
       [](const Vertex& v, const ArchPreset& a) {
         return vector_cycles(a, field_elements(v, 2), 1) + scalar_cycles(a, field_elements(v, 0));
       }});
  r.add({"ScatterAddRows",
         "out[k - r0] = sum over i in order of dy[i] for idx[i] = k, for rows r0 <= k < r1 "
         "(zero if none); params: r0, r1, block width, table rows",
         {"idx", "dy", "out"},
         [](const VertexContext& c) {
           auto idx = c.region<const std::int32_t>(0);
           auto dy = c.region<const float>(1);
           const auto r0 = static_cast<std::int64_t>(c.param(0)),
                      r1 = static_cast<std::int64_t>(c.param(1));
           const std::size_t w = c.size_param(2), rows = c.size_param(3);
           for (std::size_t i = 0; i < c.regions(2); ++i) {
             auto o = c.region<float>(2, i);
             std::fill(o.begin(), o.end(), 0.f);
           }
           for (std::size_t i = 0; i < idx.size(); ++i) {
             if (idx[i] < 0 || static_cast<std::size_t>(idx[i]) >= rows)
               throw std::out_of_range(index_error("scatter_add_rows", idx[i], i, rows));
             if (idx[i] < r0 || idx[i] >= r1) continue;
             auto o = block_row<float>(c, 2, static_cast<std::size_t>(idx[i] - r0), w);
             for (std::size_t j = 0; j < w; ++j) o[j] += dy[i * w + j];
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           // every index is tested; on average a block's share of dy is added
           return vector_cycles(a, field_elements(v, 2), 1) +
                  scalar_cycles(a, 3 * field_elements(v, 0)) +
                  vector_cycles(a, field_elements(v, 2), 1);
         }});
  r.add({"NearestCodePartial",
         "best[i] = (distance as two u32 halves of a double, code index) of the code nearest "
         "to z row i among this block's codes, first minimum wins; params: dim, first code",
         {"z", "codes", "best"},
         [](const VertexContext& c) {
           auto z = c.region<const float>(0);
           auto codes = c.region<const float>(1);
           auto best = c.region<std::uint32_t>(2);
           const std::size_t dim = c.size_param(0), first = c.size_param(1);
           const std::size_t rows = best.size() / 3, kc = dim ? codes.size() / dim : 0;
           for (std::size_t i = 0; i < rows; ++i) {
             double bd = std::numeric_limits<double>::infinity();
             std::size_t at = 0;
             for (std::size_t k = 0; k < kc; ++k) {
               double dist = 0;
               for (std::size_t j = 0; j < dim; ++j) {
                 const double d = static_cast<double>(z[i * dim + j]) - codes[k * dim + j];
                 dist += d * d;
               }
               if (dist < bd) bd = dist, at = k;
             }
             store_double(&best[3 * i], bd);
             best[3 * i + 2] = static_cast<std::uint32_t>(first + at);
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           const std::size_t rows = v.fields[2][0].elements() / 3;
           // subtract, multiply-accumulate per element of every (row, code) pair
           return vector_cycles(a, rows * v.fields[1][0].elements(), 2);
         }});
  r.add({"NearestCodeReduce",
         "out[i] = index of the smallest distance over the blocks' answers, in code order "
         "(ties to the lowest index)",
         {"parts", "out"},
         [](const VertexContext& c) {
           auto out = c.region<std::int32_t>(1);
           for (std::size_t i = 0; i < out.size(); ++i) {
             double bd = std::numeric_limits<double>::infinity();
             std::uint32_t at = 0;
             for (std::size_t r = 0; r < c.regions(0); ++r) {
               const std::uint32_t* p = c.region<const std::uint32_t>(0, r).data() + 3 * i;
               const double d = load_double(p);
               if (d < bd) bd = d, at = p[2];
             }
             out[i] = static_cast<std::int32_t>(at);
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return scalar_cycles(a, field_elements(v, 0));
         }});
  r.add({"CodebookEmaPartial",
         "for this vertex's codes and a block of z rows: (count, sum of the rows) per code, in "
         "double (as pairs of u32), rows in order; params: first code, codes, dim, first row",
         {"z", "idx", "partial"},
         [](const VertexContext& c) {
           auto z = c.region<const float>(0);
           auto idx = c.region<const std::int32_t>(1);
           auto part = c.region<std::uint32_t>(2);
           const std::size_t first = c.size_param(0), codes = c.size_param(1),
                             dim = c.size_param(2), first_row = c.size_param(3);
           const std::size_t kc = part.size() / (2 * (dim + 1));
           std::vector<double> acc(kc * (dim + 1), 0.0);
           for (std::size_t i = 0; i < idx.size(); ++i) {
             if (idx[i] < 0 || static_cast<std::size_t>(idx[i]) >= codes)
               throw std::out_of_range(index_error("vq_ema_update", idx[i], first_row + i, codes));
             const std::size_t k = static_cast<std::size_t>(idx[i]);
             if (k < first || k >= first + kc) continue;
             double* a = &acc[(k - first) * (dim + 1)];
             a[0] += 1;
             for (std::size_t j = 0; j < dim; ++j) a[1 + j] += z[i * dim + j];
           }
           for (std::size_t e = 0; e < acc.size(); ++e) store_double(&part[2 * e], acc[e]);
         },
         [](const Vertex& v, const ArchPreset& a) {
           return scalar_cycles(a, 3 * field_elements(v, 1)) +
                  vector_cycles(a, field_elements(v, 0), 1) +
                  vector_cycles(a, field_elements(v, 2), 1);
         }});
  r.add({"CodebookEmaAccumulate",
         "count, sum = the row blocks' partials added in order; cluster = decay * cluster + "
         "(1 - decay) * count, embed = decay * embed + (1 - decay) * sum; params: decay, dim",
         {"parts", "cluster", "embed"},
         [](const VertexContext& c) {
           auto cluster = c.region<float>(1);
           auto embed = c.region<float>(2);
           const double decay = c.param(0);
           const std::size_t dim = c.size_param(1), kc = cluster.size();
           std::vector<double> acc(kc * (dim + 1), 0.0);
           for (std::size_t r = 0; r < c.regions(0); ++r) {
             const std::uint32_t* part = c.region<const std::uint32_t>(0, r).data();
             for (std::size_t e = 0; e < acc.size(); ++e) acc[e] += load_double(&part[2 * e]);
           }
           for (std::size_t k = 0; k < kc; ++k) {
             const double* a = &acc[k * (dim + 1)];
             cluster[k] = static_cast<float>(decay * cluster[k] + (1 - decay) * a[0]);
             for (std::size_t j = 0; j < dim; ++j)
               embed[k * dim + j] =
                   static_cast<float>(decay * embed[k * dim + j] + (1 - decay) * a[1 + j]);
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, field_elements(v, 0), 1) +
                  vector_cycles(a, field_elements(v, 2), 2);
         }});
  r.add({"SumInOrder",
         "out (a double as two u32 halves) = sum of every element of every region, in order",
         {"in", "out"},
         [](const VertexContext& c) {
           double s = 0;
           for (std::size_t r = 0; r < c.regions(0); ++r)
             for (float x : c.region<const float>(0, r)) s += x;
           store_double(c.region<std::uint32_t>(1).data(), s);
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, field_elements(v, 0), 1);
         }});
  r.add({"CodebookEmaNormalise",
         "codebook[k] = embed[k] / ((cluster[k] + eps) / (total + codes * eps) * total) where "
         "cluster[k] > 0; params: codes, eps, dim",
         {"cluster", "embed", "total", "codebook"},
         [](const VertexContext& c) {
           auto cluster = c.region<const float>(0);
           auto embed = c.region<const float>(1);
           const double total = load_double(c.region<const std::uint32_t>(2).data());
           auto codebook = c.region<float>(3);
           const double codes = c.param(0), eps = c.param(1);
           const std::size_t dim = c.size_param(2);
           for (std::size_t k = 0; k < cluster.size(); ++k) {
             if (cluster[k] <= 0.f) continue;
             const double smoothed = (cluster[k] + eps) / (total + codes * eps) * total;
             for (std::size_t j = 0; j < dim; ++j)
               codebook[k * dim + j] = static_cast<float>(embed[k * dim + j] / smoothed);
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, field_elements(v, 1), 1);
         }});
}

namespace ops {
namespace {

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_text(t.shape());
}

void expect(bool ok, const std::string& name, const std::string& what) {
  if (!ok) throw std::invalid_argument(name + ": " + what);
}

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

// Splits [0, n) into at most `pieces` contiguous chunks: fn(begin, end).
template <class Fn>
void for_each_chunk(std::size_t n, std::size_t pieces, Fn&& fn) {
  if (n == 0) return;
  const std::size_t per = ceil_div(n, std::clamp<std::size_t>(pieces, 1, n));
  for (std::size_t b = 0; b < n; b += per) fn(b, std::min(n, b + per));
}

// The tile intervals of a [rows, dim] table laid out by the plan, in flat elements.
std::vector<TileInterval> lookup_intervals(const LookupPlan& p) {
  std::vector<TileInterval> out;
  const auto push = [&](std::size_t b, std::size_t e, unsigned tile) {
    if (b == e) return;
    if (!out.empty() && out.back().tile == tile && out.back().end == b)
      out.back().end = static_cast<std::uint32_t>(e);
    else
      out.push_back({static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(e), tile});
  };
  for (std::size_t rb = 0; rb < p.row_blocks; ++rb)
    for (std::size_t r = p.row_begin(rb); r < p.row_end(rb); ++r)
      for (std::size_t cb = 0; cb < p.col_blocks; ++cb)
        push(r * p.dim + p.col_begin(cb), r * p.dim + p.col_end(cb), p.tile(rb, cb));
  return out;
}

void map_lookup_table(Graph& graph, const Tensor& t, const LookupPlan& p) {
  const Tensor flat = t.flatten();
  for (const auto& iv : lookup_intervals(p))
    graph.set_tile_mapping(flat.slice(iv.begin, iv.end), iv.tile);
}

// The table itself if it is laid out by the plan, else a copy of it that is (added to prog).
Tensor table_for_plan(Graph& graph, Program& prog, const Tensor& table, const LookupPlan& p,
                      const std::string& name) {
  const auto want = lookup_intervals(p), have = graph.tile_mapping(table.flatten());
  const bool same = want.size() == have.size() &&
                    std::equal(want.begin(), want.end(), have.begin(), [](auto& a, auto& b) {
                      return a.begin == b.begin && a.end == b.end && a.tile == b.tile;
                    });
  if (same) return table;
  Tensor local =
      graph.add_variable(DType::f32, {p.rows, p.dim}, name + "/table", MemoryCategory::temporary);
  map_lookup_table(graph, local, p);
  prog.add(Program::copy(table, local));
  return local;
}

// The regions of block (rb, cb) of a table laid out by the plan, rows [r0, r1) of the block.
std::vector<Tensor> block_regions(const Tensor& table, const LookupPlan& p, std::size_t r0,
                                  std::size_t r1, std::size_t cb) {
  if (p.col_blocks == 1) return {table.rows(r0, r1).flatten()};
  std::vector<Tensor> regions;
  for (std::size_t r = r0; r < r1; ++r)
    regions.push_back(table.row(r).slice(p.col_begin(cb), p.col_end(cb)));
  return regions;
}

Tensor on_tile(Graph& graph, DType dtype, std::size_t elements, unsigned tile,
               const std::string& name) {
  Tensor t = graph.add_variable(dtype, {elements}, name + "@" + std::to_string(tile),
                                MemoryCategory::temporary);
  graph.set_tile_mapping(t, tile);
  return t;
}

}  // namespace

std::size_t LookupPlan::row_begin(std::size_t rb) const {
  return std::min(rows, rb * rows_per_block);
}
std::size_t LookupPlan::row_end(std::size_t rb) const {
  return std::min(rows, (rb + 1) * rows_per_block);
}
std::size_t LookupPlan::col_begin(std::size_t cb) const {
  return std::min(dim, cb * cols_per_block);
}
std::size_t LookupPlan::col_end(std::size_t cb) const {
  return std::min(dim, (cb + 1) * cols_per_block);
}

LookupPlan LookupPlan::make(const Graph& graph, std::size_t rows, std::size_t dim,
                            std::size_t lookups) {
  LookupPlan best;
  std::size_t best_bytes = std::numeric_limits<std::size_t>::max();
  const std::size_t tiles = graph.tiles();
  // A tile holds its block of the table, its block's answer for every index, the indices and
  // the vertex state; the plan with the fewest bytes on the busiest tile wins.
  for (std::size_t cb = 1; cb <= std::max<std::size_t>(1, std::min(dim, tiles)); ++cb) {
    LookupPlan p;
    p.rows = rows, p.dim = dim, p.lookups = lookups;
    p.cols_per_block = std::max<std::size_t>(1, ceil_div(dim, cb));
    p.col_blocks = std::max<std::size_t>(1, ceil_div(dim, p.cols_per_block));
    const std::size_t rbs =
        std::clamp<std::size_t>(tiles / p.col_blocks, 1, std::max<std::size_t>(rows, 1));
    p.rows_per_block = std::max<std::size_t>(1, ceil_div(rows, rbs));
    p.row_blocks = std::max<std::size_t>(1, ceil_div(rows, p.rows_per_block));
    // Blocks narrower than the table connect one region per row to each worker's vertex.
    const std::size_t vertex_state =
        p.col_blocks > 1 ? p.rows_per_block * graph.arch().vertex_state_bytes_per_region *
                               graph.arch().workers_per_tile
                         : 0;
    const std::size_t bytes =
        4 * (p.rows_per_block * p.cols_per_block + lookups * p.cols_per_block + lookups) +
        vertex_state;
    if (bytes < best_bytes) best_bytes = bytes, best = p;
  }
  return best;
}

Tensor create_lookup_table(Graph& graph, std::size_t rows, std::size_t dim, std::size_t lookups,
                           const std::string& name, MemoryCategory category) {
  Tensor t = graph.add_variable(DType::f32, {rows, dim}, name, category);
  map_lookup_table(graph, t, LookupPlan::make(graph, rows, dim, lookups));
  return t;
}

Tensor gather_rows(Graph& graph, Program& prog, const Tensor& table, const Tensor& indices,
                   const std::string& name) {
  expect(table.rank() == 2 && table.dtype() == DType::f32, name,
         "gather_rows expects table float32[rows, dim], got " + describe(table));
  expect(indices.dtype() == DType::i32, name,
         "gather_rows expects int32 indices, got " + describe(indices));
  const std::size_t rows = table.dim(0), dim = table.dim(1), n = indices.elements();
  expect(rows > 0 || n == 0, name, "gather_rows from a table with no rows");
  std::vector<std::size_t> shape = indices.shape();
  shape.push_back(dim);
  Tensor out = graph.add_variable(DType::f32, shape, name);
  if (n == 0 || dim == 0) return out;

  const LookupPlan p = LookupPlan::make(graph, rows, dim, n);
  const Tensor t = table_for_plan(graph, prog, table, p, name);
  const Tensor idx = indices.flatten();
  const std::size_t workers = graph.arch().workers_per_tile;
  // Every block's tile answers every index (zeros for indices it does not own).
  std::vector<std::pair<Tensor, Tensor>> in_copies;
  std::vector<Tensor> answers(p.row_blocks * p.col_blocks), idx_tiles(answers.size());
  ComputeSetId lookup = graph.add_compute_set(name + "/lookup");
  for (std::size_t rb = 0; rb < p.row_blocks; ++rb)
    for (std::size_t cb = 0; cb < p.col_blocks; ++cb) {
      const unsigned tile = p.tile(rb, cb);
      const std::size_t w = p.col_end(cb) - p.col_begin(cb);
      Tensor idx_t = on_tile(graph, DType::i32, n, tile, name + "/indices");
      in_copies.emplace_back(idx, idx_t);
      idx_tiles[rb * p.col_blocks + cb] = idx_t;
      Tensor& answer = answers[rb * p.col_blocks + cb];
      answer = on_tile(graph, DType::f32, n * w, tile, name + "/answer");
      const auto regions = block_regions(t, p, p.row_begin(rb), p.row_end(rb), cb);
      for_each_chunk(n, workers, [&](std::size_t i0, std::size_t i1) {
        graph.add_vertex(lookup, {"LookupRows",
                                  tile,
                                  {{idx_t.slice(i0, i1)}, regions, {answer.slice(i0 * w, i1 * w)}},
                                  {double(p.row_begin(rb)), double(p.row_end(rb)), double(w)}});
      });
    }
  prog.add(Program::copy(std::move(in_copies)));
  prog.add(Program::execute(lookup));

  // Each column block's tiles select the owning row block's answers, each tile for its share
  // of the positions (a second stage keeps the exchange to the output's tiles small).
  std::vector<Tensor> selected(p.col_blocks);
  if (p.row_blocks == 1) {
    selected = answers;
  } else {
    std::vector<std::pair<Tensor, Tensor>> copies;
    ComputeSetId select = graph.add_compute_set(name + "/select");
    const std::size_t ppb = ceil_div(n, p.row_blocks);
    for (std::size_t cb = 0; cb < p.col_blocks; ++cb) {
      const std::size_t w = p.col_end(cb) - p.col_begin(cb);
      selected[cb] = graph.add_variable(
          DType::f32, {n * w}, name + "/selected" + std::to_string(cb), MemoryCategory::temporary);
      for (std::size_t rb = 0; rb < p.row_blocks; ++rb) {
        const unsigned tile = p.tile(rb, cb);
        const std::size_t p0 = std::min(n, rb * ppb), p1 = std::min(n, p0 + ppb);
        if (p0 == p1) continue;
        graph.set_tile_mapping(selected[cb].slice(p0 * w, p1 * w), tile);
        for_each_chunk(p1 - p0, workers, [&](std::size_t a, std::size_t b) {
          const std::size_t q0 = p0 + a, q1 = p0 + b, len = (q1 - q0) * w;
          Tensor recv = on_tile(graph, DType::f32, p.row_blocks * len, tile, name + "/answers");
          Vertex v{"SelectOwnerAnswers",
                   tile,
                   {{idx_tiles[rb * p.col_blocks + cb].slice(q0, q1)},
                    {},
                    {selected[cb].slice(q0 * w, q1 * w)}},
                   {double(rows), double(p.rows_per_block), double(w)}};
          for (std::size_t from = 0; from < p.row_blocks; ++from) {
            Tensor dst = recv.slice(from * len, (from + 1) * len);
            copies.emplace_back(answers[from * p.col_blocks + cb].slice(q0 * w, q1 * w), dst);
            v.fields[1].push_back(dst);
          }
          graph.add_vertex(select, std::move(v));
        });
      }
    }
    prog.add(Program::copy(std::move(copies)));
    prog.add(Program::execute(select));
  }

  // The output's tiles put the column blocks side by side for their positions.
  std::vector<std::pair<Tensor, Tensor>> out_copies;
  ComputeSetId assemble = graph.add_compute_set(name + "/assemble");
  const Tensor flat = out.flatten();
  for_each_row_block(graph, n, [&](unsigned tile, std::size_t b, std::size_t e) {
    for_each_chunk(e - b, workers, [&](std::size_t c0, std::size_t c1) {
      const std::size_t q0 = b + c0, q1 = b + c1;
      Tensor idx_o = on_tile(graph, DType::i32, q1 - q0, tile, name + "/indices");
      out_copies.emplace_back(idx.slice(q0, q1), idx_o);
      Tensor recv = on_tile(graph, DType::f32, (q1 - q0) * dim, tile, name + "/columns");
      Vertex v{"AssembleLookedUpRows",
               tile,
               {{idx_o}, {}, {flat.slice(q0 * dim, q1 * dim)}},
               {double(rows), double(p.cols_per_block), double(dim), double(q0)}};
      std::size_t at = 0;
      for (std::size_t cb = 0; cb < p.col_blocks; ++cb) {
        const std::size_t w = p.col_end(cb) - p.col_begin(cb), len = (q1 - q0) * w;
        out_copies.emplace_back(selected[cb].slice(q0 * w, q1 * w), recv.slice(at, at + len));
        v.fields[1].push_back(recv.slice(at, at + len));
        at += len;
      }
      graph.set_tile_mapping(flat.slice(q0 * dim, q1 * dim), tile);
      graph.add_vertex(assemble, std::move(v));
    });
  });
  prog.add(Program::copy(std::move(out_copies)));
  prog.add(Program::execute(assemble));
  return out;
}

Tensor scatter_add_rows(Graph& graph, Program& prog, const Tensor& dy, const Tensor& indices,
                        std::size_t rows, const std::string& name) {
  expect(indices.dtype() == DType::i32, name,
         "scatter_add_rows expects int32 indices, got " + describe(indices));
  std::vector<std::size_t> want = indices.shape();
  want.push_back(dy.rank() ? dy.shape().back() : 0);
  expect(dy.dtype() == DType::f32 && dy.rank() >= 1 && dy.shape() == want, name,
         "scatter_add_rows expects dy float32[indices..., dim] = float32" +
             shape_text(indices.shape()) + " + [dim], got " + describe(dy));
  const std::size_t dim = dy.shape().back(), n = indices.elements();
  Tensor out = create_lookup_table(graph, rows, dim, n, name, MemoryCategory::activation);
  if (rows == 0 || dim == 0) return out;
  if (n == 0) {
    zero(graph, prog, out, name + "/zero");
    return out;
  }
  const LookupPlan p = LookupPlan::make(graph, rows, dim, n);
  const Tensor idx = indices.flatten(), dflat = dy.flatten();
  const std::size_t workers = graph.arch().workers_per_tile;
  // dy's columns of each column block are gathered once, spread in position chunks over the
  // column's tiles (C > 1 cuts dy's rows), then every tile of the column copies all of them.
  std::vector<std::pair<Tensor, Tensor>> columns, copies;
  std::vector<Tensor> dy_cols(p.col_blocks);
  const std::size_t ppb = ceil_div(n, p.row_blocks);
  for (std::size_t cb = 0; cb < p.col_blocks; ++cb) {
    const std::size_t c0 = p.col_begin(cb), w = p.col_end(cb) - c0;
    if (p.col_blocks == 1) {
      dy_cols[cb] = dflat;
      continue;
    }
    dy_cols[cb] = graph.add_variable(DType::f32, {n * w}, name + "/dy_columns" + std::to_string(cb),
                                     MemoryCategory::temporary);
    for (std::size_t rb = 0; rb < p.row_blocks; ++rb) {
      const std::size_t p0 = std::min(n, rb * ppb), p1 = std::min(n, p0 + ppb);
      if (p0 < p1) graph.set_tile_mapping(dy_cols[cb].slice(p0 * w, p1 * w), p.tile(rb, cb));
    }
    for (std::size_t i = 0; i < n; ++i)
      columns.emplace_back(dflat.slice(i * dim + c0, i * dim + c0 + w),
                           dy_cols[cb].slice(i * w, (i + 1) * w));
  }
  ComputeSetId cs = graph.add_compute_set(name);
  for (std::size_t rb = 0; rb < p.row_blocks; ++rb)
    for (std::size_t cb = 0; cb < p.col_blocks; ++cb) {
      const unsigned tile = p.tile(rb, cb);
      const std::size_t w = p.col_end(cb) - p.col_begin(cb);
      Tensor idx_t = on_tile(graph, DType::i32, n, tile, name + "/indices");
      copies.emplace_back(idx, idx_t);
      Tensor dy_t = on_tile(graph, DType::f32, n * w, tile, name + "/dy");
      copies.emplace_back(dy_cols[cb], dy_t);
      const std::size_t r0 = p.row_begin(rb), r1 = p.row_end(rb);
      for_each_chunk(r1 - r0, workers, [&](std::size_t a, std::size_t b) {
        graph.add_vertex(cs, {"ScatterAddRows",
                              tile,
                              {{idx_t}, {dy_t}, block_regions(out, p, r0 + a, r0 + b, cb)},
                              {double(r0 + a), double(r0 + b), double(w), double(rows)}});
      });
    }
  if (!columns.empty()) prog.add(Program::copy(std::move(columns)));
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  return out;
}

Tensor vq_nearest(Graph& graph, Program& prog, const Tensor& z, const Tensor& codebook,
                  const std::string& name) {
  expect(z.rank() == 2 && z.dtype() == DType::f32 && z.dim(1) > 0, name,
         "vq_nearest expects z float32[rows, dim] with dim >= 1, got " + describe(z));
  expect(codebook.rank() == 2 && codebook.dtype() == DType::f32 && codebook.dim(1) == z.dim(1) &&
             codebook.dim(0) > 0,
         name,
         "vq_nearest expects codebook float32[codes >= 1, " + std::to_string(z.dim(1)) + "], got " +
             describe(codebook));
  const std::size_t n = z.dim(0), dim = z.dim(1), codes = codebook.dim(0);
  Tensor out = graph.add_variable(DType::i32, {n}, name);
  if (n == 0) return out;
  // Grid of row blocks x code blocks; a tile holds a block of z and a block of the codebook.
  const std::size_t tiles = graph.tiles();
  std::size_t kb_count = 1, best_bytes = std::numeric_limits<std::size_t>::max();
  for (std::size_t kb = 1; kb <= std::min(codes, tiles); ++kb) {
    const std::size_t zb = std::clamp<std::size_t>(tiles / kb, 1, n);
    const std::size_t bytes = 4 * (ceil_div(n, zb) * (dim + 3) + ceil_div(codes, kb) * dim);
    if (bytes < best_bytes) best_bytes = bytes, kb_count = kb;
  }
  const std::size_t kpb = ceil_div(codes, kb_count);
  kb_count = ceil_div(codes, kpb);
  const std::size_t zpb = ceil_div(n, std::clamp<std::size_t>(tiles / kb_count, 1, n));
  const std::size_t zb_count = ceil_div(n, zpb);
  const std::size_t workers = graph.arch().workers_per_tile;

  std::vector<std::pair<Tensor, Tensor>> in_copies, part_copies;
  std::vector<Tensor> best(zb_count * kb_count);
  ComputeSetId partial = graph.add_compute_set(name + "/distances");
  for (std::size_t zb = 0; zb < zb_count; ++zb)
    for (std::size_t kb = 0; kb < kb_count; ++kb) {
      const unsigned tile = static_cast<unsigned>(zb * kb_count + kb);
      const std::size_t z0 = zb * zpb, z1 = std::min(n, z0 + zpb);
      const std::size_t k0 = kb * kpb, k1 = std::min(codes, k0 + kpb);
      Tensor z_t = on_tile(graph, DType::f32, (z1 - z0) * dim, tile, name + "/z");
      Tensor c_t = on_tile(graph, DType::f32, (k1 - k0) * dim, tile, name + "/codes");
      Tensor& b_t = best[zb * kb_count + kb];
      b_t = on_tile(graph, DType::u32, (z1 - z0) * 3, tile, name + "/best");
      in_copies.emplace_back(z.rows(z0, z1).flatten(), z_t);
      in_copies.emplace_back(codebook.rows(k0, k1).flatten(), c_t);
      for_each_chunk(z1 - z0, workers, [&](std::size_t a, std::size_t b) {
        graph.add_vertex(partial,
                         {"NearestCodePartial",
                          tile,
                          {{z_t.slice(a * dim, b * dim)}, {c_t}, {b_t.slice(a * 3, b * 3)}},
                          {double(dim), double(k0)}});
      });
    }
  prog.add(Program::copy(std::move(in_copies)));
  prog.add(Program::execute(partial));

  ComputeSetId reduce = graph.add_compute_set(name + "/argmin");
  for (std::size_t zb = 0; zb < zb_count; ++zb) {
    const unsigned tile = static_cast<unsigned>(zb * kb_count);
    const std::size_t z0 = zb * zpb, z1 = std::min(n, z0 + zpb);
    for_each_chunk(z1 - z0, workers, [&](std::size_t a, std::size_t b) {
      Tensor recv = on_tile(graph, DType::u32, kb_count * (b - a) * 3, tile, name + "/answers");
      Vertex v{"NearestCodeReduce", tile, {{}, {out.slice(z0 + a, z0 + b)}}, {}};
      for (std::size_t kb = 0; kb < kb_count; ++kb) {
        Tensor dst = recv.slice(kb * (b - a) * 3, (kb + 1) * (b - a) * 3);
        part_copies.emplace_back(best[zb * kb_count + kb].slice(a * 3, b * 3), dst);
        v.fields[0].push_back(dst);
      }
      graph.set_tile_mapping(out.slice(z0 + a, z0 + b), tile);
      graph.add_vertex(reduce, std::move(v));
    });
  }
  prog.add(Program::copy(std::move(part_copies)));
  prog.add(Program::execute(reduce));
  return out;
}

void vq_ema_update(Graph& graph, Program& prog, const Tensor& z, const Tensor& indices,
                   const Tensor& codebook, const Tensor& cluster_size, const Tensor& embed_sum,
                   double decay, double eps, const std::string& name) {
  expect(z.rank() == 2 && z.dtype() == DType::f32, name,
         "vq_ema_update expects z float32[rows, dim], got " + describe(z));
  const std::size_t n = z.dim(0), dim = z.dim(1);
  expect(codebook.rank() == 2 && codebook.dtype() == DType::f32 && codebook.dim(1) == dim &&
             codebook.dim(0) > 0,
         name,
         "vq_ema_update expects codebook float32[codes >= 1, " + std::to_string(dim) + "], got " +
             describe(codebook));
  const std::size_t codes = codebook.dim(0);
  expect(indices.dtype() == DType::i32 && indices.shape() == std::vector<std::size_t>{n}, name,
         "indices must be int32[" + std::to_string(n) + "], got " + describe(indices));
  expect(
      cluster_size.dtype() == DType::f32 && cluster_size.elements() == codes, name,
      "cluster_size must be float32[" + std::to_string(codes) + "], got " + describe(cluster_size));
  expect(
      embed_sum.dtype() == DType::f32 && embed_sum.shape() == codebook.shape(), name,
      "embed_sum must be like the codebook " + describe(codebook) + ", got " + describe(embed_sum));
  expect(decay >= 0 && decay <= 1, name, "decay must be in [0, 1], got " + std::to_string(decay));
  expect(eps >= 0, name, "eps must be >= 0, got " + std::to_string(eps));

  // A grid of row blocks x code blocks: tile (zb, kb) counts and sums its rows per code of its
  // block; tile (0, kb) adds the row blocks' partials in order and updates its codes.
  const std::size_t tiles = graph.tiles(), workers = graph.arch().workers_per_tile;
  std::size_t kb_count = 1, best_bytes = std::numeric_limits<std::size_t>::max();
  for (std::size_t kb = 1; kb <= std::min(codes, tiles); ++kb) {
    const std::size_t zb = std::clamp<std::size_t>(tiles / kb, 1, std::max<std::size_t>(n, 1));
    const std::size_t zpb = ceil_div(std::max<std::size_t>(n, 1), zb), kpb = ceil_div(codes, kb);
    const std::size_t grid = 4 * zpb * (dim + 2) + 8 * kpb * (dim + 1);
    const std::size_t reducer = grid + 8 * zb * kpb * (dim + 1) + 12 * kpb * dim;
    if (reducer < best_bytes) best_bytes = reducer, kb_count = kb;
  }
  const std::size_t kpb = ceil_div(codes, kb_count);
  kb_count = ceil_div(codes, kpb);
  const std::size_t zpb =
      ceil_div(std::max<std::size_t>(n, 1),
               std::clamp<std::size_t>(tiles / kb_count, 1, std::max<std::size_t>(n, 1)));
  const std::size_t zb_count = n ? ceil_div(n, zpb) : 0;
  const Tensor cs_flat = cluster_size.flatten(), es_flat = embed_sum.flatten(),
               cb_flat = codebook.flatten();
  std::vector<std::pair<Tensor, Tensor>> in, parts_in, gather_sizes, spread_total, out;
  Tensor all_sizes = on_tile(graph, DType::f32, codes, 0, name + "/cluster_sizes");
  Tensor total0 = on_tile(graph, DType::u32, 2, 0, name + "/total");
  ComputeSetId partial = graph.add_compute_set(name + "/partials");
  ComputeSetId accumulate = graph.add_compute_set(name + "/accumulate");
  ComputeSetId normalise = graph.add_compute_set(name + "/normalise");
  for (std::size_t b = 0; b < kb_count; ++b) {
    const unsigned tile = static_cast<unsigned>(b);  // grid tile (0, b)
    const std::size_t k0 = b * kpb, k1 = std::min(codes, k0 + kpb), kc = k1 - k0;
    Tensor cs_t = on_tile(graph, DType::f32, kc, tile, name + "/cluster_size");
    Tensor es_t = on_tile(graph, DType::f32, kc * dim, tile, name + "/embed_sum");
    Tensor cb_t = on_tile(graph, DType::f32, kc * dim, tile, name + "/codebook");
    Tensor total_t = tile == 0 ? total0 : on_tile(graph, DType::u32, 2, tile, name + "/total");
    in.emplace_back(cs_flat.slice(k0, k1), cs_t);
    in.emplace_back(es_flat.slice(k0 * dim, k1 * dim), es_t);
    in.emplace_back(cb_flat.slice(k0 * dim, k1 * dim), cb_t);
    gather_sizes.emplace_back(cs_t, all_sizes.slice(k0, k1));
    if (tile != 0) spread_total.emplace_back(total0, total_t);
    out.emplace_back(cs_t, cs_flat.slice(k0, k1));
    out.emplace_back(es_t, es_flat.slice(k0 * dim, k1 * dim));
    out.emplace_back(cb_t, cb_flat.slice(k0 * dim, k1 * dim));
    std::vector<Tensor> z_t, idx_t;  // per row block, on its grid tile
    for (std::size_t zb = 0; zb < zb_count; ++zb) {
      const unsigned grid_tile = static_cast<unsigned>(zb * kb_count + b);
      const std::size_t z0 = zb * zpb, z1 = std::min(n, z0 + zpb);
      z_t.push_back(on_tile(graph, DType::f32, (z1 - z0) * dim, grid_tile, name + "/z"));
      idx_t.push_back(on_tile(graph, DType::i32, z1 - z0, grid_tile, name + "/indices"));
      in.emplace_back(z.rows(z0, z1).flatten(), z_t.back());
      in.emplace_back(indices.slice(z0, z1), idx_t.back());
    }
    // Per worker range of codes: partials on every row block's tile, added on this tile.
    for_each_chunk(kc, workers, [&](std::size_t a, std::size_t e) {
      const std::size_t part_len = (e - a) * (dim + 1) * 2;
      Tensor recv = on_tile(graph, DType::u32, zb_count * part_len, tile, name + "/partials_in");
      Vertex acc{"CodebookEmaAccumulate",
                 tile,
                 {{}, {cs_t.slice(a, e)}, {es_t.slice(a * dim, e * dim)}},
                 {decay, double(dim)}};
      for (std::size_t zb = 0; zb < zb_count; ++zb) {
        const unsigned grid_tile = static_cast<unsigned>(zb * kb_count + b);
        Tensor part = on_tile(graph, DType::u32, part_len, grid_tile, name + "/partial");
        graph.add_vertex(partial, {"CodebookEmaPartial",
                                   grid_tile,
                                   {{z_t[zb]}, {idx_t[zb]}, {part}},
                                   {double(k0 + a), double(codes), double(dim), double(zb * zpb)}});
        parts_in.emplace_back(part, recv.slice(zb * part_len, (zb + 1) * part_len));
        acc.fields[0].push_back(recv.slice(zb * part_len, (zb + 1) * part_len));
      }
      graph.add_vertex(accumulate, std::move(acc));
      graph.add_vertex(normalise, {"CodebookEmaNormalise",
                                   tile,
                                   {{cs_t.slice(a, e)},
                                    {es_t.slice(a * dim, e * dim)},
                                    {total_t},
                                    {cb_t.slice(a * dim, e * dim)}},
                                   {double(codes), eps, double(dim)}});
    });
  }
  // The total of the updated cluster sizes, summed in code order on one tile.
  ComputeSetId total = graph.add_compute_set(name + "/total");
  graph.add_vertex(total, {"SumInOrder", 0, {{all_sizes}, {total0}}, {}});
  prog.add(Program::copy(std::move(in)));
  prog.add(Program::execute(partial));
  prog.add(Program::copy(std::move(parts_in)));
  prog.add(Program::execute(accumulate));
  prog.add(Program::copy(std::move(gather_sizes)));
  prog.add(Program::execute(total));
  if (!spread_total.empty()) prog.add(Program::copy(std::move(spread_total)));
  prog.add(Program::execute(normalise));
  prog.add(Program::copy(std::move(out)));
}

}  // namespace ops
}  // namespace ipupod::ipu

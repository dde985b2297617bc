// Matrix multiply: planner, lowering and the MatMulBlock codelet.
#include "ipu_process/ops/matmul.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "ipu_process/codelets.hpp"

namespace ipupod::ipu {

void register_matmul_codelets(CodeletRegistry& r) {
  r.add({"MatMulBlock",
         "rows [r0, r0 + rows(c)) of a tile's output block: c[i] = op(a)[i,:] x op(b); "
         "params: block rows bm, depth k, block columns bn, a transposed, b transposed, r0",
         {"a", "b", "c"},
         [](const VertexContext& c) {
           auto a = c.region<const float>(0);
           auto b = c.region<const float>(1);
           const std::size_t bm = c.size_param(0), k = c.size_param(1), bn = c.size_param(2);
           const bool ta = c.param(3) != 0, tb = c.param(4) != 0;
           const std::size_t r0 = c.size_param(5);
           for (std::size_t i = 0; i < c.regions(2); ++i) {
             auto out = c.region<float>(2, i);
             std::fill(out.begin(), out.end(), 0.f);
             const std::size_t row = r0 + i;
             for (std::size_t p = 0; p < k; ++p) {
               const float av = ta ? a[p * bm + row] : a[row * k + p];
               if (tb)
                 for (std::size_t j = 0; j < bn; ++j) out[j] += av * b[j * k + p];
               else
                 for (std::size_t j = 0; j < bn; ++j) out[j] += av * b[p * bn + j];
             }
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           const double rows = static_cast<double>(v.fields[2].size());
           return amp_cycles(a, 2.0 * rows * v.params[1] * v.params[2]);
         }});
}

namespace ops {

MatMulPlan plan_matmul(const ArchPreset& arch, std::size_t m, std::size_t k, std::size_t n) {
  // Minimise compute + exchange on the busiest tile, under a per-tile memory budget.
  const double budget = kAvailableMemoryProportion * static_cast<double>(arch.bytes_per_tile);
  MatMulPlan best;
  double best_cost = std::numeric_limits<double>::infinity();
  double best_bytes = std::numeric_limits<double>::infinity();
  std::size_t last_bm = 0;
  for (std::size_t gm = 1; gm <= std::min<std::size_t>(m, arch.tiles); ++gm) {
    const std::size_t bm = (m + gm - 1) / gm;
    if (bm == last_bm) continue;
    last_bm = bm;
    const std::size_t gm_used = (m + bm - 1) / bm;
    std::size_t last_bn = 0;
    for (std::size_t gn = 1; gn <= std::min<std::size_t>(n, arch.tiles / gm_used); ++gn) {
      const std::size_t bn = (n + gn - 1) / gn;
      if (bn == last_bn) continue;
      last_bn = bn;
      const double bytes = 4.0 * static_cast<double>(bm * k + k * bn + bm * bn);
      const double rows_per_worker = std::ceil(static_cast<double>(bm) / arch.workers_per_tile);
      const double compute =
          rows_per_worker * (arch.vertex_overhead_cycles + 2.0 * k * bn * arch.workers_per_tile /
                                                               arch.fp32_flops_per_cycle_per_tile);
      const double exchange =
          4.0 * static_cast<double>(bm * k + k * bn) / arch.exchange_bytes_per_cycle_per_tile;
      const double cost = compute + exchange;
      const bool fits = bytes <= budget, best_fits = best_bytes <= budget;
      if ((fits && (!best_fits || cost < best_cost)) ||
          (!fits && !best_fits && bytes < best_bytes)) {
        best = {gm_used, (n + bn - 1) / bn, static_cast<std::uint64_t>(cost)};
        best_cost = cost;
        best_bytes = bytes;
      }
    }
  }
  return best;
}

Tensor matmul(Graph& graph, Program& prog, const Tensor& a, const Tensor& b, bool ta, bool tb,
              const std::string& name) {
  if (a.rank() != 2 || b.rank() != 2)
    throw std::invalid_argument(name + ": matmul expects rank-2 operands, got ranks " +
                                std::to_string(a.rank()) + " and " + std::to_string(b.rank()));
  const std::size_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const std::size_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb)
    throw std::invalid_argument(name + ": inner dimensions differ: op(a) is [" + std::to_string(m) +
                                "," + std::to_string(k) + "], op(b) is [" + std::to_string(kb) +
                                "," + std::to_string(n) + "]");
  const MatMulPlan plan = plan_matmul(graph.arch(), m, k, n);
  const std::size_t bm = (m + plan.row_blocks - 1) / plan.row_blocks;
  const std::size_t bn = (n + plan.col_blocks - 1) / plan.col_blocks;
  Tensor c = graph.add_variable(DType::f32, {m, n}, name);
  std::vector<std::pair<Tensor, Tensor>> copies;
  ComputeSetId cs = graph.add_compute_set(name);
  const std::size_t workers = graph.arch().workers_per_tile;
  unsigned tile = 0;
  for (std::size_t r0 = 0; r0 < m; r0 += bm) {
    const std::size_t r1 = std::min(m, r0 + bm), rows = r1 - r0;
    for (std::size_t c0 = 0; c0 < n; c0 += bn, ++tile) {
      const std::size_t c1 = std::min(n, c0 + bn), cols = c1 - c0;
      const std::string at = "@" + std::to_string(tile);
      // Operand pieces this block needs, gathered onto its tile by the exchange.
      Tensor a_local =
          graph.add_variable(DType::f32, ta ? std::vector{k, rows} : std::vector{rows, k},
                             name + "/a" + at, MemoryCategory::temporary);
      Tensor b_local =
          graph.add_variable(DType::f32, tb ? std::vector{cols, k} : std::vector{k, cols},
                             name + "/b" + at, MemoryCategory::temporary);
      graph.set_tile_mapping(a_local, tile);
      graph.set_tile_mapping(b_local, tile);
      if (ta)
        for (std::size_t p = 0; p < k; ++p)
          copies.emplace_back(a.row(p).slice(r0, r1), a_local.row(p));
      else
        copies.emplace_back(a.rows(r0, r1).flatten(), a_local.flatten());
      if (tb)
        copies.emplace_back(b.rows(c0, c1).flatten(), b_local.flatten());
      else
        for (std::size_t p = 0; p < k; ++p)
          copies.emplace_back(b.row(p).slice(c0, c1), b_local.row(p));
      for (std::size_t r = r0; r < r1; ++r) graph.set_tile_mapping(c.row(r).slice(c0, c1), tile);
      // Rows of the block shared out between the tile's workers.
      const std::size_t per_worker = (rows + workers - 1) / workers;
      for (std::size_t w0 = 0; w0 < rows; w0 += per_worker) {
        const std::size_t w1 = std::min(rows, w0 + per_worker);
        Vertex v{"MatMulBlock",
                 tile,
                 {{a_local}, {b_local}, {}},
                 {double(rows), double(k), double(cols), double(ta), double(tb), double(w0)}};
        for (std::size_t r = w0; r < w1; ++r) v.fields[2].push_back(c.row(r0 + r).slice(c0, c1));
        graph.add_vertex(cs, std::move(v));
      }
    }
  }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  return c;
}

}  // namespace ops
}  // namespace ipupod::ipu

// Reductions and their codelets.
#include "ipu_process/ops/reduce.hpp"

#include <stdexcept>

#include "ipu_process/codelets.hpp"

namespace ipupod::ipu {

void register_reduce_codelets(CodeletRegistry& r) {
  r.add({"ColumnSum",
         "out[j] = sum_i in[i, j]; params: rows m, columns n",
         {"in", "out"},
         [](const VertexContext& c) {
           auto in = c.region<const float>(0);
           auto out = c.region<float>(1);
           const std::size_t m = c.size_param(0), n = c.size_param(1);
           for (std::size_t j = 0; j < n; ++j) out[j] = 0.f;
           for (std::size_t i = 0; i < m; ++i)
             for (std::size_t j = 0; j < n; ++j) out[j] += in[i * n + j];
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, v.fields[0][0].elements(), 1, v.fields[0][0].dtype());
         }});
  r.add({"SumScaled",
         "out = scale * sum of every region; param: scale",
         {"in", "out"},
         [](const VertexContext& c) {
           float s = 0.f;
           for (std::size_t i = 0; i < c.regions(0); ++i)
             for (float x : c.region<const float>(0, i)) s += x;
           c.region<float>(1)[0] = static_cast<float>(c.param(0)) * s;
         },
         [](const Vertex& v, const ArchPreset& a) {
           std::size_t n = 0;
           for (const auto& t : v.fields[0]) n += t.elements();
           return vector_cycles(a, n, 1);
         }});
}

namespace ops {

Tensor column_sum(Graph& graph, Program& prog, const Tensor& x, const std::string& name) {
  if (x.rank() != 2) throw std::invalid_argument(name + ": column_sum expects a rank-2 tensor");
  const std::size_t m = x.dim(0), n = x.dim(1);
  Tensor out = graph.add_variable(DType::f32, {n}, name);
  ComputeSetId cs = graph.add_compute_set(name);
  std::vector<std::pair<Tensor, Tensor>> copies;
  const std::size_t tiles = std::min<std::size_t>(graph.tiles(), n);
  const std::size_t per = (n + tiles - 1) / tiles;
  unsigned tile = 0;
  for (std::size_t c0 = 0; c0 < n; c0 += per, ++tile) {
    const std::size_t c1 = std::min(n, c0 + per);
    Tensor local = graph.add_variable(x.dtype(), {m, c1 - c0}, name + "/in@" + std::to_string(tile),
                                      MemoryCategory::temporary);
    graph.set_tile_mapping(local, tile);
    graph.set_tile_mapping(out.slice(c0, c1), tile);
    for (std::size_t i = 0; i < m; ++i) copies.emplace_back(x.row(i).slice(c0, c1), local.row(i));
    graph.add_vertex(cs, {"ColumnSum",
                          tile,
                          {{local.flatten()}, {out.slice(c0, c1)}},
                          {double(m), double(c1 - c0)}});
  }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  return out;
}

Tensor sum_scaled(Graph& graph, Program& prog, const Tensor& x, float scale, unsigned tile,
                  const std::string& name) {
  Tensor local =
      graph.add_variable(DType::f32, {x.elements()}, name + "/in", MemoryCategory::temporary);
  Tensor out = graph.add_variable(DType::f32, {}, name);
  graph.set_tile_mapping(local, tile);
  graph.set_tile_mapping(out, tile);
  prog.add(Program::copy(x.flatten(), local));
  ComputeSetId cs = graph.add_compute_set(name);
  graph.add_vertex(cs, {"SumScaled", tile, {{local}, {out}}, {double(scale)}});
  prog.add(Program::execute(cs));
  return out;
}

}  // namespace ops
}  // namespace ipupod::ipu

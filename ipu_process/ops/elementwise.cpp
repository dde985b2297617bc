// Elementwise op library and its codelets.
#include "ipu_process/ops/elementwise.hpp"

#include <algorithm>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"

namespace ipupod::ipu {

namespace {
std::uint64_t first_field_vector_cycles(const Vertex& v, const ArchPreset& arch,
                                        std::size_t instructions) {
  return vector_cycles(arch, v.fields[0][0].elements(), instructions, v.fields[0][0].dtype());
}
}  // namespace

void register_elementwise_codelets(CodeletRegistry& r) {
  r.add({"Relu",
         "out = max(in, 0)",
         {"in", "out"},
         [](const VertexContext& c) {
           auto in = c.region<const float>(0);
           auto out = c.region<float>(1);
           for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
         },
         [](const Vertex& v, const ArchPreset& a) { return first_field_vector_cycles(v, a, 1); },
         {"out"},
         false,
         {"in", "out"}});
  r.add({"ReluGrad",
         "dx = y > 0 ? dy : 0",
         {"dy", "y", "dx"},
         [](const VertexContext& c) {
           auto dy = c.region<const float>(0);
           auto y = c.region<const float>(1);
           auto dx = c.region<float>(2);
           for (std::size_t i = 0; i < dy.size(); ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
         },
         [](const Vertex& v, const ArchPreset& a) { return first_field_vector_cycles(v, a, 2); },
         {"dx"},
         false,
         {"dy", "y", "dx"}});
  r.add({"Add",
         "out = a + b",
         {"a", "b", "out"},
         [](const VertexContext& c) {
           auto a = c.region<const float>(0);
           auto b = c.region<const float>(1);
           auto out = c.region<float>(2);
           for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
         },
         [](const Vertex& v, const ArchPreset& a) { return first_field_vector_cycles(v, a, 1); },
         {"out"},
         false,
         {"a", "b", "out"}});
  r.add({"AddBias",
         "out = x + bias[column]; params: row width n, column of x's first element",
         {"x", "bias", "out"},
         [](const VertexContext& c) {
           auto x = c.region<const float>(0);
           auto bias = c.region<const float>(1);
           auto out = c.region<float>(2);
           const std::size_t n = c.size_param(0);
           std::size_t col = c.size_param(1);
           for (std::size_t i = 0; i < x.size(); ++i) {
             out[i] = x[i] + bias[col];
             if (++col == n) col = 0;
           }
         },
         [](const Vertex& v, const ArchPreset& a) { return first_field_vector_cycles(v, a, 1); },
         {"out"}});
  r.add({"ScaledAddInPlace",
         "acc += factor * g; param: factor",
         {"acc", "g"},
         [](const VertexContext& c) {
           auto acc = c.region<float>(0);
           auto g = c.region<const float>(1);
           const float f = static_cast<float>(c.param(0));
           for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += f * g[i];
         },
         [](const Vertex& v, const ArchPreset& a) { return first_field_vector_cycles(v, a, 1); },
         {},
         false,
         {"acc", "g"}});
  r.add({"Zero",
         "out = 0",
         {"out"},
         [](const VertexContext& c) {
           auto out = c.region<float>(0);
           std::fill(out.begin(), out.end(), 0.f);
         },
         [](const Vertex& v, const ArchPreset& a) { return first_field_vector_cycles(v, a, 1); },
         {"out"},
         false,
         {"out"}});
}

namespace ops {
namespace {
constexpr std::size_t kMinElementsPerWorker = 64;

void check_same_shape(const Tensor& a, const Tensor& b, const std::string& name) {
  if (a.shape() != b.shape())
    throw std::invalid_argument(name + ": operand shapes differ (" + std::to_string(a.elements()) +
                                " vs " + std::to_string(b.elements()) + " elements)");
}

}  // namespace

Tensor relu(Graph& graph, Program& prog, const Tensor& x, const std::string& name) {
  Tensor out = clone_like(graph, x, name);
  ComputeSetId cs = graph.add_compute_set(name);
  add_elementwise_vertices(graph, cs, "Relu", {x, out}, out, kMinElementsPerWorker);
  prog.add(Program::execute(cs));
  return out;
}

Tensor relu_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& y,
                 const std::string& name) {
  check_same_shape(dy, y, name);
  Tensor dx = clone_like(graph, y, name);
  Tensor dy_local = rearrange_like(graph, prog, dy, y, name + "/dy");
  ComputeSetId cs = graph.add_compute_set(name);
  add_elementwise_vertices(graph, cs, "ReluGrad", {dy_local, y, dx}, dx, kMinElementsPerWorker);
  prog.add(Program::execute(cs));
  return dx;
}

Tensor add(Graph& graph, Program& prog, const Tensor& a, const Tensor& b, const std::string& name) {
  check_same_shape(a, b, name);
  Tensor out = clone_like(graph, a, name);
  Tensor b_local = rearrange_like(graph, prog, b, a, name + "/b");
  ComputeSetId cs = graph.add_compute_set(name);
  add_elementwise_vertices(graph, cs, "Add", {a, b_local, out}, out, kMinElementsPerWorker);
  prog.add(Program::execute(cs));
  return out;
}

Tensor add_bias(Graph& graph, Program& prog, const Tensor& x, const Tensor& bias,
                const std::string& name) {
  if (x.rank() != 2 || bias.rank() != 1 || bias.dim(0) != x.dim(1))
    throw std::invalid_argument(name + ": add_bias expects x [m, n] and bias [n], got bias of " +
                                std::to_string(bias.elements()) + " elements");
  const std::size_t n = x.dim(1);
  Tensor out = clone_like(graph, x, name);
  // Every tile that holds part of x gets its own copy of the bias row.
  std::map<unsigned, Tensor> bias_on_tile;
  std::vector<std::pair<Tensor, Tensor>> copies;
  for (const auto& iv : graph.tile_mapping(x))
    if (!bias_on_tile.count(iv.tile)) {
      Tensor local = graph.add_variable(
          bias.dtype(), {n}, name + "/bias@" + std::to_string(iv.tile), MemoryCategory::temporary);
      graph.set_tile_mapping(local, iv.tile);
      bias_on_tile.emplace(iv.tile, local);
      copies.emplace_back(bias, local);
    }
  prog.add(Program::copy(std::move(copies)));
  ComputeSetId cs = graph.add_compute_set(name);
  const Tensor xf = x.flatten(), of = out.flatten();
  for_each_worker_piece(
      graph, x, kMinElementsPerWorker, [&](unsigned tile, std::size_t b, std::size_t e) {
        graph.add_vertex(cs, {"AddBias",
                              tile,
                              {{xf.slice(b, e)}, {bias_on_tile.at(tile)}, {of.slice(b, e)}},
                              {static_cast<double>(n), static_cast<double>(b % n)}});
      });
  prog.add(Program::execute(cs));
  return out;
}

void scaled_add_in_place(Graph& graph, Program& prog, const Tensor& acc, const Tensor& g,
                         float factor, const std::string& name) {
  check_same_shape(acc, g, name);
  Tensor g_local = rearrange_like(graph, prog, g, acc, name + "/g");
  ComputeSetId cs = graph.add_compute_set(name);
  add_elementwise_vertices(graph, cs, "ScaledAddInPlace", {acc, g_local}, acc,
                           kMinElementsPerWorker, {static_cast<double>(factor)});
  prog.add(Program::execute(cs));
}

void zero(Graph& graph, Program& prog, const Tensor& t, const std::string& name) {
  ComputeSetId cs = graph.add_compute_set(name);
  add_elementwise_vertices(graph, cs, "Zero", {t}, t, kMinElementsPerWorker);
  prog.add(Program::execute(cs));
}

}  // namespace ops
}  // namespace ipupod::ipu

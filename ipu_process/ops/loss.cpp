// Softmax cross-entropy and its gradient, row blocks spread over tiles.
#include "ipu_process/ops/loss.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/reduce.hpp"

namespace ipupod::ipu {

namespace {
// Softmax of one row into out (out may be nullptr: returns log-sum-exp only).
float log_sum_exp(std::span<const float> row) {
  const float mx = *std::max_element(row.begin(), row.end());
  float s = 0.f;
  for (float x : row) s += std::exp(x - mx);
  return mx + std::log(s);
}
// A label outside [0, classes) is rejected by the host before it reaches the device; the
// vertex only guards its memory accesses.
bool valid_label(std::int32_t label, std::size_t classes) {
  return label >= 0 && static_cast<std::size_t>(label) < classes;
}
std::uint64_t rows_cycles(const Vertex& v, const ArchPreset& a) {
  // exp, max and sum passes over every logit: a handful of vector instructions each.
  return vector_cycles(a, v.fields[0][0].elements(), 8);
}
}  // namespace

void register_loss_codelets(CodeletRegistry& r) {
  r.add({"SoftmaxCrossEntropyRows",
         "loss[i] = logsumexp(logits[i]) - logits[i, label[i]]; params: rows, classes",
         {"logits", "labels", "loss"},
         [](const VertexContext& c) {
           auto logits = c.region<const float>(0);
           auto labels = c.region<const std::int32_t>(1);
           auto loss = c.region<float>(2);
           const std::size_t rows = c.size_param(0), classes = c.size_param(1);
           for (std::size_t i = 0; i < rows; ++i) {
             auto row = logits.subspan(i * classes, classes);
             loss[i] = valid_label(labels[i], classes) ? log_sum_exp(row) - row[labels[i]] : 0.f;
           }
         },
         rows_cycles});
  r.add({"SoftmaxCrossEntropyGradRows",
         "dlogits[i] = (softmax(logits[i]) - onehot(label[i])) * dloss * scale; params: rows, "
         "classes, scale",
         {"logits", "labels", "dloss", "dlogits"},
         [](const VertexContext& c) {
           auto logits = c.region<const float>(0);
           auto labels = c.region<const std::int32_t>(1);
           const float dloss = c.region<const float>(2)[0];
           auto dlogits = c.region<float>(3);
           const std::size_t rows = c.size_param(0), classes = c.size_param(1);
           const float scale = static_cast<float>(c.param(2)) * dloss;
           for (std::size_t i = 0; i < rows; ++i) {
             auto row = logits.subspan(i * classes, classes);
             const float lse = log_sum_exp(row);
             for (std::size_t j = 0; j < classes; ++j) {
               const float onehot =
                   valid_label(labels[i], classes) && std::size_t(labels[i]) == j ? 1.f : 0.f;
               dlogits[i * classes + j] = (std::exp(row[j] - lse) - onehot) * scale;
             }
           }
         },
         rows_cycles});
}

namespace ops {
namespace {
void check(const Tensor& logits, const Tensor& labels, const std::string& name) {
  if (logits.rank() != 2 || labels.rank() != 1 || labels.dim(0) != logits.dim(0) ||
      labels.dtype() != DType::i32)
    throw std::invalid_argument(name + ": expects logits [m, c] float32 and labels [m] int32");
}

struct RowBlock {
  unsigned tile;
  std::size_t r0, r1;
  Tensor logits, labels;
};

// Copies each row block's logits and labels onto its tile.
std::vector<RowBlock> gather_rows(Graph& graph, Program& prog, const Tensor& logits,
                                  const Tensor& labels, const std::string& name) {
  std::vector<RowBlock> blocks;
  std::vector<std::pair<Tensor, Tensor>> copies;
  const std::size_t classes = logits.dim(1);
  for_each_row_block(graph, logits.dim(0), [&](unsigned tile, std::size_t r0, std::size_t r1) {
    const std::string at = "@" + std::to_string(tile);
    Tensor l = graph.add_variable(DType::f32, {r1 - r0, classes}, name + "/logits" + at,
                                  MemoryCategory::temporary);
    Tensor y =
        graph.add_variable(DType::i32, {r1 - r0}, name + "/labels" + at, MemoryCategory::temporary);
    graph.set_tile_mapping(l, tile);
    graph.set_tile_mapping(y, tile);
    copies.emplace_back(logits.rows(r0, r1).flatten(), l.flatten());
    copies.emplace_back(labels.slice(r0, r1), y);
    blocks.push_back({tile, r0, r1, l, y});
  });
  prog.add(Program::copy(std::move(copies)));
  return blocks;
}
}  // namespace

Tensor softmax_cross_entropy(Graph& graph, Program& prog, const Tensor& logits,
                             const Tensor& labels, const std::string& name) {
  check(logits, labels, name);
  const std::size_t m = logits.dim(0), classes = logits.dim(1);
  Tensor losses = graph.add_variable(DType::f32, {m}, name + "/per_sample");
  auto blocks = gather_rows(graph, prog, logits, labels, name);
  ComputeSetId cs = graph.add_compute_set(name);
  for (const auto& b : blocks) {
    graph.set_tile_mapping(losses.slice(b.r0, b.r1), b.tile);
    graph.add_vertex(cs, {"SoftmaxCrossEntropyRows",
                          b.tile,
                          {{b.logits.flatten()}, {b.labels}, {losses.slice(b.r0, b.r1)}},
                          {double(b.r1 - b.r0), double(classes)}});
  }
  prog.add(Program::execute(cs));
  return sum_scaled(graph, prog, losses, 1.0f / static_cast<float>(m), 0, name + "/mean");
}

Tensor softmax_cross_entropy_grad(Graph& graph, Program& prog, const Tensor& logits,
                                  const Tensor& labels, const Tensor& dloss,
                                  const std::string& name) {
  check(logits, labels, name);
  const std::size_t m = logits.dim(0), classes = logits.dim(1);
  Tensor dlogits = graph.add_variable(DType::f32, {m, classes}, name);
  auto blocks = gather_rows(graph, prog, logits, labels, name);
  std::vector<std::pair<Tensor, Tensor>> copies;
  std::vector<Tensor> dloss_local;
  for (const auto& b : blocks) {
    Tensor d = graph.add_variable(DType::f32, {1}, name + "/dloss@" + std::to_string(b.tile),
                                  MemoryCategory::temporary);
    graph.set_tile_mapping(d, b.tile);
    copies.emplace_back(dloss.flatten(), d);
    dloss_local.push_back(d);
  }
  prog.add(Program::copy(std::move(copies)));
  ComputeSetId cs = graph.add_compute_set(name);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    Tensor out = dlogits.rows(b.r0, b.r1).flatten();
    graph.set_tile_mapping(out, b.tile);
    graph.add_vertex(cs, {"SoftmaxCrossEntropyGradRows",
                          b.tile,
                          {{b.logits.flatten()}, {b.labels}, {dloss_local[i]}, {out}},
                          {double(b.r1 - b.r0), double(classes), 1.0 / double(m)}});
  }
  prog.add(Program::execute(cs));
  return dlogits;
}

}  // namespace ops
}  // namespace ipupod::ipu

// Replicated tensor sharding of the optimizer state: reduce-scatter, sharded updates, all-gather.
#include "pod/compiler/replicated_sharding.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "fabric/collectives.hpp"

namespace ipupod::pod {

ShardedWeights shard_optimizer_state(const models::Model& model, const StepShape& shape,
                                     StepAccumulators& acc, const CompiledModel& out,
                                     Lowering& lowering, ipu::Program& step) {
  for (const auto& op : model.graph.ops())
    if (op.kind == OpKind::lamb_step || op.kind == OpKind::global_norm)
      throw std::invalid_argument(
          "replicated tensor sharding does not support " +
          std::string(op.kind == OpKind::lamb_step ? "LAMB" : "gradient clipping") +
          " yet (their norms would span the replicas' shards); use adam, adamw or "
          "sgd_momentum without --clip-norm, or drop --replicated-tensor-sharding");
  ShardedWeights weights;
  std::vector<ipu::Tensor> gradient_blocks;
  std::size_t total = 0;
  for (const ipu::Tensor& a : acc.updated) total += a.elements();
  const auto block =
      fabric::ring_chunk(total, static_cast<int>(shape.replicas), static_cast<int>(shape.replica));
  std::size_t offset = 0;
  lowering.set_sharded(true);
  for (std::size_t j = 0; j < acc.updates.size(); ++j) {
    const ipu::Tensor& a = acc.updated[j];
    const std::size_t lo = std::max(block.begin, offset),
                      hi = std::min(block.end, offset + a.elements());
    const models::ValueId param_id = acc.updates[j]->inputs[0];
    weights.whole.push_back(out.parameters.at(param_id).flatten());
    if (lo < hi) {
      const ipu::Tensor w = weights.whole.back().slice(lo - offset, hi - offset);
      // The block lands in the accumulator's own elements (the collective reads all of its
      // input before it writes the block): no buffer for it.
      const ipu::Tensor gradient = a.flatten().slice(lo - offset, hi - offset);
      lowering.shard(param_id, lo - offset, hi - offset);
      for (auto& [grad_id, bound] : acc.mean_gradients)
        if (bound.variable() == a.variable()) bound = gradient;
      gradient_blocks.push_back(gradient);
      weights.blocks.push_back(w);
    }
    offset += a.elements();
  }
  std::vector<ipu::Tensor> flat;
  for (const ipu::Tensor& a : acc.updated) flat.push_back(a.flatten());
  if (!flat.empty())
    step.add(ipu::Program::reduce_scatter(flat, gradient_blocks, ipu::CollectiveOp::mean));
  std::vector<ipu::Tensor> rest;  // plain SGD's, which keeps no state
  for (const ipu::Tensor& a : acc.all)
    if (std::none_of(acc.updated.begin(), acc.updated.end(),
                     [&](const ipu::Tensor& u) { return u.variable() == a.variable(); }))
      rest.push_back(a);
  if (!rest.empty()) step.add(ipu::Program::all_reduce(rest, ipu::CollectiveOp::mean));
  return weights;
}

}  // namespace ipupod::pod

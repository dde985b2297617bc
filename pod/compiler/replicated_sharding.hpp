// Replicated tensor sharding (PopTorch's name): with replicas > 1 each replica keeps only its
// block of the stateful optimizers' state and updates only its block of the weights.
#pragma once

#include <utility>
#include <vector>

#include "ipu_process/program.hpp"
#include "pod/compiler/compiler.hpp"
#include "pod/compiler/lowering.hpp"

namespace ipupod::pod {

// A step's gradient accumulators and the stateful updates that read them.
struct StepAccumulators {
  std::vector<ipu::Tensor> all;  // every parameter's, in the order they were made
  // The mean gradients the stateful updates read, bound to their accumulators (the sharding
  // rebinds them to the accumulator's block).
  std::vector<std::pair<models::ValueId, ipu::Tensor>> mean_gradients;
  std::vector<ipu::Tensor> updated;        // the stateful updates' accumulators, once each
  std::vector<const models::Op*> updates;  // the stateful updates of this stage
};

// What the step gathers back after the optimizer: each replica's updated blocks of the weights.
struct ShardedWeights {
  std::vector<ipu::Tensor> blocks;  // this replica's blocks
  std::vector<ipu::Tensor> whole;   // the weights they are blocks of (flattened)
};

// The stateful updates' accumulators, end to end, form one buffer of which this replica keeps
// block `shape.replica` of the reduction; each parameter's part of that block is its shard
// (possibly none), updated here and gathered back from every replica after. Adds the
// reduce-scatter (and the plain SGD accumulators' all-reduce) to `step`, tells the lowering
// which shard each update changes, and returns what to all-gather after the optimizer.
ShardedWeights shard_optimizer_state(const models::Model& model, const StepShape& shape,
                                     StepAccumulators& accumulators, const CompiledModel& out,
                                     Lowering& lowering, ipu::Program& step);

}  // namespace ipupod::pod

// Automatic pipeline split: cuts a model's forward ops, in graph order, into S contiguous stages
// that balance estimated cycles under each IPU's memory (PopTorch leaves the split to the user).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "models/ir.hpp"

namespace ipupod::models {

// The hardware figures the estimate needs, for one IPU; the caller takes them from its
// architecture preset and topology (models/ knows no hardware).
struct SplitCosts {
  double matmul_flops_per_cycle = 0;     // matrix (AMP) units of all tiles
  double vector_elements_per_cycle = 0;  // elementwise throughput of all tiles
  double per_op_cycles = 0;              // sync and exchange set-up of each compute set
  double link_bytes_per_cycle = 0;       // between neighbouring stages
  double memory_bytes = 0;               // usable memory of one IPU
  double parameter_copies = 2;           // weight, gradient accumulator, optimizer moments
};

struct StageEstimate {
  std::size_t ops = 0;      // forward compute ops (parameters and state follow their users)
  std::string first, last;  // names of its first and last forward compute ops
  double cycles = 0;        // forward + backward + transfers, per micro-batch
  double bytes = 0;         // parameters with their copies + stashed activations
};

struct SplitPlan {
  std::vector<StageEstimate> stages;
  bool fits = true;    // false: no split fits the estimated memory; the balanced one was taken
  bool given = false;  // the user's (split_at), not searched for
};

// Sets pipeline_stage of every op of `g` (a forward graph, before autodiff): compute ops by a
// contiguous partition minimising the largest stage's estimated cycles subject to the estimated
// memory, inputs on stage 0, parameters, state and constants on the stage of their first user.
// Throws std::invalid_argument when there are fewer compute ops than stages.
SplitPlan split_pipeline(Graph& g, std::size_t stages, const SplitCosts& costs);

// Whether an op named `name` is in the block `block`, a module path as `ipupod info --model`
// lists the layers (PopTorch's BeginBlock names a module so): the op's module path, the name
// itself or, for an exported ONNX node, the one its '/'-separated scopes spell
// ("/layer3/layer3.0/conv1/Conv": layer3.0.conv1.Conv), is `block` or begins with `block` and a
// '.' ("layer3" names "layer3.0.conv1", not "layer30").
bool names_block(std::string_view name, std::string_view block);

// A split by the user (`--split-at`): stage s + 1 begins at the first forward compute op after
// stage s's first that `starts[s]` names (names_block); the other ops go as split_pipeline puts
// them. Throws std::invalid_argument naming a start that names no later compute op, or an empty
// one.
SplitPlan split_at(Graph& g, const std::vector<std::string>& starts, const SplitCosts& costs);

// The estimates of the split `g` already has (its compute ops in `stages` contiguous stages in
// graph order, e.g. from the model's split marks); throws std::invalid_argument otherwise.
SplitPlan estimate_split(const Graph& g, std::size_t stages, const SplitCosts& costs);

// Parameters and state by name with their stage, to split another build of the same model
// (the evaluation model) the same way.
std::map<std::string, int> variable_stages(const Graph& g);
// Puts each parameter and state of `g` on its stage in `stage_of` (by name), inputs on stage 0,
// and every other op on the latest stage among its inputs' producers.
void follow_split(Graph& g, const std::map<std::string, int>& stage_of);

}  // namespace ipupod::models

// The pipeline plan of a model split into stages: which values travel between stages (one
// transfer each, numbered the same on every rank) and which forward ops a stage recomputes.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <vector>

#include "models/zoo.hpp"

namespace ipupod::pod {

// A value one stage makes and another uses, sent once per micro-batch on its own tag.
struct Transfer {
  models::ValueId value;
  int from, to;
  unsigned tag;
};
using Transfers = std::vector<Transfer>;

// The stage whose ops make `v`.
int stage_of(const models::Graph& g, models::ValueId v);

// Every value used on a stage other than its producer's, once per using stage, and the
// host-facing outputs that must reach stage 0; tags numbered from first_tag in graph order,
// the same on every rank.
Transfers plan_transfers(const models::Model& m, const std::vector<models::ValueId>& to_host,
                         unsigned first_tag);

// Recomputation in the grouped pipeline: the forward ops of `stage` worth running again before
// its backward pass (those whose results the backward pass reads, directly or through other
// recomputed ops) and that give the same result when run again: not random draws, not in-place
// state updates, not readers of state such an update changes within the forward pass.
// Ops in `checkpoints` are not recomputed: their results are kept (stashed) instead.
std::set<const models::Op*> recomputed_ops(const models::Graph& g, int stage,
                                           const std::set<const models::Op*>& checkpoints = {});

// Recomputation in segments, as PopTorch's recomputation checkpoints: the stage's recomputed
// forward ops fall into segments split at checkpoints, values after which no recomputed op
// reads anything made before them; a checkpoint's result is stashed, and each segment runs
// again just before the backward op that first reads one of its results, so that only one
// segment's activations are live at a time rather than the whole stage's.
struct Recomputation {
  std::map<const models::Op*, std::size_t> segment;   // of each recomputed op
  std::vector<std::set<std::size_t>> reads_segments;  // per segment: the others its ops read
  std::size_t segments() const { return reads_segments.size(); }
  // The segment of op, if it is recomputed.
  std::optional<std::size_t> segment_of(const models::Op* op) const {
    const auto it = segment.find(op);
    return it == segment.end() ? std::nullopt : std::optional<std::size_t>(it->second);
  }
};
// The checkpoints come at the first candidate after every `target` elements of results, the
// target (total / 2^k) chosen to make the fewest of the stashed checkpoints (in each of the
// stash_depth slots, and restored) plus the largest segment (live while it runs again).
Recomputation plan_recomputation(const models::Graph& g, int stage, std::size_t stash_depth);

}  // namespace ipupod::pod

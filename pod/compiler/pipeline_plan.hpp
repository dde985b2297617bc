// The pipeline plan of a model split into stages: which values travel between stages (one
// transfer each, numbered the same on every rank) and which forward ops a stage recomputes.
#pragma once

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
std::set<const models::Op*> recomputed_ops(const models::Graph& g, int stage);

}  // namespace ipupod::pod

// The pipeline schedules of one optimizer step on one stage: Graphcore's grouped pipeline
// (ramp-up, main phase, ramp-down, activation stashes) and sequential (sharded) execution.
#pragma once

#include <functional>
#include <set>
#include <vector>

#include "ipu_process/program.hpp"
#include "pod/compiler/compiler.hpp"
#include "pod/compiler/lowering.hpp"

namespace ipupod::pod {

// What one micro-batch runs on this stage, and what the schedule needs to stash.
struct MicroBatchPrograms {
  ipu::Program forward;   // host streams (stage 0), the forward pass, the loss to the host
  ipu::Program backward;  // the backward pass and the gradient accumulation
  // Recomputation: the forward ops the backward pass runs again (stashed: what they read).
  std::set<const models::Op*> recomputed;
  std::vector<models::ValueId> forward_values;  // every value the forward pass made
};

// The activation stash slots of a grouped pipeline stage (1: none).
inline std::size_t stash_slots(const StepShape& shape) {
  return shape.stages > 1 && shape.grouped ? 2 * (shape.stages - 1 - shape.stage) + 1 : 1;
}

// Appends to `step` k micro-batches of this stage in the schedule's order.
using PipelineSchedule = std::function<void(std::size_t k, ipu::Program& step)>;

// The schedule of this stage: the micro-batches one after the other (one stage), stage after
// stage with a sync after each turn (sequential), or in the grouped pipeline's slots with a sync
// ending each slot and the activations the backward pass reads kept in a ring of stash slots
// (made here, once for any k; sets out.stash_slots).
PipelineSchedule pipeline_schedule(const models::Model& model, const StepShape& shape,
                                   const MicroBatchPrograms& micro_batch, const Lowering& lowering,
                                   CompiledModel& out);

}  // namespace ipupod::pod

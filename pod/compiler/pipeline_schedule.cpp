// The pipeline schedules: the order of one step's micro-batches on one stage.
#include "pod/compiler/pipeline_schedule.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "ipu_process/ops/common.hpp"

namespace ipupod::pod {
namespace {

// Sequential (sharded) execution: one micro-batch at a time, stage after stage forward and
// back; a sync after each stage's turn keeps every IPU's clock on the serial timeline.
void add_sequential(const StepShape& shape, const MicroBatchPrograms& mb, std::size_t k,
                    ipu::Program& step) {
  const int stages = static_cast<int>(shape.stages), stage = static_cast<int>(shape.stage);
  ipu::Program micro_batch;
  for (int slot = 0; slot < 2 * stages; ++slot) {
    if (slot == stage) micro_batch.add(mb.forward);
    if (slot == 2 * stages - 1 - stage) micro_batch.add(mb.backward);
    micro_batch.add(ipu::Program::sync(ipu::SyncKind::external));
  }
  step.add(ipu::Program::repeat(k, micro_batch));
}

using Stash = std::vector<std::vector<std::pair<ipu::Tensor, ipu::Tensor>>>;

// The stash slots of a grouped pipeline stage: for each of `depth` slots, a copy of every
// forward value the backward pass (or the recomputation) reads that it cannot make again.
Stash make_stash(const models::Model& model, const StepShape& shape, const MicroBatchPrograms& mb,
                 const Lowering& lowering, ipu::Graph& g, std::size_t depth) {
  Stash stash(depth);
  if (depth <= 1) return stash;
  const int stage = static_cast<int>(shape.stage);
  // What the backward pass (and the recomputation, which re-makes its own outputs) reads.
  std::set<models::ValueId> used_backward;
  for (const auto& op : model.graph.ops())
    if (op.phase == Phase::backward && op.pipeline_stage == stage)
      used_backward.insert(op.inputs.begin(), op.inputs.end());
  for (const models::Op* op : mb.recomputed)
    used_backward.insert(op->inputs.begin(), op->inputs.end());
  for (models::ValueId v : mb.forward_values) {
    const models::Op& producer = model.graph.producer(v);
    const auto kind = producer.kind;
    if (!used_backward.count(v) || kind == OpKind::parameter || kind == OpKind::state ||
        kind == OpKind::constant || mb.recomputed.count(&producer))
      continue;
    const ipu::Tensor& t = lowering.tensor(v);
    for (std::size_t slot = 0; slot < depth; ++slot)
      stash[slot].emplace_back(
          t, ipu::ops::clone_like(g, t, model.graph.value(v).name + "/stash" + std::to_string(slot),
                                  ipu::MemoryCategory::activation, t.dtype()));
  }
  return stash;
}

// Grouped pipeline: in slot t this stage runs the forward pass of micro-batch t - stage and
// the backward pass of micro-batch t - (2 (stages - 1) - stage); every slot ends with a
// sync across the replica's IPUs. Activations wait in a ring of stash slots in between.
// The copies into and out of each stash slot, each made once (a step runs it in several slots).
struct StashCopies {
  std::vector<ipu::Program> into, out_of;
};

StashCopies stash_copies(const Stash& stash) {
  StashCopies copies;
  for (const auto& slot : stash)
    for (const bool out_of_stash : {false, true}) {
      std::vector<std::pair<ipu::Tensor, ipu::Tensor>> pairs;
      for (const auto& [work, kept] : slot)
        pairs.emplace_back(out_of_stash ? kept : work, out_of_stash ? work : kept);
      (out_of_stash ? copies.out_of : copies.into)
          .push_back(pairs.empty() ? ipu::Program() : ipu::Program::copy(std::move(pairs)));
    }
  return copies;
}

void add_grouped(const StepShape& shape, const MicroBatchPrograms& mb, const StashCopies& copies,
                 std::size_t k, ipu::Program& step) {
  const int stages = static_cast<int>(shape.stages), stage = static_cast<int>(shape.stage);
  if (k < shape.stages)
    throw std::invalid_argument("the grouped pipeline needs gradient accumulation >= stages");
  const std::size_t depth = copies.into.size();
  const auto stash_copy = [&](std::size_t slot, bool out_of_stash) {
    return out_of_stash ? copies.out_of[slot] : copies.into[slot];
  };
  const long long slots = static_cast<long long>(k + 2 * (shape.stages - 1));
  const long long kk = static_cast<long long>(k);
  for (long long t = 0; t < slots; ++t) {
    const long long f = t - stage, b = t - (2 * (stages - 1) - stage);
    ipu::Program slot;
    if (f >= 0 && f < kk) {
      slot.add(mb.forward);
      if (depth > 1) slot.add(stash_copy(static_cast<std::size_t>(f) % depth, false));
    }
    if (b >= 0 && b < kk) {
      if (depth > 1) slot.add(stash_copy(static_cast<std::size_t>(b) % depth, true));
      slot.add(mb.backward);
    }
    slot.add(ipu::Program::sync(ipu::SyncKind::external));
    step.add(slot);
  }
}

}  // namespace

PipelineSchedule pipeline_schedule(const models::Model& model, const StepShape& shape,
                                   const MicroBatchPrograms& micro_batch, const Lowering& lowering,
                                   CompiledModel& out) {
  if (shape.stages == 1) {
    const ipu::Program one = ipu::Program::sequence({micro_batch.forward, micro_batch.backward});
    return [one](std::size_t k, ipu::Program& step) { step.add(ipu::Program::repeat(k, one)); };
  }
  if (!shape.grouped)
    return [shape, micro_batch](std::size_t k, ipu::Program& step) {
      add_sequential(shape, micro_batch, k, step);
    };
  const std::size_t depth = stash_slots(shape);
  out.stash_slots = depth;
  const StashCopies copies =
      stash_copies(make_stash(model, shape, micro_batch, lowering, *out.graph, depth));
  return [shape, micro_batch, copies](std::size_t k, ipu::Program& step) {
    add_grouped(shape, micro_batch, copies, k, step);
  };
}

}  // namespace ipupod::pod

// Timing a job's host steps without running them (`ipupod estimate`): each stage's compiled
// training program is walked with the engine's own cycle accounting (Engine::time) and the
// fabric's predicted costs, then the stages' timelines are played together as the external
// syncs of a pipeline release them. Training charges the same cycles as it runs, so for any job
// train can run the two predictions agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ipu_process/engine.hpp"
#include "pod/config.hpp"
#include "pod/job/protocol.hpp"

namespace ipupod::pod {

// One stage of one replica over the timed host steps, on its own clock (cycles since the first
// step began, with no waits).
struct StageTiming {
  // The stage's cycles when it reaches each external sync (with the sync's own cost), before
  // it waits for the other stages: the pipeline's lockstep points.
  std::vector<ipu::CycleBreakdown> at_syncs;
  // At the end of each step: the cycles, the syncs reached so far, and the collectives' share
  // of the fabric cycles (all-reduce, reduce-scatter, all-gather).
  std::vector<ipu::CycleBreakdown> step_ends;
  std::vector<std::size_t> syncs_at_step_ends;
  std::vector<std::uint64_t> collectives_at_step_ends;
};

// Times `steps` host steps of the IPU at `place`: runs of its compiled training program
// (`program`: "train", or a timing-only variant of it, see timed_train_program) on an engine
// built from compile_for_ipu for that stage (it may be a plan). The pipeline's transfers and the
// replica group's collectives cost what FabricCosts predicts for `place` in a job of `config`.
StageTiming time_stage(ipu::Engine& engine, const TrainConfig& config, const IpuPlace& place,
                       std::size_t steps, const std::string& program = "train");

// A replica's stages played together: at each external sync every stage waits for the latest
// (the engine's rule when it runs), the waits charged as sync.
struct PipelineTiming {
  // Per stage, per step: its cycles with its waits, the waits (of the sync cycles) and the
  // collectives' cycles (of the fabric cycles), from the first step's start to the step's end.
  std::vector<std::vector<ipu::CycleBreakdown>> step_ends;
  std::vector<std::vector<std::uint64_t>> waits, collectives;
  // Stage s's cycles of steps [first, last) with its waits and the parts of them.
  struct Steps {
    ipu::CycleBreakdown cycles;
    std::uint64_t waits = 0, collectives = 0;
  };
  Steps steps(std::size_t stage, std::size_t first, std::size_t last) const;
};
// std::invalid_argument when the stages do not reach the same numbers of syncs and steps.
PipelineTiming play_pipeline(const std::vector<StageTiming>& stages);

// The replicas whose stages sit on the same link classes time the same: the first replica of
// each such class, in replica order.
std::vector<std::size_t> replica_classes(const TrainConfig& config);

nlohmann::json to_json(const ipu::CycleBreakdown& cycles);
ipu::CycleBreakdown breakdown_from_json(const nlohmann::json& j);
nlohmann::json to_json(const StageTiming& timing);
StageTiming stage_timing_from_json(const nlohmann::json& j);

}  // namespace ipupod::pod

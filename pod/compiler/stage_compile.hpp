// Compiling one pipeline stage of a zoo model for an architecture without data, training or a
// host (`ipupod compile`), and the report of whether each stage fits and where it does not.
#pragma once

#include <cstddef>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/engine.hpp"
#include "pod/config.hpp"

namespace ipupod::pod {

struct CompileConfig {
  // The options a training run would use: model and its sizes (width, depth), architecture,
  // stages, schedule, micro-batch, gradient accumulation, seed, run directory.
  TrainConfig train;
  std::vector<std::size_t> sample_shape;  // one input sample; empty: the model's own
  std::size_t classes = 10;
  std::vector<std::size_t> only_stages;  // compile just these stages (empty: every stage)
  // Further (gradient accumulation, device iterations) of the training step to compile for
  // timing only (StepShape::timed_steps).
  std::vector<std::pair<std::size_t, std::size_t>> timed_steps;
  // Host threads laying out a stage's tile memory (the same layout on any number); 0: the
  // machine's hardware threads, shared among the job's ranks on it (plan_threads).
  unsigned threads = 0;
};

// Checks the options on their own; throws UsageError.
void validate(const CompileConfig& config);

// The report of one compiled stage: memory.json's entry (memory_report_json plus "stage",
// "layers", "parameters", "stash_slots", "stash_bytes", "fits", "compile_seconds", and
// "host_memory": the compiling process's peak resident bytes while it compiled the stage).
// With `progress`, prints where the compile stands every few seconds (phase, ops lowered of
// the phase's total, the op, elapsed seconds, resident memory), so a long compile never looks
// like a hang.
// `use_engine`, when given, is called with the stage's engine (a plan) before it goes.
nlohmann::json compile_stage(const CompileConfig& config, std::size_t stage,
                             std::ostream* progress = nullptr,
                             const std::function<void(ipu::Engine&)>& use_engine = {});

// Prints the per-stage table, the worst tiles of each stage that does not fit and advice.
void print_compile_report(const CompileConfig& config, const std::vector<nlohmann::json>& stages,
                          std::ostream& out, const char* command = "compile");

}  // namespace ipupod::pod

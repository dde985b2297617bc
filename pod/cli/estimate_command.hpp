// `ipupod estimate`: predicts a job's speed on a pod by compiling each stage once and timing
// its host steps without running them (see pod/job/step_timing.hpp), with the host's input
// pipeline beside it, and says what bounds the job.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "pod/compiler/stage_compile.hpp"

namespace ipupod::pod {

struct EstimateConfig {
  // The job: model, architecture, stages, micro-batch, accumulation, device iterations,
  // precision, replicas, topology, replicated tensor sharding (compile.train).
  CompileConfig compile;
  // Host steps timed after the warm-up ones; the prediction is their mean. The first step of a
  // pipeline starts with every stage at once; from the second on the stages run in their
  // steady offsets, as over most of a training run.
  std::size_t warm_up_steps = 1, steps = 2;
  double host_input_rate = 0;       // samples/s one host server prepares (0: not modelled)
  std::size_t hosts = 0;            // host servers feeding the job (0: one per 16 IPUs)
  bool accumulation_given = false;  // else each job's is its stages (grouped pipeline's least)
  // A sweep: one estimate per combination of these lists (empty: the one value of
  // compile.train), compiled once per stage count and replica class and written as a CSV
  // (default RUN_DIR/estimate.csv) beside estimate.json.
  std::vector<std::size_t> sweep_replicas, sweep_stages, sweep_accumulation, sweep_iterations;
  std::vector<std::string> sweep_topologies;  // the compiled stages are timed on each
  std::string csv;
};

// Checks the options on their own; throws UsageError.
void validate(const EstimateConfig& config);

// Rank r of the world compiles stages r, r + size, ...; rank 0 prints the report and writes
// estimate.json and memory.json into the run directory. Returns 0 when every stage fits, 1 when
// one does not (or on failure), 2 on bad usage.
int run_estimate(const EstimateConfig& config, MPI_Comm world);

}  // namespace ipupod::pod

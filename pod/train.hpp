// `ipupod train`: rank 0 plays the host (data, streams, reports), ranks 1..R*S the IPUs.
#pragma once

#include <mpi.h>

#include <string>

#include "models/pipeline_split.hpp"
#include "models/zoo.hpp"
#include "pod/config.hpp"
#include "pod/wire.hpp"

namespace ipupod::pod {

// Runs this rank's role; returns the process exit code (0, 1 runtime failure, 2 bad input).
// Runtime failures after start-up abort the whole MPI job so no rank is left waiting.
int run_train(const TrainConfig& config, MPI_Comm world);

int run_host(const TrainConfig& config, MPI_Comm world);
// Prints what failed on this rank and ends the whole MPI job at once (exit code 1). Called
// where the failure happens, before any clean-up could make a peer fail first and hide the cause.
[[noreturn]] void abort_job(MPI_Comm world, const std::string& what);
int run_ipu(const TrainConfig& config, MPI_Comm world);

// The model options of a job: the same on the host (which builds the evaluation model to learn
// its task and output shapes) and on every IPU.
models::ModelOptions model_options(const TrainConfig& config, const Startup& startup,
                                   bool training);

// Sets the stage hooks of --split auto (nothing for --split model): the training model is split
// for the architecture's rates and memory and the topology's links (its plan written to *plan),
// and the evaluation model, built after it, puts each parameter and state on the same stage.
void use_automatic_split(const TrainConfig& config, models::ModelOptions& training,
                         models::SplitPlan* plan);
void follow_automatic_split(const TrainConfig& config, const models::Model& trained,
                            models::ModelOptions& eval);
// "automatic split into S stages (estimates per micro-batch): stage 0: a .. b (n ops, ...)".
std::string describe_split(const models::SplitPlan& plan);

}  // namespace ipupod::pod

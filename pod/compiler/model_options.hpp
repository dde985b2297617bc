// The one translation of a job's options (TrainConfig) into the model builder's options, shared
// by training, compiling and estimating, and the pipeline split they ask for (--split auto).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "models/pipeline_split.hpp"
#include "models/zoo.hpp"
#include "pod/config.hpp"

namespace ipupod::pod {

// What the data set fixes about a model: one input sample, the classes of a classifier, and
// the host steps of one epoch (the learning-rate schedule counts optimizer steps over the run).
struct DataShape {
  std::vector<std::size_t> sample_shape;  // empty: the model's own
  std::size_t classes = 10;
  std::size_t train_steps = 1;
  std::vector<std::size_t> target_shape;  // one sample's targets; empty: not known (compile)
};

// The model options of a job: the same on the host (which builds the evaluation model to learn
// its task and output shapes), on every IPU, and in `ipupod compile`.
models::ModelOptions model_options(const TrainConfig& config, const DataShape& data, bool training);

// Whether the stages are the model's split marks: not --split auto, not --split-at.
bool split_by_marks(const TrainConfig& config);
// Sets the stage hooks of --split auto or --split-at (nothing when split_by_marks): the training
// model is split for the architecture's rates and memory and the topology's links, or at the
// given blocks (its plan written to *plan), and the evaluation model, built after it, puts each
// parameter and state on the same stage.
void use_automatic_split(const TrainConfig& config, models::ModelOptions& training,
                         models::SplitPlan* plan);
void follow_automatic_split(const TrainConfig& config, const models::Model& trained,
                            models::ModelOptions& eval);
// "automatic split into S stages (estimates per micro-batch): stage 0: a .. b (n ops, ...)".
std::string describe_split(const models::SplitPlan& plan);

// The model split into as many pipeline stages as --stages asks for, or a UsageError saying how
// many its split marks (or --split auto) make at this size.
void check_stage_count(const TrainConfig& config, const models::Model& model);

// The training model and the inference-mode model of a job (running statistics, no dropout;
// the same parameters and state, by name, on the same stages); the split plan of --split auto
// written to *plan when given.
struct JobModels {
  models::Model training, eval;
};
JobModels build_job_models(const TrainConfig& config, const DataShape& data,
                           models::SplitPlan* plan = nullptr);

}  // namespace ipupod::pod

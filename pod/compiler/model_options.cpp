// The model options of a job and its automatic pipeline split.
#include "pod/compiler/model_options.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "fabric/topology.hpp"
#include "ipu_process/arch.hpp"

namespace ipupod::pod {
models::ModelOptions model_options(const TrainConfig& config, const DataShape& data,
                                   bool training) {
  models::ModelOptions options;
  options.micro_batch = config.micro_batch;
  options.sample_shape = data.sample_shape;
  options.classes = data.classes;
  options.target_shape = data.target_shape;
  options.loss = config.loss;
  options.hidden = config.hidden;
  options.learning_rate = config.learning_rate;
  options.width = config.width;
  options.depth = config.depth;
  options.pipeline_stages = config.stages;
  options.seed = config.seed;
  options.training = training;
  options.optimizer.kind = models::optimizer_from_name(config.optimizer);
  options.optimizer.momentum = config.momentum;
  options.optimizer.weight_decay = config.weight_decay;
  options.optimizer.clip_global_norm = config.clip_norm;
  options.optimizer.loss_scale = config.loss_scaling;
  // The schedule counts optimizer steps: device iterations per host step, over the whole run.
  const std::size_t total = config.epochs * data.train_steps * config.device_iterations;
  options.optimizer.schedule.kind = config.lr_schedule == "cosine" ? models::ScheduleKind::cosine
                                    : config.lr_schedule == "step" ? models::ScheduleKind::step
                                                                   : models::ScheduleKind::constant;
  options.optimizer.schedule.warmup_steps = config.warmup_steps;
  options.optimizer.schedule.total_steps = total;
  options.optimizer.schedule.step_size = std::max<std::size_t>(1, total / 4);
  options.optimizer.schedule.gamma = 0.1;
  return options;
}

bool split_by_marks(const TrainConfig& c) {
  return c.split == "model" && c.split_at.empty();
}

void use_automatic_split(const TrainConfig& c, models::ModelOptions& training,
                         models::SplitPlan* plan) {
  if (split_by_marks(c) || c.stages < 2) return;
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(c.arch);
  const fabric::Topology topology = fabric::Topology::preset(c.topology);
  models::SplitCosts costs;
  const double tiles = static_cast<double>(arch.tiles);
  costs.matmul_flops_per_cycle = arch.fp32_flops_per_cycle_per_tile * tiles;
  costs.vector_elements_per_cycle = static_cast<double>(arch.fp32_vector_width) * tiles;
  costs.per_op_cycles =
      static_cast<double>(arch.sync_cycles_internal + arch.exchange_latency_cycles);
  costs.link_bytes_per_cycle = topology.spec().within_machine.bandwidth_bytes_per_s / arch.clock_hz;
  costs.memory_bytes = static_cast<double>(arch.bytes_per_ipu());
  const std::string& o = c.optimizer;
  costs.parameter_copies = 2.0 + (o == "adam" || o == "adamw" ? 2.0 : o == "sgd" ? 0.0 : 1.0);
  const std::size_t stages = c.stages;
  training.assign_stages = [costs, stages, plan, blocks = c.split_at](models::Graph& g) {
    const models::SplitPlan made = blocks.empty() ? models::split_pipeline(g, stages, costs)
                                                  : models::split_at(g, blocks, costs);
    if (plan) *plan = made;
  };
}

void follow_automatic_split(const TrainConfig& c, const models::Model& trained,
                            models::ModelOptions& eval) {
  if (split_by_marks(c) || c.stages < 2) return;
  eval.assign_stages = [stages = models::variable_stages(trained.graph)](models::Graph& g) {
    models::follow_split(g, stages);
  };
}

std::string describe_split(const models::SplitPlan& plan) {
  std::ostringstream out;
  if (plan.given)
    out << "split at the --split-at blocks into " << plan.stages.size()
        << " stages (estimates per micro-batch"
        << (plan.fits ? "" : "; by these estimates a stage does not fit its IPU's memory") << "):";
  else
    out << "automatic split into " << plan.stages.size() << " stages (estimates per micro-batch"
        << (plan.fits ? "" : "; none fits the estimated memory, so the fastest was taken") << "):";
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    const models::StageEstimate& e = plan.stages[s];
    out << "\n  stage " << s << ": " << e.first << " .. " << e.last << " (" << e.ops << " ops, "
        << std::fixed << std::setprecision(0) << e.cycles << " cycles, " << std::setprecision(1)
        << e.bytes / (1024.0 * 1024.0) << " MiB)";
  }
  return out.str();
}

void check_stage_count(const TrainConfig& config, const models::Model& model) {
  const auto split = static_cast<std::size_t>(model.graph.max_stage() + 1);
  if (split != config.stages)
    throw UsageError("--stages " + std::to_string(config.stages) + ": model '" + config.model +
                     "' splits into at most " + std::to_string(split) +
                     " pipeline stages at this size (" +
                     (config.split == "auto" ? "--split auto" : "its split marks") +
                     "); choose --stages " + std::to_string(split) + " or fewer" +
                     (config.split == "auto" ? "" : ", or --split auto (which may split any op)"));
}

JobModels build_job_models(const TrainConfig& config, const DataShape& data,
                           models::SplitPlan* plan) {
  models::ModelOptions training_options = model_options(config, data, true);
  use_automatic_split(config, training_options, plan);
  JobModels out{models::build_model(config.model, training_options), {}};
  models::ModelOptions eval_options = model_options(config, data, false);
  follow_automatic_split(config, out.training, eval_options);
  out.eval = models::build_model(config.model, eval_options);
  return out;
}

}  // namespace ipupod::pod

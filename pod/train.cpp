// Role dispatch and the failure policy of a training job: bad input exits 2 on every rank,
// a runtime failure after start-up aborts the whole MPI job with the message on stderr.
#include "pod/train.hpp"

#include <algorithm>
#include <cstdlib>
#include <iostream>

namespace ipupod::pod {

int run_train(const TrainConfig& config, MPI_Comm world) {
  int rank = 0, size = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  try {
    validate(config, size);
  } catch (const UsageError& e) {
    if (rank == 0) std::cerr << "ipupod train: " << e.what() << "\n";
    return 2;
  }
  try {
    return rank == 0 ? run_host(config, world) : run_ipu(config, world);
  } catch (const std::exception& e) {
    abort_job(world, e.what());
  }
}

models::ModelOptions model_options(const TrainConfig& config, const Startup& startup,
                                   bool training) {
  models::ModelOptions options;
  options.micro_batch = config.micro_batch;
  options.sample_shape = startup.sample_shape;
  options.classes = startup.classes;
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
  // The schedule counts optimizer steps: device iterations per host step, over the whole run.
  const std::size_t total = config.epochs * startup.train_steps * config.device_iterations;
  options.optimizer.schedule.kind = config.lr_schedule == "cosine" ? models::ScheduleKind::cosine
                                    : config.lr_schedule == "step" ? models::ScheduleKind::step
                                                                   : models::ScheduleKind::constant;
  options.optimizer.schedule.warmup_steps = config.warmup_steps;
  options.optimizer.schedule.total_steps = total;
  options.optimizer.schedule.step_size = std::max<std::size_t>(1, total / 4);
  options.optimizer.schedule.gamma = 0.1;
  return options;
}

void abort_job(MPI_Comm world, const std::string& what) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::cerr << "ipupod train: error on rank " << rank
            << (rank == 0 ? " (host)" : " (IPU " + std::to_string(rank - 1) + ")") << ": " << what
            << std::endl;
  MPI_Abort(world, 1);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace ipupod::pod

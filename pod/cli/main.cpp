// The `ipupod` command: git-style subcommands train, compile, estimate, info, data and bench.
// Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad input.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli_checks/option_checks.hpp"
#include "datasets/cli.hpp"
#include "fabric/error.hpp"
#include "json_text/json_text.hpp"
#include "models/onnx_import.hpp"
#include "pod/cli/bench.hpp"
#include "pod/cli/compile_command.hpp"
#include "pod/cli/estimate_command.hpp"
#include "pod/cli/info.hpp"
#include "pod/config.hpp"
#include "pod/job/train.hpp"

namespace {

using ipupod::cli::finite_number;
using ipupod::cli::whole_number;
using ipupod::pod::kMaxCount;
using ipupod::pod::kMaxModelMultiplier;
using ipupod::pod::kMaxTimeoutSeconds;
using ipupod::pod::TrainConfig;

// The options that shape a compiled model, shared by train and compile. Returns
// --gradient-accumulation, whose default compile changes.
CLI::Option* add_model_options(CLI::App& app, TrainConfig& c) {
  app.add_option("--model", c.model, "Model of the zoo (see `ipupod info --models`)")
      ->capture_default_str();
  app.add_option("--hidden", c.hidden, "mlp: widths of the hidden layers")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  app.add_option("--width", c.width, "Channel width multiplier of the convolutional models")
      ->check(finite_number({.min = 0, .max = kMaxModelMultiplier, .min_open = true}))
      ->capture_default_str();
  app.add_option("--arch", c.arch,
                 "IPU architecture: mk1, mk2, bow, tiny, or a .json preset file (see README)")
      ->capture_default_str();
  app.add_option("--stages", c.stages,
                 "Pipeline stages, IPUs per replica (the model's split marks)")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  app.add_option("--pipeline-schedule", c.pipeline_schedule,
                 "grouped (ramp-up, main, ramp-down with activation stashes) or sequential")
      ->capture_default_str();
  app.add_option("--split", c.split,
                 "Pipeline split: model (the model's own split marks) or auto (contiguous stages "
                 "balancing estimated cycles under each IPU's memory)")
      ->capture_default_str();
  app.add_option("--split-at", c.split_at,
                 "Pipeline split by hand, as PopTorch's BeginBlock: the blocks (module paths as "
                 "`ipupod info --model` lists the layers, e.g. layer3,layer4) that begin stages "
                 "1, 2, ...; --stages minus one of them, in graph order")
      ->delimiter(',');
  app.add_option("--loss", c.loss,
                 "An ONNX model's loss: auto (softmax cross entropy for a [N, classes] output, "
                 "mean absolute error for [N, 1]), cross-entropy, mse or l1 (against the data's "
                 "targets: values, images, or a field and its mask)")
      ->check(CLI::IsMember(ipupod::models::onnx_losses()))
      ->capture_default_str();
  app.add_option("--available-memory-proportion", c.available_memory_proportion,
                 "Share of each tile's memory the planners may give one matmul, convolution or "
                 "pooling (Poplar's availableMemoryProportion): lower trades speed for memory")
      ->check(finite_number({.min = 0, .max = 1, .min_open = true}))
      ->capture_default_str();
  app.add_option("--partials-type", c.partials_type,
                 "Partial sums of the matrix unit (PopTorch's Precision.setPartialsType): float, "
                 "or half for the AMP's faster FP16.16 rate on float16 products (cycle estimates "
                 "only: sums stay float32 here)")
      ->check(CLI::IsMember({"float", "half"}))
      ->capture_default_str();
  app.add_flag("--recompute", c.recompute,
               "Grouped pipeline: stash only what a stage's forward pass cannot make again and "
               "re-run its forward ops before the backward pass (less memory, more compute)");
  app.add_option("--micro-batch", c.micro_batch, "Samples per micro-batch on each replica")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  CLI::Option* accumulation =
      app.add_option("--gradient-accumulation", c.gradient_accumulation,
                     "Micro-batches whose gradients are accumulated per optimizer step")
          ->check(whole_number(1, kMaxCount))
          ->capture_default_str();
  app.add_option("--device-iterations", c.device_iterations,
                 "Optimizer steps the device runs per host step (PopTorch deviceIterations)")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  app.add_option("--precision", c.precision,
                 "fp32, or fp16: parameters and the activations of matmuls, convolutions, "
                 "additions and ReLUs stored as float16 (computed in float32, rounded once); "
                 "gradient accumulators, optimizer state and the other ops stay float32")
      ->check(CLI::IsMember({"fp32", "fp16"}))
      ->capture_default_str();
  app.add_option("--depth", c.depth, "Block repeat multiplier of the deep models")
      ->check(finite_number({.min = 0, .max = kMaxModelMultiplier, .min_open = true}))
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer,
                 "sgd, sgd_momentum, adam, adamw or lamb (Adam moments, per-parameter trust "
                 "ratio ||w|| / ||update||), applied on tiles")
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "Momentum of sgd_momentum")
      ->check(finite_number({.min = 0, .max = 1, .max_open = true}))
      ->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay,
                 "L2 (sgd*, adam) or decoupled (adamw, lamb) decay")
      ->check(finite_number({.min = 0}))
      ->capture_default_str();
  app.add_option("--clip-norm", c.clip_norm,
                 "Clip gradients by their global L2 norm, as torch's clip_grad_norm_: after the "
                 "all-reduce and the mean over micro-batches, scale all of them by "
                 "min(1, X / (norm + 1e-6)); the norm spans every pipeline stage (0: no clipping)")
      ->check(finite_number({.min = 0}))
      ->capture_default_str();
  app.add_option("--loss-scaling", c.loss_scaling,
                 "Static loss scale S: the backward pass starts from S, gradients are divided "
                 "by S before the update (keeps small float16 gradients from flushing to 0)")
      ->check(finite_number({.min = 0, .min_open = true}))
      ->capture_default_str();
  return accumulation;
}

// --config FILE.json: the options of a run kept in a file. Listed in --help; the file is read
// before parsing (expand_config_file) so its options go through the same checks.
void add_config_file_option(CLI::App& app) {
  app.add_option("--config",
                 "A JSON object of options named like the long options, e.g. "
                 "{\"model\": \"hae\", \"micro-batch\": 8, \"hidden\": [64, 32], "
                 "\"recompute\": true}; options on the command line win")
      ->type_name("FILE");
}

// This process's rank when a launcher (mpirun, srun) started it, known before MPI_Init; -1 when
// it was not. Every rank parses the same arguments: rank 0 alone says what is wrong with them.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return -1;
}

// The exit code of a usage error on this rank. Rank 0 says what is wrong; the other ranks,
// which saw the same arguments, wait a moment before failing so that the launcher does not
// end rank 0 before its message is out (it ends the job when the first rank fails).
int usage_error_exit(int code) {
  if (code != 0 && launcher_rank() > 0) std::this_thread::sleep_for(std::chrono::seconds(5));
  return code;
}

// Bad usage found while reading a config file (exit code 2).
struct ConfigFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool train_option(CLI::App& app, const std::string& name) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == "train") return sub->get_option_no_throw(name) != nullptr;
  return false;
}

// argv with the options of `--config FILE` of the subcommand inserted after the subcommand's
// name, except those also given on the command line.
std::vector<std::string> expand_config_file(CLI::App& app, std::vector<std::string> args) {
  if (args.size() < 2) return args;
  CLI::App* sub = nullptr;
  for (CLI::App* candidate : app.get_subcommands([](CLI::App*) { return true; }))
    if (candidate->get_name() == args[1]) sub = candidate;
  if (!sub || !sub->get_option_no_throw("--config")) return args;
  std::string path;
  for (std::size_t i = 2; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) path = args[i + 1];
    if (args[i].rfind("--config=", 0) == 0) path = args[i].substr(9);
  }
  if (path.empty()) return args;
  std::ifstream in(path);
  if (!in) throw ConfigFileError("--config: cannot read '" + path + "'; check the path");
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigFileError("--config: '" + path +
                          "' is not valid JSON: " + ipupod::json_text::brief(e.what()));
  }
  if (!options.is_object())
    throw ConfigFileError("--config: '" + path +
                          "' must hold a JSON object of options, e.g. {\"micro-batch\": 8}");
  // A run's summary.json, or a file --export-config wrote, holds the options under "config"
  // (beside what the run measured) with the batch they make, which is not an option.
  if (options.contains("config") && options["config"].is_object()) {
    nlohmann::json record = std::move(options["config"]);
    options = std::move(record);
    options.erase("global_batch");
    // A compile or estimate of a run writes its reports to its own folder, not over the run's.
    if (args[1] != "train") options.erase("run_dir");
  }
  const auto given = [&](const std::string& name) {
    for (std::size_t i = 2; i < args.size(); ++i)
      if (args[i] == name || args[i].rfind(name + "=", 0) == 0) return true;
    return false;
  };
  std::vector<std::string> inserted;
  for (const auto& [key, value] : options.items()) {
    std::string name = "--" + key;
    std::replace(name.begin(), name.end(), '_', '-');
    const CLI::Option* option = sub->get_option_no_throw(name);
    // A switch kept as its value ("shuffle": false) is the flag that turns it off.
    const std::string negated = "--no-" + name.substr(2);
    if (!option && value.is_boolean() && sub->get_option_no_throw(negated)) {
      if (!value.get<bool>() && !given(negated)) inserted.push_back(negated);
      continue;
    }
    // A compile or an estimate takes a training run's config file as it is: the options of a
    // run that do not shape its programs or timing (data, epochs, run directory, ...) are left
    // out.
    if (!option && (args[1] == "estimate" || args[1] == "compile") &&
        (train_option(app, name) || (value.is_boolean() && train_option(app, negated))))
      continue;
    if (!option || name == "--config" || name == "--help")
      throw ConfigFileError("--config: '" + path + "' names '" + key +
                            "', which is not an option "
                            "of `ipupod " +
                            args[1] + "` (see --help)");
    if (given(name)) continue;
    const auto text = [&](const nlohmann::json& v) {
      if (v.is_string()) return v.get<std::string>();
      if (v.is_primitive()) return v.dump();
      throw ConfigFileError("--config: '" + key + "' in '" + path +
                            "' must be a string, number, boolean or list of them");
    };
    if (option->get_type_size() == 0 || option->get_expected_min() == 0) {  // a flag
      if (!value.is_boolean())
        throw ConfigFileError("--config: '" + key + "' in '" + path + "' is a flag: true or false");
      if (value.get<bool>()) inserted.push_back(name);
      continue;
    }
    if (value.is_array() && value.empty()) continue;  // an empty list: the default (none)
    inserted.push_back(name);
    if (value.is_array()) {
      for (const auto& v : value) inserted.push_back(text(v));
    } else {
      inserted.push_back(text(value));
    }
  }
  args.insert(args.begin() + 2, inserted.begin(), inserted.end());
  return args;
}

void add_train_options(CLI::App& train, TrainConfig& c) {
  add_model_options(train, c);
  train.add_option("--data", c.data, "HDF5 training data made by `ipupod data` (/train, /test)")
      ->required();
  train.add_option("--topology", c.topology, "Pod topology preset for the link cost model")
      ->capture_default_str();
  train.add_option("--replicas", c.replicas, "Data-parallel replicas (PopTorch replicationFactor)")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  train
      .add_option("--host-instances,--num-instances", c.host_instances,
                  "Host ranks (PopRun's instances), each serving replicas / N replicas from its "
                  "own reader of the data; ranks in blocks: host instance i, then its replicas' "
                  "IPUs (one block per node in a multi-node launch)")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  train.add_option("--epochs", c.epochs, "Passes over the training split")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  train.add_option("--learning-rate", c.learning_rate, "Base learning rate")
      ->check(finite_number({.min = 0, .min_open = true}))
      ->capture_default_str();
  train.add_flag(
      "--replicated-tensor-sharding", c.replicated_tensor_sharding,
      "Each of the R replicas keeps 1/R of the optimizer state (Adam moments, "
      "momentum): gradients are reduce-scattered, each replica updates its block of "
      "the weights and all-gathers the rest (not with lamb, --clip-norm or checkpoints)");
  train
      .add_option("--lr-schedule", c.lr_schedule,
                  "constant, step (x0.1 after each quarter of the run) or cosine (to 0 at the end)")
      ->capture_default_str();
  train
      .add_option("--warmup-steps", c.warmup_steps,
                  "Optimizer steps of linear learning-rate warm-up")
      ->check(whole_number(0, kMaxCount))
      ->capture_default_str();
  train
      .add_option("--stochastic-rounding", c.stochastic_rounding,
                  "on or off: float16 results (activations, float16 weight updates) round "
                  "stochastically instead of to nearest even")
      ->capture_default_str();
  train.add_option("--seed", c.seed, "Seed of weight initialisation and shuffling")
      ->check(whole_number(0))
      ->capture_default_str();
  train.add_flag("!--no-shuffle", c.shuffle, "Read each epoch in file order");
  train
      .add_option("--shuffle-window", c.shuffle_window,
                  "Shuffle in windows of N samples instead of the whole split, for data larger "
                  "than memory: blocks of 256 consecutive samples in a shuffled order, each run "
                  "of ceil(N/256) blocks shuffled together and read ahead while the one before "
                  "streams (0: whole split)")
      ->check(whole_number(0, kMaxCount))
      ->capture_default_str();
  train.add_flag("--allow-out-of-memory", c.allow_out_of_memory,
                 "Finish compiling a model that does not fit and report memory instead of failing");
  train.add_option("--run-dir", c.run_dir, "Directory for summary.json, metrics.csv, memory.json")
      ->capture_default_str();
  train
      .add_option("--bind-address", c.bind_address,
                  "Address the host's stream server binds: 0.0.0.0 (every interface; the IPU "
                  "ranks are told this node's addresses and try them in turn, loopback first on "
                  "the host's own node) or one address, e.g. 127.0.0.1 for one node only")
      ->capture_default_str();
  train
      .add_option("--trace-events", c.trace_events,
                  "Events of each IPU's predicted timeline kept for trace.json (0: none): a "
                  "window of at most this many events per IPU, from --trace-from-step on")
      ->check(whole_number(0, kMaxCount))
      ->capture_default_str();
  train
      .add_option("--trace-from-step", c.trace_from_step,
                  "Host step (counted from the run's start) where trace.json's window begins "
                  "(0: from the start, compile-time initialisation included)")
      ->check(whole_number(0, kMaxCount))
      ->capture_default_str();
  train
      .add_option("--timeout", c.timeout_s, "Seconds a host<->IPU stream may stall before failing")
      ->check(finite_number({.min = 0, .max = kMaxTimeoutSeconds, .min_open = true}))
      ->capture_default_str();
  train
      .add_option("--checkpoint-every", c.checkpoint_every,
                  "Write a checkpoint (weights, optimizer state, position) every N host steps "
                  "and at the end, as RUN_DIR/checkpoint-<host step>.h5 (0: none)")
      ->check(whole_number(0, kMaxCount))
      ->capture_default_str();
  train
      .add_option("--checkpoint-keep", c.checkpoint_keep,
                  "Newest checkpoints of this run to keep (0: all)")
      ->check(whole_number(0, kMaxCount))
      ->capture_default_str();
  train.add_option("--resume", c.resume,
                   "Continue from a checkpoint; the run ends bitwise identical to one never "
                   "stopped (same options, --epochs may grow)");
  train.footer(
      "Run under MPI with 1 + replicas x stages ranks: rank 0 is the host, the others are IPUs\n"
      "(with --host-instances N: N + replicas x stages ranks in N blocks, each a host and its\n"
      "replicas' IPUs).\n"
      "  mpirun -n 3 ipupod train --model mlp --data fashion-mnist.h5 --replicas 2");
}

// The options of a compile without data (compile and estimate): the model's options, the
// data's sample shape and classes, the seed. Returns --gradient-accumulation.
CLI::Option* add_dataless_options(CLI::App& compile, ipupod::pod::CompileConfig& c) {
  CLI::Option* accumulation = add_model_options(compile, c.train);
  accumulation->default_str("stages")->description(
      "Micro-batches per optimizer step (default: --stages, the fewest the grouped pipeline "
      "takes; the memory does not depend on it)");
  compile
      .add_option("--sample-shape", c.sample_shape,
                  "One input sample, e.g. 3,224,224 (default: the model's own)")
      ->check(whole_number(1, kMaxCount))
      ->delimiter(',');
  compile.add_option("--classes", c.classes, "Classes of a classifier's output layer")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  compile.add_option("--seed", c.train.seed, "Seed of weight initialisation")
      ->check(whole_number(0))
      ->capture_default_str();
  compile
      .add_option("--threads", c.threads,
                  "Host threads laying out each stage's tile memory, the same layout on any "
                  "number (0: the machine's hardware threads, shared among the job's ranks on it)")
      ->check(whole_number(0, 1024))
      ->capture_default_str();
  return accumulation;
}

CLI::Option* add_compile_options(CLI::App& compile, ipupod::pod::CompileConfig& c) {
  CLI::Option* accumulation = add_dataless_options(compile, c);
  compile
      .add_option("--stage", c.only_stages,
                  "Compile only this stage (repeatable; default: every stage), e.g. one stage "
                  "per job when memory is short")
      ->check(whole_number(0, kMaxCount - 1));
  compile.add_option("--run-dir", c.train.run_dir, "Directory for memory.json and compile.json")
      ->capture_default_str();
  compile.footer(
      "Compiles each stage on its own emulated IPU in turn (under mpirun, rank r takes stages r,\n"
      "r + size, ...), with out of memory allowed, and prints per stage whether it fits.\n"
      "Exit code 0: every stage fits; 1: a stage does not fit (reports written) or failure.\n"
      "  ipupod compile --model resnet50 --stages 4 --arch mk2 --micro-batch 1 --classes 1000");
  return accumulation;
}

CLI::Option* add_estimate_options(CLI::App& estimate, ipupod::pod::EstimateConfig& c) {
  CLI::Option* accumulation = add_dataless_options(estimate, c.compile);
  TrainConfig& t = c.compile.train;
  estimate.add_option("--topology", t.topology, "Pod topology preset or JSON file")
      ->capture_default_str();
  estimate
      .add_option("--replicas", t.replicas, "Data-parallel replicas (PopTorch replicationFactor)")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  estimate.add_flag("--replicated-tensor-sharding", t.replicated_tensor_sharding,
                    "Each replica keeps 1/R of the optimizer state (as train)");
  estimate
      .add_option("--host-input-rate", c.host_input_rate,
                  "Samples/s one host server decodes and augments in the real data format "
                  "(measure it with `ipupod bench input`; 0: not modelled)")
      ->check(finite_number({.min = 0}))
      ->capture_default_str();
  estimate
      .add_option("--hosts", c.hosts,
                  "Host servers feeding the job (0: one per 16 IPUs, as a POD16 has one)")
      ->check(whole_number(0, kMaxCount))
      ->capture_default_str();
  estimate
      .add_option("--steps", c.steps,
                  "Host steps timed after the warm-up; the prediction is their mean")
      ->check(whole_number(1, 1000))
      ->capture_default_str();
  estimate
      .add_option("--warm-up-steps", c.warm_up_steps,
                  "Host steps timed first and left out (a pipeline's first step starts with "
                  "every stage at once; train's prediction is the mean over all its steps)")
      ->check(whole_number(0, 1000))
      ->capture_default_str();
  estimate.add_option("--run-dir", t.run_dir, "Directory for estimate.json and memory.json")
      ->capture_default_str();
  const auto sweep = [&](const char* name, std::vector<std::size_t>& list, const char* what) {
    estimate.add_option(name, list, what)->check(whole_number(1, kMaxCount))->delimiter(',');
  };
  sweep("--sweep-replicas", c.sweep_replicas, "A sweep: replica counts, e.g. 1,2,4,8");
  sweep("--sweep-stages", c.sweep_stages, "A sweep: stage counts, e.g. 2,4,8");
  sweep("--sweep-gradient-accumulation", c.sweep_accumulation,
        "A sweep: gradient accumulation counts, e.g. 10,20,40,60");
  sweep("--sweep-device-iterations", c.sweep_iterations,
        "A sweep: device iteration counts, e.g. 10,20");
  estimate
      .add_option("--sweep-topologies", c.sweep_topologies,
                  "A sweep: topologies the compiled stages are timed on, e.g. "
                  "bow-pod16,bow-pod64,bow-pod256")
      ->delimiter(',');
  estimate.add_option("--csv", c.csv,
                      "The CSV, one row per configuration, a single one too (default "
                      "RUN_DIR/estimate.csv; plot a sweep's with scripts/scaling/plot.py)");
  estimate.footer(
      "Compiles each stage once (replicas share it; under mpirun, rank r takes stages r,\n"
      "r + size, ...), runs no codelet, and times the training program's host steps with the\n"
      "cycles training would count: the stages' compute sets, exchanges and syncs, the\n"
      "pipeline's waits, the gradient all-reduce on the topology's links, the host streams.\n"
      "A sweep (--sweep-*) estimates every combination of its lists, compiling each stage once\n"
      "per stage count (and replica class) for all their accumulation and iteration counts.\n"
      "Exit code 0: every stage fits; 1: a stage does not fit (estimate written) or failure.\n"
      "  ipupod estimate --model resnet50 --stages 4 --replicas 4 --topology pod16 \\\n"
      "      --micro-batch 4 --gradient-accumulation 16 --classes 1000");
  return accumulation;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ipupod: a distributed emulator of a Graphcore IPU pod.\n"
      "Trains models on emulated IPUs (one MPI rank each) and predicts their speed on "
      "real IPU hardware."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ipupod " IPUPOD_VERSION);

  TrainConfig train_config;
  CLI::App* train = app.add_subcommand("train", "Train a model on the emulated pod (under mpirun)");
  add_train_options(*train, train_config);
  add_config_file_option(*train);
  std::string export_config;
  train
      ->add_option("--export-config", export_config,
                   "Write this run's options to FILE (a --config file, as summary.json keeps "
                   "them) and exit without training")
      ->type_name("FILE");

  ipupod::pod::CompileConfig compile_config;
  compile_config.train.micro_batch = 1;
  compile_config.train.run_dir = "compile";
  CLI::App* compile = app.add_subcommand(
      "compile",
      "Compile a model's pipeline stages for an architecture and report whether they fit");
  CLI::Option* compile_accumulation = add_compile_options(*compile, compile_config);
  add_config_file_option(*compile);

  ipupod::pod::EstimateConfig estimate_config;
  estimate_config.compile.train.micro_batch = 1;
  estimate_config.compile.train.run_dir = "estimate";
  CLI::App* estimate = app.add_subcommand(
      "estimate", "Predict a job's speed on a pod and what bounds it, compiling without running");
  CLI::Option* estimate_accumulation = add_estimate_options(*estimate, estimate_config);
  add_config_file_option(*estimate);

  ipupod::pod::InfoRequest info_request;
  CLI::App* info = app.add_subcommand("info", "List architectures, topologies, codelets, models");
  info->add_option("--arch", info_request.arch, "Show one architecture preset and its sources");
  info->add_option("--topology", info_request.topology, "Show one topology's layout and links");
  info->add_option("--model", info_request.model, "Show one model's layers and parameters");
  info->add_option("--loss", info_request.loss,
                   "An ONNX model's loss, as train takes it (an image or field output needs mse "
                   "or l1)")
      ->check(CLI::IsMember(ipupod::models::onnx_losses()))
      ->capture_default_str();
  info->add_flag("--codelets", info_request.codelets, "List the codelets");
  info->add_flag("--models", info_request.models, "List the models");
  info->add_flag("--json", info_request.json,
                 "All of it as one JSON object (with --topology: that topology), with every "
                 "command's option defaults: for scripts");

  CLI::App* data = app.add_subcommand("data", "Convert real data sets into ipupod's HDF5 layout");
  data->require_subcommand(1);
  int data_exit_code = 0;
  ipupod::datasets::add_data_commands(*data, data_exit_code);

  int bench_exit_code = 0;
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks, each against a named peer in the same run");
  bench->require_subcommand(1);
  ipupod::pod::add_allreduce_bench(*bench, bench_exit_code);
  ipupod::pod::add_host_bench(*bench, bench_exit_code);
  ipupod::pod::add_matmul_bench(*bench, bench_exit_code);
  ipupod::pod::add_step_bench(*bench, bench_exit_code);
  ipupod::pod::add_input_bench(*bench, bench_exit_code);

  try {
    std::vector<std::string> args(argv, argv + argc);
    args = expand_config_file(app, std::move(args));
    std::vector<char*> expanded;
    for (auto& a : args) expanded.push_back(a.data());
    app.parse(static_cast<int>(expanded.size()), expanded.data());
  } catch (const ConfigFileError& e) {
    if (launcher_rank() <= 0) std::cerr << "ipupod: " << e.what() << "\n";
    return usage_error_exit(2);
  } catch (const CLI::ParseError& e) {
    if (launcher_rank() > 0) return usage_error_exit(e.get_exit_code() == 0 ? 0 : 2);
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  // The chosen benchmark or converter ran in its parse callback.
  if (*bench) return bench_exit_code;
  if (*data) return data_exit_code;
  try {
    if (*info) {
      if (!info_request.json) {
        ipupod::pod::print_info(info_request, std::cout);
        return 0;
      }
      for (const char* name : {"train", "compile", "estimate"}) {
        nlohmann::json& defaults = info_request.defaults[name];
        defaults = nlohmann::json::object();
        for (const CLI::Option* option : app.get_subcommand(name)->get_options()) {
          const std::string long_name = option->get_single_name();
          if (option->get_default_str().empty() || long_name == "help") continue;
          defaults[long_name] = option->get_default_str();
        }
      }
      std::cout << ipupod::pod::info_json(info_request).dump(1) << "\n";
      return 0;
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "ipupod: " << e.what() << "\n";
    return 2;
  } catch (const ipupod::fabric::FabricError& e) {  // a topology that cannot be used: bad input
    std::cerr << "ipupod: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ipupod: " << e.what() << "\n";
    return 1;
  }

  if (*train && !export_config.empty()) {
    if (launcher_rank() > 0) return 0;  // rank 0 writes it
    std::ofstream out(export_config, std::ios::trunc);
    out << nlohmann::json{{"config", ipupod::pod::config_json(train_config)}}.dump(2) << "\n";
    if (!out.flush()) {
      std::cerr << "ipupod train: --export-config: cannot write '" << export_config
                << "'; check that its folder exists and is writable\n";
      return 2;
    }
    std::cout << "ipupod train: wrote the options to " << export_config << " (run them with "
              << "`ipupod train --config " << export_config << "` under mpirun)\n";
    return 0;
  }

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (*compile) {
    if (compile_accumulation->count() == 0)
      compile_config.train.gradient_accumulation =
          std::max<std::size_t>(1, compile_config.train.stages);
    const int code = ipupod::pod::run_compile(compile_config, MPI_COMM_WORLD);
    MPI_Finalize();
    return code;
  }
  if (*estimate) {
    estimate_config.accumulation_given = estimate_accumulation->count() > 0;
    if (!estimate_config.accumulation_given)
      estimate_config.compile.train.gradient_accumulation =
          std::max<std::size_t>(1, estimate_config.compile.train.stages);
    const int code = ipupod::pod::run_estimate(estimate_config, MPI_COMM_WORLD);
    MPI_Finalize();
    return code;
  }
  const int code = ipupod::pod::run_train(train_config, MPI_COMM_WORLD);
  MPI_Finalize();
  return code;
}

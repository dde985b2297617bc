// Validation of the training configuration with messages a user can act on.
#include "pod/config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>

#include "fabric/topology.hpp"
#include "ipu_process/arch.hpp"
#include "json_text/json_text.hpp"
#include "models/onnx_import.hpp"
#include "models/zoo.hpp"

namespace ipupod::pod {
namespace {

using json_text::shown;

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// The product of options' values, or a UsageError naming them when it passes `limit`.
std::size_t checked_product(std::initializer_list<std::pair<std::size_t, const char*>> factors,
                            std::size_t limit, const std::string& what) {
  std::size_t product = 1;
  bool over = false;
  std::string named;
  for (const auto& [value, option] : factors) {
    named += (named.empty() ? "" : " x ") + std::string(option) + " " + std::to_string(value);
    if (over || (value != 0 && product > limit / value)) {
      over = true;
    } else {
      product *= value;
    }
  }
  if (over)
    throw UsageError(named + " makes more than " + std::to_string(limit) + " " + what +
                     "; lower one of them");
  return product;
}

}  // namespace

void validate_model_name(const std::string& model) {
  if (models::is_onnx_model(model)) {  // its contents are checked when the model is built
    if (!std::filesystem::is_regular_file(model))
      throw UsageError("--model " + model +
                       ": no such ONNX file (export one with scripts/export_pytorch_model.py)");
    return;
  }
  bool known_model = false;
  std::string models;
  for (const auto& e : models::zoo()) {
    known_model |= e.name == model;
    models += (models.empty() ? "" : ", ") + e.name;
  }
  if (!known_model)
    throw UsageError("unknown model '" + model + "'; known models: " + models +
                     ", or an ONNX file FILE.onnx (see `ipupod info --models`)");
}

void validate_counts(const TrainConfig& c) {
  const auto count = [](std::size_t v, std::size_t min, const char* option) {
    if (v < min || v > kMaxCount)
      throw UsageError(std::string(option) + " must be a whole number in [" + std::to_string(min) +
                       ", " + std::to_string(kMaxCount) + "], got " + std::to_string(v));
  };
  count(c.replicas, 1, "--replicas");
  count(c.stages, 1, "--stages");
  count(c.host_instances, 1, "--host-instances");
  count(c.micro_batch, 1, "--micro-batch");
  count(c.gradient_accumulation, 1, "--gradient-accumulation");
  count(c.device_iterations, 1, "--device-iterations");
  count(c.epochs, 1, "--epochs");
  for (std::size_t width : c.hidden) count(width, 1, "--hidden");
  count(c.warmup_steps, 0, "--warmup-steps");
  count(c.shuffle_window, 0, "--shuffle-window");
  count(c.trace_events, 0, "--trace-events");
  count(c.trace_from_step, 0, "--trace-from-step");
  count(c.checkpoint_every, 0, "--checkpoint-every");
  count(c.checkpoint_keep, 0, "--checkpoint-keep");
  checked_product({{c.micro_batch, "--micro-batch"},
                   {c.gradient_accumulation, "--gradient-accumulation"},
                   {c.device_iterations, "--device-iterations"},
                   {c.replicas, "--replicas"}},
                  kMaxCount, "samples per host step");
  // The world is 1 host + replicas x stages IPU ranks, and MPI counts ranks with int.
  checked_product({{c.replicas, "--replicas"}, {c.stages, "--stages"}}, kMaxCount - 1,
                  "IPU ranks (1 host + replicas x stages must fit in an MPI world)");
  if (c.ipus() > kMaxCount - c.host_instances)
    throw UsageError("--host-instances " + std::to_string(c.host_instances) + " + " +
                     std::to_string(c.ipus()) + " IPU ranks do not fit in an MPI world (at most " +
                     std::to_string(kMaxCount) + " ranks); use fewer host instances");
  if (c.replicas % c.host_instances != 0)
    throw UsageError("--host-instances " + std::to_string(c.host_instances) +
                     " must divide --replicas " + std::to_string(c.replicas) +
                     ": each host instance serves the same number of replicas");
}

void validate_pipeline(const TrainConfig& c) {
  if (c.pipeline_schedule != "grouped" && c.pipeline_schedule != "sequential")
    throw UsageError("--pipeline-schedule must be grouped or sequential, got '" +
                     c.pipeline_schedule + "'");
  if (c.stages > 1 && c.pipeline_schedule == "grouped" && c.gradient_accumulation < c.stages)
    throw UsageError("--gradient-accumulation " + std::to_string(c.gradient_accumulation) +
                     " is smaller than --stages " + std::to_string(c.stages) +
                     ": the grouped pipeline needs at least one micro-batch per stage in "
                     "flight; raise --gradient-accumulation to " +
                     std::to_string(c.stages) + " or more, or use --pipeline-schedule sequential");
  if (!(c.available_memory_proportion > 0 && c.available_memory_proportion <= 1))
    throw UsageError("--available-memory-proportion must be in (0, 1], got " +
                     std::to_string(c.available_memory_proportion));
  if (c.split != "model" && c.split != "auto")
    throw UsageError("--split must be model (the model's split marks) or auto, got '" + c.split +
                     "'");
  if (!c.split_at.empty() && c.split == "auto")
    throw UsageError("--split-at gives the split, --split auto asks for one to be found: use one");
  if (!c.split_at.empty() && c.split_at.size() + 1 != c.stages)
    throw UsageError("--split-at names " + std::to_string(c.split_at.size()) +
                     " block(s) that begin stages, which makes " +
                     std::to_string(c.split_at.size() + 1) + " stages, but --stages is " +
                     std::to_string(c.stages) + "; name --stages minus one blocks");
  for (const std::string& block : c.split_at)
    if (block.empty())
      throw UsageError("--split-at: an empty block name; give module paths separated by commas");
  if (c.recompute && (c.stages < 2 || c.pipeline_schedule != "grouped"))
    throw UsageError(
        "--recompute trades compute for the activation stashes of the grouped pipeline, which "
        "needs --stages 2 or more and --pipeline-schedule grouped (this run has " +
        std::to_string(c.stages) + " stage(s), " + c.pipeline_schedule +
        "); drop --recompute or split the model");
}

void validate(const TrainConfig& c, int world_size) {
  if (c.data.empty()) throw UsageError("--data is required: an HDF5 file made by `ipupod data`");
  validate_job(c);
  if (world_size != static_cast<int>(c.world_size()))
    throw UsageError("the MPI world has " + std::to_string(world_size) + " ranks, but " +
                     std::to_string(c.host_instances) + " host instance(s) + " +
                     std::to_string(c.replicas) + " replicas x " + std::to_string(c.stages) +
                     " stages needs " + std::to_string(c.world_size()) + "; run with `mpirun -n " +
                     std::to_string(c.world_size()) + " ipupod train ...`");
}

void validate_loss(const TrainConfig& c) {
  const auto& losses = models::onnx_losses();
  if (std::find(losses.begin(), losses.end(), c.loss) == losses.end())
    throw UsageError("--loss must be auto, cross-entropy, mse or l1, got '" + c.loss + "'");
  if (c.loss != "auto" && !models::is_onnx_model(c.model))
    throw UsageError("--loss " + c.loss + ": the zoo's model '" + c.model +
                     "' is trained on its own loss (see `ipupod info --model " + c.model +
                     "`); --loss chooses an ONNX model's loss: drop it");
}

void validate_job(const TrainConfig& c) {
  validate_counts(c);
  const auto finite_in = [](double v, double min, double max, const char* option) {
    if (!(std::isfinite(v) && v > min && v <= max))
      throw UsageError(std::string(option) + " must be a finite number " +
                       (max == std::numeric_limits<double>::max()
                            ? "> " + number_text(min)
                            : "in (" + number_text(min) + ", " + number_text(max) + "]") +
                       ", got " + number_text(v));
  };
  finite_in(c.timeout_s, 0, kMaxTimeoutSeconds, "--timeout");
  finite_in(c.width, 0, kMaxModelMultiplier, "--width");
  finite_in(c.depth, 0, kMaxModelMultiplier, "--depth");
  finite_in(c.learning_rate, 0, std::numeric_limits<double>::max(), "--learning-rate");
  if (c.shuffle_window > 0 && !c.shuffle)
    throw UsageError("--shuffle-window " + std::to_string(c.shuffle_window) +
                     " shuffles in windows, --no-shuffle reads in file order; drop one of them");
  validate_model_name(c.model);
  validate_loss(c);
  try {
    ipu::ArchPreset::get(c.arch);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--arch: ") + e.what());
  }
  try {
    const auto topo = fabric::Topology::preset(c.topology);
    if (static_cast<std::size_t>(topo.ipus()) < c.ipus())
      throw UsageError("--topology " + c.topology + " has " + std::to_string(topo.ipus()) +
                       " IPUs, the run needs " + std::to_string(c.ipus()) + " (" +
                       std::to_string(c.replicas) + " replicas x " + std::to_string(c.stages) +
                       " stages); choose a larger topology");
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(std::string("--topology: ") + e.what());
  }
  validate_pipeline(c);
  if (c.optimizer != "sgd" && c.optimizer != "sgd_momentum" && c.optimizer != "adam" &&
      c.optimizer != "adamw" && c.optimizer != "lamb")
    throw UsageError("--optimizer must be sgd, sgd_momentum, adam, adamw or lamb, got '" +
                     c.optimizer + "'");
  if (!(c.clip_norm >= 0) || !std::isfinite(c.clip_norm))
    throw UsageError("--clip-norm must be a finite number >= 0 (0: no clipping), got " +
                     std::to_string(c.clip_norm));
  if (c.replicated_tensor_sharding && (c.optimizer == "lamb" || c.clip_norm > 0))
    throw UsageError("--replicated-tensor-sharding does not support " +
                     std::string(c.optimizer == "lamb" ? "--optimizer lamb" : "--clip-norm") +
                     " yet (their norms would span the replicas' shards); use adam, adamw or "
                     "sgd_momentum without --clip-norm, or drop --replicated-tensor-sharding");
  if (c.replicated_tensor_sharding && c.precision == "fp16")
    throw UsageError(
        "--replicated-tensor-sharding does not support --precision fp16 yet (the fabric's "
        "reduce-scatter and all-gather of the device take float32 tensors); drop one of them");
  if (c.replicated_tensor_sharding && (c.checkpoint_every > 0 || !c.resume.empty()))
    throw UsageError(
        "--replicated-tensor-sharding does not support checkpoints yet (each replica keeps only "
        "its shard of the optimizer state and checkpoints are written from replica 0); drop "
        "--checkpoint-every and --resume, or --replicated-tensor-sharding");
  if (!(c.momentum >= 0 && c.momentum < 1))
    throw UsageError("--momentum must be in [0, 1), got " + std::to_string(c.momentum));
  if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay))
    throw UsageError("--weight-decay must be a finite number >= 0, got " +
                     std::to_string(c.weight_decay));
  if (c.partials_type != "float" && c.partials_type != "half")
    throw UsageError("--partials-type must be float or half, got '" + c.partials_type + "'");
  if (c.precision != "fp32" && c.precision != "fp16")
    throw UsageError("--precision must be fp32 or fp16, got '" + c.precision + "'");
  if (!(c.loss_scaling > 0) || !std::isfinite(c.loss_scaling))
    throw UsageError("--loss-scaling must be a positive number, got " +
                     std::to_string(c.loss_scaling));
  if (c.stochastic_rounding != "on" && c.stochastic_rounding != "off")
    throw UsageError("--stochastic-rounding must be on or off, got '" + c.stochastic_rounding +
                     "'");
  if (c.lr_schedule != "constant" && c.lr_schedule != "step" && c.lr_schedule != "cosine")
    throw UsageError("--lr-schedule must be constant, step or cosine, got '" + c.lr_schedule + "'");
}

nlohmann::json config_json(const TrainConfig& c) {
  return {{"model", c.model},
          {"hidden", c.hidden},
          {"width", c.width},
          {"depth", c.depth},
          {"data", c.data},
          {"arch", c.arch},
          {"topology", c.topology},
          {"replicas", c.replicas},
          {"stages", c.stages},
          {"recompute", c.recompute},
          {"available_memory_proportion", c.available_memory_proportion},
          {"partials_type", c.partials_type},
          {"split", c.split},
          {"split_at", c.split_at},
          {"micro_batch", c.micro_batch},
          {"gradient_accumulation", c.gradient_accumulation},
          {"device_iterations", c.device_iterations},
          {"epochs", c.epochs},
          {"learning_rate", c.learning_rate},
          {"optimizer", c.optimizer},
          {"momentum", c.momentum},
          {"weight_decay", c.weight_decay},
          {"lr_schedule", c.lr_schedule},
          {"loss", c.loss},
          {"warmup_steps", c.warmup_steps},
          {"clip_norm", c.clip_norm},
          {"precision", c.precision},
          {"loss_scaling", c.loss_scaling},
          {"stochastic_rounding", c.stochastic_rounding},
          {"replicated_tensor_sharding", c.replicated_tensor_sharding},
          {"seed", c.seed},
          {"shuffle", c.shuffle},
          {"shuffle_window", c.shuffle_window},
          {"pipeline_schedule", c.pipeline_schedule},
          {"allow_out_of_memory", c.allow_out_of_memory},
          {"run_dir", c.run_dir},
          {"bind_address", c.bind_address},
          {"timeout", c.timeout_s},
          {"trace_events", c.trace_events},
          {"trace_from_step", c.trace_from_step},
          {"host_instances", c.host_instances},
          {"checkpoint_every", c.checkpoint_every},
          {"checkpoint_keep", c.checkpoint_keep},
          {"global_batch", c.global_batch()}};
}

std::vector<std::string> resume_differences(const TrainConfig& c, const nlohmann::json& saved) {
  // Free to change: epochs (to train further), data path (a moved file; its sample count and
  // shape are checked separately), run directory, timeouts, reports, checkpoint cadence.
  static const char* const kFixed[] = {"model",
                                       "hidden",
                                       "width",
                                       "depth",
                                       "arch",
                                       "topology",
                                       "replicas",
                                       "stages",
                                       "split",
                                       "split_at",
                                       "micro_batch",
                                       "gradient_accumulation",
                                       "device_iterations",
                                       "learning_rate",
                                       "optimizer",
                                       "momentum",
                                       "weight_decay",
                                       "lr_schedule",
                                       "loss",
                                       "warmup_steps",
                                       "clip_norm",
                                       "precision",
                                       "loss_scaling",
                                       "stochastic_rounding",
                                       "seed",
                                       "shuffle",
                                       "shuffle_window"};
  const nlohmann::json now = config_json(c);
  // The record may hold anything (it is refused further on unless it is an object): its values
  // are referred to, never copied (a deeply nested one would overflow the stack).
  // Settings added after checkpoints were first written, as an older record ran them:
  // checkpoints from before the windowed shuffle shuffled whole splits (window 0), those from
  // before --split-at named no blocks, those from before --loss took the automatic loss.
  static const nlohmann::json kAbsent;
  static const std::map<std::string_view, nlohmann::json> kLater = {
      {"shuffle_window", 0}, {"split_at", nlohmann::json::array()}, {"loss", "auto"}};
  const bool object = saved.is_object();
  std::vector<std::string> differences;
  for (const char* key : kFixed) {
    const auto later = kLater.find(key);
    const nlohmann::json& was = object && saved.contains(key) ? saved.at(key)
                                : later != kLater.end()       ? later->second
                                                              : kAbsent;
    if (was != now.at(key))
      differences.push_back(std::string(key) + ": checkpoint " +
                            (was.is_null() ? std::string("(absent)") : shown(was)) + ", this run " +
                            now.at(key).dump());
  }
  if (c.lr_schedule != "constant" && object && saved.contains("epochs") &&
      saved.at("epochs") != c.epochs)
    differences.push_back("epochs: checkpoint " + shown(saved.at("epochs")) + ", this run " +
                          std::to_string(c.epochs) + " (the " + c.lr_schedule +
                          " learning-rate schedule spans the whole run)");
  return differences;
}

}  // namespace ipupod::pod

// The training configuration in PopTorch's vocabulary, and its validation against the MPI
// world it runs in. Every rank parses the same arguments and reaches the same verdict.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "ipu_process/planning.hpp"

namespace ipupod::pod {

// Bad usage or bad input: the command exits with code 2 and this message.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The largest count an option takes (replicas, stages, micro-batch, steps, ...), and the largest
// product of counts (samples per host step, ranks): MPI numbers ranks and counts elements with
// int, and no run comes near it.
inline constexpr std::size_t kMaxCount = 2147483647;
// The longest --timeout, in seconds (a week; the stream deadlines are kept in milliseconds).
inline constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;
// The largest --width and --depth multipliers: channel and block counts stay far from overflow.
inline constexpr double kMaxModelMultiplier = 1024;

struct TrainConfig {
  std::string model = "mlp";
  std::vector<std::size_t> hidden = {128};
  double width = 1.0;  // channel width multiplier of the convolutional models (small configs)
  double depth = 1.0;  // block repeat multiplier of the deep models (resnet50, efficientnetv2_s)
  std::string data;
  std::string arch = "mk2";
  std::string topology = "pod16";
  std::size_t replicas = 1;
  std::size_t stages = 1;
  std::string pipeline_schedule = "grouped";  // or "sequential" (sharded, for debugging)
  bool recompute = false;  // grouped pipeline: re-run forward ops instead of stashing activations
  // Share of each tile's memory one op's plan may use (Poplar's availableMemoryProportion).
  double available_memory_proportion = ipu::kDefaultAvailableMemoryProportion;
  // The matrix unit's partial sums: "float" or "half" (PopTorch's Precision.setPartialsType);
  // half gives float16 products the AMP's FP16.16 rate in the cycle estimates.
  std::string partials_type = "float";
  std::string split = "model";  // stages from the model's split marks, or "auto" (balanced)
  // Or the blocks that begin stages 1, 2, ... (module paths, like PopTorch's BeginBlock).
  std::vector<std::string> split_at;
  std::size_t micro_batch = 16;
  std::size_t gradient_accumulation = 1;
  std::size_t device_iterations = 1;
  std::size_t epochs = 1;
  double learning_rate = 0.05;
  std::string optimizer = "sgd";         // sgd, sgd_momentum, adam, adamw, lamb (applied on tiles)
  double momentum = 0.9;                 // sgd_momentum
  double weight_decay = 0;               // L2 (sgd, sgd_momentum, adam) or decoupled (adamw)
  std::string lr_schedule = "constant";  // or step (x0.1 every quarter of the run), cosine
  // An ONNX model's loss: auto (from its output's shape), cross-entropy, mse or l1.
  std::string loss = "auto";
  std::size_t warmup_steps = 0;  // optimizer steps of linear warm-up
  double clip_norm = 0;          // global L2 norm to clip gradients to (0: no clipping)
  // fp32, or fp16: parameters and most activations stored as float16 (see compile_for_ipu),
  // gradient accumulators and optimizer state float32.
  std::string precision = "fp32";
  double loss_scaling = 1;                  // static loss scale S: the loss gradient is seeded
                                            // with S and gradients are divided by S to update
  std::string stochastic_rounding = "off";  // or on: float16 stores round stochastically
  bool replicated_tensor_sharding = false;  // each replica keeps 1/R of the optimizer state
  std::uint64_t seed = 1;
  bool shuffle = true;
  std::size_t shuffle_window = 0;  // 0: shuffle the whole split; N: windows of N samples
  bool allow_out_of_memory = false;
  std::string run_dir = "run";
  std::string bind_address = "0.0.0.0";  // every interface: IPU ranks on other nodes reach it
  double timeout_s = 120;                // host <-> IPU stream operations
  std::size_t trace_events = 4000;  // first events of each IPU's predicted timeline in trace.json
  std::size_t trace_from_step = 0;  // host step (from the run's start) where the trace begins
  // Checkpoints: every N host steps and at the end (0: none), into the run directory as
  // checkpoint-<host step>.h5, keeping the newest `checkpoint_keep` of this run (0: all).
  std::size_t checkpoint_every = 0;
  std::size_t checkpoint_keep = 2;
  std::string resume;  // a checkpoint to continue from ("" : start afresh)

  // Host ranks, as PopRun's instances: each serves replicas / host_instances replicas from its
  // own reader of the data file and stream server (one per node in a real launch).
  std::size_t host_instances = 1;

  std::size_t ipus() const { return replicas * stages; }
  std::size_t world_size() const { return host_instances + ipus(); }
  std::size_t replicas_per_instance() const { return replicas / host_instances; }
  // Samples one replica consumes per host step (one run of the device's training program).
  std::size_t samples_per_replica_step() const {
    return micro_batch * gradient_accumulation * device_iterations;
  }
  std::size_t global_batch() const { return micro_batch * gradient_accumulation * replicas; }
};

// A zoo model's name or an existing ONNX file (FILE.onnx); throws UsageError listing the zoo.
void validate_model_name(const std::string& model);
// --loss: one of auto, cross-entropy, mse, l1, and only for an ONNX model.
void validate_loss(const TrainConfig& config);
// The counts of a run and their products (samples per host step, 1 + replicas x stages ranks)
// are at least 1 and at most kMaxCount; throws UsageError naming the options.
void validate_counts(const TrainConfig& config);
// The pipeline options (schedule, accumulation vs stages, recomputation); throws UsageError.
void validate_pipeline(const TrainConfig& config);
// Checks the options on their own and against the MPI world size; throws UsageError.
void validate(const TrainConfig& config, int world_size);
// The same without the data file and the world size (what `ipupod estimate` checks).
void validate_job(const TrainConfig& config);

// A run's options, as JSON keyed like the long options (with '_' for '-'; summary.json,
// checkpoints and --export-config), and the batch they make ("global_batch", derived): `ipupod
// train --config` of such a file, or of a summary.json, runs the same job again.
nlohmann::json config_json(const TrainConfig& config);
// What a resumed run changes that the checkpoint's run fixed (options that change the model or
// the order or value of any number: a bitwise-identical continuation needs them equal), one
// "option: checkpoint X, this run Y" per difference; empty if nothing differs.
std::vector<std::string> resume_differences(const TrainConfig& config, const nlohmann::json& saved);

}  // namespace ipupod::pod

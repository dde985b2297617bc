// The pod compiler: lowers a model's IR onto one emulated IPU with the device's op libraries
// and builds the training and evaluation programs (micro-batch loop, gradient accumulation,
// replica all-reduce, optimizer step, device iterations).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ipu_process/graph.hpp"
#include "ipu_process/planning.hpp"
#include "ipu_process/program.hpp"
#include "models/zoo.hpp"

namespace ipupod::pod {

// Names of the host streams the compiled programs use.
inline constexpr const char* kInputStream = "input";
inline constexpr const char* kLabelStream = "labels";
inline constexpr const char* kLossStream = "loss";
inline constexpr const char* kLogitsStream = "logits";

struct StepShape {
  std::size_t gradient_accumulation = 1;
  std::size_t device_iterations = 1;
  std::size_t replicas = 1;
  std::size_t stages = 1;  // pipeline stages of a replica: one IPU each
  std::size_t stage = 0;   // the stage this IPU runs
  // Graphcore's grouped pipeline (ramp-up, main phase, ramp-down, activation stashes), or
  // sequential (sharded) execution: one micro-batch at a time through every stage.
  bool grouped = true;
  // Grouped pipeline: stash only what a stage's forward pass cannot make again (its received
  // activations, host inputs, random draws) and re-run the forward ops before the backward pass,
  // trading compute for stash memory (PopTorch's pipelined recomputation).
  bool recompute = false;
  // --precision fp16: parameters and the activations of the ops that compute on float16 (see
  // compile_for_ipu) are float16 in tile memory; everything else stays float32.
  bool float16 = false;
  // Replicated tensor sharding (PopTorch's name): with replicas > 1 each replica keeps only its
  // block of the stateful optimizers' state; the gradients are reduce-scattered instead of
  // all-reduced, each replica updates its block of the weights and all-gathers the rest.
  bool replicated_tensor_sharding = false;
  std::size_t replica = 0;  // this IPU's replica (which block it keeps)
  // Share of each tile's memory the op planners may use for one op (Poplar's option).
  double available_memory_proportion = ipu::kDefaultAvailableMemoryProportion;
  bool half_partials = false;  // the AMP's float16 partials rate (ipu::Graph::set_half_partials)
  // A graph that will only be planned (ipupod compile): its vertices keep no parameters (see
  // ipu::Graph::drop_vertex_params).
  bool plan_only = false;
  // Further (gradient accumulation, device iterations) pairs of the training step, each a
  // program named by timed_train_program for Engine::time only (in
  // CompiledModel::timing_only_programs, left out of the memory plan): the same compute sets and
  // stashes run with other loop counts, so a sweep compiles a stage once.
  std::vector<std::pair<std::size_t, std::size_t>> timed_steps = {};
};

// The name of the timing-only training program of `gradient_accumulation` and
// `device_iterations` (StepShape::timed_steps).
std::string timed_train_program(std::size_t gradient_accumulation, std::size_t device_iterations);

struct CompiledModel {
  std::unique_ptr<ipu::Graph> graph;
  std::map<std::string, ipu::Program> programs;  // "train", "eval"
  std::map<models::ValueId, ipu::Tensor> parameters;
  // Parameters and state (running statistics, codebooks) to fill from
  // models::initial_parameter before the first run, keyed by the training model's values.
  std::vector<std::pair<models::ValueId, ipu::Tensor>> initial_values;
  // Every tensor a checkpoint must hold to resume bitwise: parameters, optimizer state
  // (moments, step counters), model state (running statistics, codebooks), gradient
  // accumulators excluded. Named by the IR value (parameters, state) or "<param>/<slot>".
  std::vector<std::pair<std::string, ipu::Tensor>> checkpointed;
  std::vector<std::pair<ipu::Tensor, float>> constants;  // to fill after the engine is built
  ipu::Tensor input, labels, logits, loss;               // host-facing tensors: stage 0 only
  ipu::Tensor eval_logits, eval_loss;             // what the "eval" program streams back (stage 0)
  std::size_t stash_slots = 1;                    // activation stash depth of this stage
  std::size_t transfers = 0;                      // send and receive programs of this stage
  std::vector<std::string> timing_only_programs;  // of StepShape::timed_steps
};

// With shape.float16, matmuls, convolutions, additions, bias additions and ReLUs (forward and
// backward) run on float16 operands (computing in float32, rounding each result once) and make
// float16 activations; the other ops get float32 copies of float16 operands. Parameters are stored
// as float16 and updated in place; gradient accumulators, optimizer state, model state and the
// host-facing outputs stay float32.
// Lowers the ops of one pipeline stage of `model` (built for training) and, when given,
// `eval_model` (the same model built with training = false, sharing parameters and state by
// name) onto one IPU. Values crossing stages travel by send/receive programs over the fabric
// (peer = stage index in the replica); the host talks to stage 0 only, so the loss and the
// evaluation outputs are sent back to it.
// Where a compile stands, for progress lines while it works: the phase being lowered
// ("forward", "backward", "optimizer", "evaluation"), the ops of this stage lowered so far of
// the phase's total, and the op just lowered.
struct CompileProgress {
  std::string_view phase;
  std::size_t done = 0, total = 0;
  std::string_view op;
};
using CompileProgressFn = std::function<void(const CompileProgress&)>;

CompiledModel compile_for_ipu(const models::Model& model, const ipu::ArchPreset& arch,
                              const StepShape& shape, const models::Model* eval_model = nullptr,
                              const CompileProgressFn& progress = {});

}  // namespace ipupod::pod

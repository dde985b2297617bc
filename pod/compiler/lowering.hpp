// The lowering of a model's IR ops onto one IPU: one device op library call per op, the
// transfers of values between pipeline stages, the precision plan of --precision fp16, and
// (optimizer_lowering.cpp) the optimizer's updates.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/ops/optimizer.hpp"
#include "pod/compiler/compiler.hpp"
#include "pod/compiler/pipeline_plan.hpp"

namespace ipupod::pod {

using models::OpKind;
using models::Phase;

// The programs of a stage's recomputation, one per segment of its plan.
struct RecomputePrograms {
  explicit RecomputePrograms(const Recomputation& p)
      : plan(p), segments(p.segments()), added(p.segments(), false) {}
  const Recomputation& plan;
  std::vector<ipu::Program> segments;
  std::vector<bool> added;  // to the backward pass
  // Adds segment s (after the segments it reads) to prog unless it is there already.
  void add(std::size_t s, ipu::Program& prog);
};

class Lowering {
 public:
  Lowering(CompiledModel& out, bool float16) : out_(out), float16_(float16) {}

  // The model whose ops are lowered next; parameters, state and host inputs are shared by name
  // with the models lowered before (the evaluation model uses the training model's weights).
  void set_model(const models::Model& model, bool owns_variables);
  // Called after each op lowered by lower_phase and lower_optimizer (may be empty).
  void set_progress(const CompileProgressFn* progress) { progress_ = progress; }
  // Whether a later phase may read the casts an earlier one made: not when the pipeline
  // stashes activations, as it stashes values, not their casts.
  void share_casts_between_phases(bool share) { share_casts_ = share; }
  // Lowers every op of the phase that belongs to `stage` into prog, in graph order: values
  // from other stages are received just before their first use here, values other stages
  // use are sent as soon as they are made.
  // With `recompute`: the forward pass also adds each recomputed op to its segment's program
  // (without its transfers: the same programs on the same tensors), and the backward pass adds
  // a segment's program (after those of the segments it reads) just before the first op that
  // reads one of its results.
  void lower_phase(Phase phase, ipu::Program& prog, int stage, const Transfers& transfers,
                   RecomputePrograms* recompute = nullptr);
  // The receive of a value this stage gets from another one.
  void receive(models::ValueId v, int stage, const Transfers& transfers, ipu::Program& prog);
  void send(models::ValueId v, int stage, const Transfers& transfers, ipu::Program& prog);
  bool has(models::ValueId v) const { return tensors_.count(v) > 0; }
  // The updates read the gradients bound below times this (the mean over the micro-batches).
  void set_gradient_scale(double scale) { gradient_scale_ = scale; }
  // Replicated tensor sharding: the update of `param` changes elements [begin, end) only, its
  // optimizer state holds just those, and the updates of parameters not listed are skipped.
  void shard(models::ValueId param, std::size_t begin, std::size_t end);
  void set_sharded(bool sharded) { sharded_ = sharded; }
  // ... and times this scalar of the step (clipping), if set.
  void set_gradient_factor(const ipu::Tensor& factor) { gradient_factor_ = factor; }
  // Makes `v` stand for `t` from here on (the optimizer reads the accumulated gradients).
  void bind(models::ValueId v, const ipu::Tensor& t) { tensors_.insert_or_assign(v, t); }
  // Lowers the optimizer phase of `stage` (besides the plain sgd_steps, which the compiler
  // fuses with gradient accumulation): the updates of this stage's parameters, and the step
  // counter and learning rate they read, which every stage keeps for itself.
  void lower_optimizer(int stage, ipu::Program& prog);
  std::vector<models::ValueId> lowered() const;
  const ipu::Tensor& tensor(models::ValueId id) const;

 private:
  // What identifies the step coefficients an update reads: its kind, rate, step and betas.
  static std::string coefficients_key(const models::Op& update);
  // The coefficients `update` reads (rate, bias corrections), made once per step and copied by
  // one exchange onto the tiles of every parameter of this stage whose update reads the same.
  const ipu::ops::TileCopies& step_coefficients(const models::Op& update, ipu::Program& prog);

  // Every LAMB update of this stage that reads the same coefficients, at once (the first of them
  // lowers them all): their trust ratios take a reduction and a broadcast each, done together.
  void lamb_updates(const models::Op& first, ipu::Program& prog);

  // The elements of the parameter `update` changes: all of them, or its shard.
  ipu::Tensor updated(const models::Op& update) const;
  // A stateful update's state (moments, velocity) when sharded: laid out like the parameter's
  // shard, zero at start (the optimizers' state starts at zero), not checkpointed.
  std::optional<ipu::Tensor> sharded_state(models::ValueId state);
  // The stateful update whose per-element state (moments, velocity) `value` is, if any.
  const models::Op* update_of_state(models::ValueId value) const;

  // A parameter, state or input variable, created by the first model that names it.
  ipu::Tensor shared_variable(const models::Op& op, const models::TensorInfo& info,
                              ipu::MemoryCategory category);

  // Lowers op after whatever of its inputs is not lowered yet (optimizer-phase values only).
  void lower_with_inputs(const models::Op& op, ipu::Program& prog);
  void lower_inputs(const models::Op& op, ipu::Program& prog);

  // The type a value has on the device, from the graph alone, so that every stage agrees.
  ipu::DType value_dtype(models::ValueId v) const;

  // Input k of op as the op computes on it: under --precision fp16, cast (once, or once per
  // phase, see share_casts_between_phases) to float16 for the ops that read float16, to
  // float32 for the others (the state that in-place updates change is float32 already). Views
  // and the optimizer phase see the tensors themselves.
  const ipu::Tensor& operand(const models::Op& op, std::size_t k, ipu::Program& prog);

  void lower(const models::Op& op, ipu::Program& prog);

  // [..., m, k] x [..., k, n]: one matmul per leading index, joined along a new first axis.
  ipu::Tensor batch_matmul(const models::Op& op, ipu::Program& prog,
                           const models::TensorInfo& info);

  CompiledModel& out_;
  bool float16_;
  const models::Model* model_ = nullptr;
  bool owns_variables_ = true;
  std::map<models::ValueId, ipu::Tensor> tensors_;
  std::map<std::pair<models::ValueId, ipu::DType>, ipu::Tensor> casts_;
  bool share_casts_ = false;
  std::map<std::string, ipu::Tensor> shared_;
  int stage_ = 0;  // of the optimizer phase being lowered
  double gradient_scale_ = 1;
  std::optional<ipu::Tensor> gradient_factor_;
  std::map<std::string, ipu::ops::TileCopies> step_coefficients_;
  std::set<const models::Op*> lamb_done_;
  bool sharded_ = false;
  std::map<models::ValueId, std::pair<std::size_t, std::size_t>> shards_;
  const CompileProgressFn* progress_ = nullptr;
};

}  // namespace ipupod::pod

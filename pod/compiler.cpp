// Lowering of IR ops onto the device, one op library call per op.
#include "pod/compiler.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <stdexcept>

#include "fabric/collectives.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/gather.hpp"
#include "ipu_process/ops/loss.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "ipu_process/ops/norm.hpp"
#include "ipu_process/ops/optimizer.hpp"
#include "ipu_process/ops/pool.hpp"
#include "ipu_process/ops/reduce.hpp"
#include "ipu_process/ops/softmax.hpp"
#include "ipu_process/ops/tensor_ops.hpp"

namespace ipupod::pod {
namespace {

using models::OpKind;
using models::Phase;

ipu::DType device_dtype(models::DType d) {
  return d == models::DType::f32 ? ipu::DType::f32 : ipu::DType::i32;
}

std::vector<std::size_t> sizes(const std::vector<std::int64_t>& list) {
  return {list.begin(), list.end()};
}

ipu::ops::ConvParams conv_params(const models::Op& op) {
  const auto g = models::Conv2dGeometry::read(op);
  ipu::ops::ConvParams p{.stride_h = g.stride_h,
                         .stride_w = g.stride_w,
                         .pad_top = g.pad_top,
                         .pad_bottom = g.pad_bottom,
                         .pad_left = g.pad_left,
                         .pad_right = g.pad_right,
                         .dilation_h = g.dilation_h,
                         .dilation_w = g.dilation_w,
                         .groups = g.groups};
  if (op.attrs.lists.count("output_padding")) {
    const auto& o = op.list("output_padding");
    p.output_padding_h = static_cast<std::size_t>(o[0]);
    p.output_padding_w = static_cast<std::size_t>(o[1]);
  }
  return p;
}

ipu::ops::PoolParams pool_params(const models::Op& op) {
  const auto g = models::Pool2dGeometry::read(op);
  return {.kernel_h = g.kernel_h,
          .kernel_w = g.kernel_w,
          .stride_h = g.stride_h,
          .stride_w = g.stride_w,
          .pad_h = g.pad_h,
          .pad_w = g.pad_w,
          .count_include_pad = g.count_include_pad,
          .adaptive = g.adaptive,
          .out_h = g.out_h,
          .out_w = g.out_w};
}

ipu::ops::NormParams norm_params(const models::Op& op) {
  ipu::ops::NormParams p;
  switch (static_cast<models::NormKind>(op.i("norm"))) {
    case models::NormKind::batch:
      p.kind = ipu::ops::NormKind::batch;
      break;
    case models::NormKind::layer:
      p.kind = ipu::ops::NormKind::layer;
      break;
    case models::NormKind::group:
      p.kind = ipu::ops::NormKind::group;
      break;
  }
  p.eps = op.r("eps");
  p.groups = static_cast<std::size_t>(op.i("groups"));
  return p;
}

ipu::ops::UnaryOp unary_op(const models::Op& op) {
  using models::UnaryFn;
  using U = ipu::ops::UnaryOp;
  switch (static_cast<UnaryFn>(op.i("fn"))) {
    case UnaryFn::gelu:
      return U::gelu;
    case UnaryFn::silu:
      return U::silu;
    case UnaryFn::sigmoid:
      return U::sigmoid;
    case UnaryFn::tanh:
      return U::tanh;
    case UnaryFn::leaky_relu:
      return U::leaky_relu;
    case UnaryFn::sqrt:
      return U::sqrt;
    case UnaryFn::rsqrt:
      return U::rsqrt;
    case UnaryFn::exp:
      return U::exp;
    case UnaryFn::log:
      return U::log;
    case UnaryFn::square:
      return U::square;
    case UnaryFn::abs:
      return U::abs;
    case UnaryFn::neg:
      return U::neg;
  }
  throw std::invalid_argument("op '" + op.name + "': unknown unary function");
}

ipu::ops::BinaryOp binary_op(const models::Op& op) {
  switch (static_cast<models::BinaryFn>(op.i("fn"))) {
    case models::BinaryFn::add:
      return ipu::ops::BinaryOp::add;
    case models::BinaryFn::sub:
      return ipu::ops::BinaryOp::sub;
    case models::BinaryFn::mul:
      return ipu::ops::BinaryOp::mul;
    case models::BinaryFn::div:
      return ipu::ops::BinaryOp::div;
  }
  throw std::invalid_argument("op '" + op.name + "': unknown binary function");
}

// A value one stage makes and another uses, sent once per micro-batch on its own tag.
struct Transfer {
  models::ValueId value;
  int from, to;
  unsigned tag;
};
using Transfers = std::vector<Transfer>;

int stage_of(const models::Graph& g, models::ValueId v) {
  return g.producer(v).pipeline_stage;
}

// Every value used on a stage other than its producer's, once per using stage, and the
// host-facing outputs that must reach stage 0; tags numbered from first_tag in graph order,
// the same on every rank.
Transfers plan_transfers(const models::Model& m, const std::vector<models::ValueId>& to_host,
                         unsigned first_tag) {
  Transfers out;
  const auto add = [&](models::ValueId v, int to) {
    const int from = stage_of(m.graph, v);
    if (from == to) return;
    for (const auto& t : out)
      if (t.value == v && t.to == to) return;
    out.push_back({v, from, to, first_tag + static_cast<unsigned>(out.size())});
  };
  for (const auto& op : m.graph.ops()) {
    if (op.phase == Phase::optimizer || op.kind == OpKind::sgd_step) continue;
    for (models::ValueId v : op.inputs)
      if (m.graph.producer(v).kind != OpKind::constant) add(v, op.pipeline_stage);
  }
  for (models::ValueId v : to_host) add(v, 0);
  return out;
}

// Recomputation in the grouped pipeline: the forward ops of `stage` worth running again before
// its backward pass (those whose results the backward pass reads, directly or through other
// recomputed ops) and that give the same result when run again: not random draws, not in-place
// state updates, not readers of state such an update changes within the forward pass.
std::set<const models::Op*> recomputed_ops(const models::Graph& g, int stage) {
  const auto on_stage = [&](const models::Op& op, Phase phase) {
    return op.phase == phase && op.pipeline_stage == stage && op.kind != OpKind::sgd_step;
  };
  std::set<models::ValueId> updated_state, needed;
  for (const auto& op : g.ops()) {
    if (on_stage(op, Phase::forward) && !op.output)
      for (models::ValueId v : op.inputs)
        if (g.producer(v).kind == OpKind::state) updated_state.insert(v);
    if (on_stage(op, Phase::backward)) needed.insert(op.inputs.begin(), op.inputs.end());
  }
  std::set<const models::Op*> out;
  const auto& ops = g.ops();
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    const models::Op& op = *it;
    if (!on_stage(op, Phase::forward) || !op.output || !needed.count(*op.output)) continue;
    switch (op.kind) {
      case OpKind::input:
      case OpKind::parameter:
      case OpKind::state:
      case OpKind::constant:
      case OpKind::random_mask:
        continue;
      default:
        break;
    }
    bool reads_updated_state = false;
    for (models::ValueId v : op.inputs) reads_updated_state |= updated_state.count(v) > 0;
    if (reads_updated_state) continue;
    out.insert(&op);
    needed.insert(op.inputs.begin(), op.inputs.end());
  }
  return out;
}

bool is_update(OpKind kind) {
  return kind == OpKind::adam_step || kind == OpKind::sgd_momentum_step ||
         kind == OpKind::lamb_step;
}

// The ops that make float16 results under --precision fp16 (every float input cast to
// float16), and those that also read float16 but make float32 (bias gradients, summed in
// float32); reshapes and stop_gradient are views of their input.
bool makes_float16(OpKind kind) {
  return kind == OpKind::matmul || kind == OpKind::add || kind == OpKind::add_bias ||
         kind == OpKind::relu || kind == OpKind::relu_grad || kind == OpKind::conv2d ||
         kind == OpKind::conv2d_grad_input || kind == OpKind::conv2d_grad_weight;
}
bool reads_float16(OpKind kind) {
  return makes_float16(kind) || kind == OpKind::column_sum;
}

class Lowering {
 public:
  Lowering(CompiledModel& out, bool float16) : out_(out), float16_(float16) {}

  // The model whose ops are lowered next; parameters, state and host inputs are shared by name
  // with the models lowered before (the evaluation model uses the training model's weights).
  void set_model(const models::Model& model, bool owns_variables) {
    model_ = &model;
    owns_variables_ = owns_variables;
    tensors_.clear();
    casts_.clear();
  }
  // Whether a later phase may read the casts an earlier one made: not when the pipeline
  // stashes activations, as it stashes values, not their casts.
  void share_casts_between_phases(bool share) { share_casts_ = share; }
  // Lowers every op of the phase that belongs to `stage` into prog, in graph order: values
  // from other stages are received just before their first use here, values other stages
  // use are sent as soon as they are made.
  // The ops in `recomputed` are also added to *recompute (without their transfers): the same
  // programs on the same tensors, run again before the backward pass.
  void lower_phase(Phase phase, ipu::Program& prog, int stage, const Transfers& transfers,
                   const std::set<const models::Op*>& recomputed = {},
                   ipu::Program* recompute = nullptr) {
    if (!share_casts_) casts_.clear();
    for (const auto& op : model_->graph.ops()) {
      if (op.phase != phase || op.kind == OpKind::sgd_step || op.pipeline_stage != stage) continue;
      for (models::ValueId v : op.inputs) {
        if (tensors_.count(v)) continue;
        const models::Op& producer = model_->graph.producer(v);
        if (producer.kind == OpKind::constant)
          lower(producer, prog);  // every stage makes its own constants
        else
          receive(v, stage, transfers, prog);
      }
      if (recompute && recomputed.count(&op)) {
        // Its casts go into the piece (made anew when it runs again), none shared with others.
        casts_.clear();
        ipu::Program piece;
        lower(op, piece);
        casts_.clear();
        prog.add(piece);
        recompute->add(piece);
      } else {
        lower(op, prog);
      }
      if (op.output) send(*op.output, stage, transfers, prog);
    }
  }
  // The receive of a value this stage gets from another one.
  void receive(models::ValueId v, int stage, const Transfers& transfers, ipu::Program& prog) {
    for (const auto& t : transfers)
      if (t.value == v && t.to == stage) {
        const auto& info = model_->graph.info(v);
        ipu::Graph& g = *out_.graph;
        ipu::Tensor buf =
            g.add_variable(value_dtype(v), info.shape, model_->graph.value(v).name + "/received");
        g.map_linearly(buf, std::max<std::size_t>(1, info.elements() / g.tiles()));
        prog.add(ipu::Program::receive(buf, static_cast<unsigned>(t.from), t.tag));
        ++out_.transfers;
        tensors_.emplace(v, buf);
        return;
      }
    throw std::logic_error("pod compiler: stage " + std::to_string(stage) + " needs '" +
                           model_->graph.value(v).name + "', which no transfer brings");
  }
  void send(models::ValueId v, int stage, const Transfers& transfers, ipu::Program& prog) {
    for (const auto& t : transfers)
      if (t.value == v && t.from == stage) {
        prog.add(ipu::Program::send(tensor(v), static_cast<unsigned>(t.to), t.tag));
        ++out_.transfers;
      }
  }
  bool has(models::ValueId v) const { return tensors_.count(v) > 0; }
  // The updates read the gradients bound below times this (the mean over the micro-batches).
  void set_gradient_scale(double scale) { gradient_scale_ = scale; }
  // Replicated tensor sharding: the update of `param` changes elements [begin, end) only, its
  // optimizer state holds just those, and the updates of parameters not listed are skipped.
  void shard(models::ValueId param, std::size_t begin, std::size_t end) {
    shards_[param] = {begin, end};
  }
  void set_sharded(bool sharded) { sharded_ = sharded; }
  // ... and times this scalar of the step (clipping), if set.
  void set_gradient_factor(const ipu::Tensor& factor) { gradient_factor_ = factor; }
  // Makes `v` stand for `t` from here on (the optimizer reads the accumulated gradients).
  void bind(models::ValueId v, const ipu::Tensor& t) { tensors_.insert_or_assign(v, t); }
  // Lowers the optimizer phase of `stage` (besides the plain sgd_steps, which the compiler
  // fuses with gradient accumulation): the updates of this stage's parameters, and the step
  // counter and learning rate they read, which every stage keeps for itself.
  void lower_optimizer(int stage, ipu::Program& prog) {
    stage_ = stage;
    bool updates = false;
    for (const auto& op : model_->graph.ops())
      updates = updates ||
                (op.phase == Phase::optimizer && op.pipeline_stage == stage && is_update(op.kind));
    if (!updates) return;
    for (const auto& op : model_->graph.ops()) {
      // Clipping is lowered with the gradient accumulators (it spans the stages).
      if (op.phase != Phase::optimizer || op.kind == OpKind::sgd_step ||
          op.kind == OpKind::global_norm || op.kind == OpKind::clip_factor)
        continue;
      if (op.pipeline_stage != stage && op.kind != OpKind::increment) continue;
      if (sharded_) {  // no update of a parameter without a shard here, nor its state
        const models::Op* update =
            is_update(op.kind) ? &op : (op.output ? update_of_state(*op.output) : nullptr);
        if (update && !shards_.count(update->inputs[0])) continue;
      }
      if (op.output && has(*op.output)) continue;
      lower_with_inputs(op, prog);
    }
  }
  std::vector<models::ValueId> lowered() const {
    std::vector<models::ValueId> ids;
    for (const auto& [id, t] : tensors_) ids.push_back(id);
    return ids;
  }
  const ipu::Tensor& tensor(models::ValueId id) const {
    auto it = tensors_.find(id);
    if (it == tensors_.end())
      throw std::logic_error("pod compiler: value '" + model_->graph.value(id).name +
                             "' was used before it was lowered");
    return it->second;
  }

 private:
  // What identifies the step coefficients an update reads: its kind, rate, step and betas.
  static std::string coefficients_key(const models::Op& update) {
    if (update.kind == OpKind::sgd_momentum_step)
      return "momentum/" + std::to_string(update.inputs[3]);
    return std::string(models::op_name(update.kind)) + "/" + std::to_string(update.inputs[4]) +
           "/" + std::to_string(update.inputs[5]) + "/" + std::to_string(update.r("beta1")) + "/" +
           std::to_string(update.r("beta2"));
  }
  // The coefficients `update` reads (rate, bias corrections), made once per step and copied by
  // one exchange onto the tiles of every parameter of this stage whose update reads the same.
  const ipu::ops::TileCopies& step_coefficients(const models::Op& update, ipu::Program& prog) {
    const std::string key = coefficients_key(update);
    if (auto it = step_coefficients_.find(key); it != step_coefficients_.end()) return it->second;
    std::vector<ipu::Tensor> params;
    for (const auto& op : model_->graph.ops())
      if (op.phase == Phase::optimizer && op.pipeline_stage == stage_ && op.kind == update.kind &&
          coefficients_key(op) == key)
        params.push_back(tensor(op.inputs[0]));
    namespace ops = ipu::ops;
    ipu::Graph& g = *out_.graph;
    const bool momentum = update.kind == OpKind::sgd_momentum_step;
    const ops::UpdateKind kind = momentum                           ? ops::UpdateKind::sgd_momentum
                                 : update.kind == OpKind::lamb_step ? ops::UpdateKind::lamb
                                                                    : ops::UpdateKind::adam;
    std::optional<ipu::Tensor> step;
    if (!momentum) step = tensor(update.inputs[5]);
    const ipu::Tensor values = ops::step_coefficients(
        g, prog, kind, tensor(update.inputs[momentum ? 3 : 4]), step, gradient_factor_,
        momentum ? 0.0 : update.r("beta1"), momentum ? 0.0 : update.r("beta2"),
        "optimizer/coefficients" + std::to_string(step_coefficients_.size()));
    return step_coefficients_
        .emplace(key, ops::copy_to_tiles(g, prog, values, params,
                                         "optimizer/coefficients" +
                                             std::to_string(step_coefficients_.size()) + "/copies"))
        .first->second;
  }

  // Every LAMB update of this stage that reads the same coefficients, at once (the first of them
  // lowers them all): their trust ratios take a reduction and a broadcast each, done together.
  void lamb_updates(const models::Op& first, ipu::Program& prog) {
    if (lamb_done_.count(&first)) return;
    std::vector<ipu::ops::LambTensors> params;
    for (const auto& op : model_->graph.ops())
      if (op.phase == Phase::optimizer && op.pipeline_stage == stage_ &&
          op.kind == OpKind::lamb_step && coefficients_key(op) == coefficients_key(first)) {
        if (op.r("eps") != first.r("eps") || op.r("weight_decay") != first.r("weight_decay"))
          throw std::logic_error("pod compiler: LAMB updates '" + first.name + "' and '" + op.name +
                                 "' differ in eps or weight decay");
        lower_inputs(op, prog);
        params.push_back({tensor(op.inputs[0]), tensor(op.inputs[1]), tensor(op.inputs[2]),
                          tensor(op.inputs[3])});
        lamb_done_.insert(&op);
      }
    ipu::ops::lamb_update(*out_.graph, prog, params, step_coefficients(first, prog),
                          {.beta1 = first.r("beta1"),
                           .beta2 = first.r("beta2"),
                           .eps = first.r("eps"),
                           .weight_decay = first.r("weight_decay"),
                           .grad_scale = gradient_scale_},
                          "optimizer/lamb" + std::to_string(lamb_done_.size()));
  }

  // The elements of the parameter `update` changes: all of them, or its shard.
  ipu::Tensor updated(const models::Op& update) const {
    const ipu::Tensor& param = tensor(update.inputs[0]);
    const auto it = shards_.find(update.inputs[0]);
    if (it == shards_.end()) return param;
    return param.flatten().slice(it->second.first, it->second.second);
  }
  // A stateful update's state (moments, velocity) when sharded: laid out like the parameter's
  // shard, zero at start (the optimizers' state starts at zero), not checkpointed.
  std::optional<ipu::Tensor> sharded_state(models::ValueId state) {
    const models::Op* update = update_of_state(state);
    if (!sharded_ || !update || !shards_.count(update->inputs[0])) return std::nullopt;
    ipu::Tensor t =
        ipu::ops::clone_like(*out_.graph, updated(*update), model_->graph.value(state).name,
                             ipu::MemoryCategory::optimizer_state);
    out_.constants.emplace_back(t, 0.0f);
    return t;
  }
  // The stateful update whose per-element state (moments, velocity) `value` is, if any.
  const models::Op* update_of_state(models::ValueId value) const {
    if (model_->graph.producer(value).kind != OpKind::state) return nullptr;
    // (param, grad, velocity, rate) or (param, grad, m, v, rate, step): the step is shared.
    for (const auto& op : model_->graph.ops())
      if (is_update(op.kind) && (op.inputs[2] == value ||
                                 (op.kind != OpKind::sgd_momentum_step && op.inputs[3] == value)))
        return &op;
    return nullptr;
  }

  // A parameter, state or input variable, created by the first model that names it.
  ipu::Tensor shared_variable(const models::Op& op, const models::TensorInfo& info,
                              ipu::MemoryCategory category) {
    const std::string& name = model_->graph.value(*op.output).name;
    if (auto it = shared_.find(name); it != shared_.end()) {
      if (it->second.shape() != info.shape)
        throw std::logic_error("pod compiler: '" + name + "' differs in shape between models");
      return it->second;
    }
    if (!owns_variables_)
      throw std::invalid_argument("pod compiler: the evaluation model's '" + name +
                                  "' has no counterpart in the training model");
    ipu::Graph& g = *out_.graph;
    ipu::Tensor t = g.add_variable(value_dtype(*op.output), info.shape, name, category);
    // Host inputs too are spread over every tile, not a sample per tile: a micro-batch of one
    // 224x224 image would otherwise sit on one tile (with each of its stash copies).
    g.map_linearly(t);
    shared_.emplace(name, t);
    return t;
  }

  // Lowers op after whatever of its inputs is not lowered yet (optimizer-phase values only).
  void lower_with_inputs(const models::Op& op, ipu::Program& prog) {
    lower_inputs(op, prog);
    lower(op, prog);
  }
  void lower_inputs(const models::Op& op, ipu::Program& prog) {
    for (models::ValueId v : op.inputs) {
      if (has(v)) continue;
      const models::Op& producer = model_->graph.producer(v);
      if (producer.phase != Phase::optimizer && producer.kind != OpKind::constant)
        throw std::logic_error("pod compiler: optimizer op '" + op.name + "' reads '" +
                               model_->graph.value(v).name + "', which is not lowered here");
      lower_with_inputs(producer, prog);
    }
  }

  // The type a value has on the device, from the graph alone, so that every stage agrees.
  ipu::DType value_dtype(models::ValueId v) const {
    const ipu::DType natural = device_dtype(model_->graph.info(v).dtype);
    if (!float16_ || natural != ipu::DType::f32) return natural;
    const models::Op& producer = model_->graph.producer(v);
    if (producer.kind == OpKind::reshape || producer.kind == OpKind::stop_gradient)
      return value_dtype(producer.inputs[0]);
    const bool half = producer.kind == OpKind::parameter || makes_float16(producer.kind);
    return half ? ipu::DType::f16 : ipu::DType::f32;
  }

  // Input k of op as the op computes on it: under --precision fp16, cast (once, or once per
  // phase, see share_casts_between_phases) to float16 for the ops that read float16, to
  // float32 for the others (the state that in-place updates change is float32 already). Views
  // and the optimizer phase see the tensors themselves.
  const ipu::Tensor& operand(const models::Op& op, std::size_t k, ipu::Program& prog) {
    const models::ValueId v = op.inputs[k];
    const ipu::Tensor& t = tensor(v);
    const bool float_type = t.dtype() == ipu::DType::f32 || t.dtype() == ipu::DType::f16;
    if (!float16_ || !float_type || op.phase == Phase::optimizer || op.kind == OpKind::reshape ||
        op.kind == OpKind::stop_gradient)
      return t;
    const ipu::DType want = reads_float16(op.kind) ? ipu::DType::f16 : ipu::DType::f32;
    if (t.dtype() == want) return t;
    if (auto it = casts_.find({v, want}); it != casts_.end()) return it->second;
    const std::string name = model_->graph.value(v).name + "/" + ipu::dtype_name(want);
    return casts_
        .emplace(std::pair{v, want},
                 ipu::ops::cast(*out_.graph, prog, t, want, ipu::Rounding::nearest_even, 0, name))
        .first->second;
  }

  void lower(const models::Op& op, ipu::Program& prog) {
    namespace ops = ipu::ops;
    ipu::Graph& g = *out_.graph;
    const auto in = [&](std::size_t k) -> const ipu::Tensor& { return operand(op, k, prog); };
    ipu::Tensor result;
    const auto& info = op.output ? model_->graph.info(*op.output) : models::TensorInfo{};
    const std::string& name = op.name;
    switch (op.kind) {
      case OpKind::input:
        result = shared_variable(op, info, ipu::MemoryCategory::stream);
        break;
      case OpKind::parameter:
      case OpKind::state: {
        if (const auto sharded = sharded_state(*op.output)) {
          tensors_.emplace(*op.output, *sharded);  // its shard's shape, not the IR's
          return;
        }
        const bool fresh = !shared_.count(model_->graph.value(*op.output).name);
        result = shared_variable(op, info,
                                 update_of_state(*op.output) ? ipu::MemoryCategory::optimizer_state
                                                             : ipu::MemoryCategory::weight);
        if (fresh) {
          if (op.kind == OpKind::parameter) out_.parameters.emplace(*op.output, result);
          out_.initial_values.emplace_back(*op.output, result);
          out_.checkpointed.emplace_back(model_->graph.value(*op.output).name, result);
        }
        break;
      }
      case OpKind::constant:
        result = g.add_variable(ipu::DType::f32, info.shape, name, ipu::MemoryCategory::weight);
        g.map_linearly(result);
        out_.constants.emplace_back(result, static_cast<float>(op.scalar));
        break;
      case OpKind::reshape:
        result = in(0).reshape(info.shape);
        break;
      case OpKind::stop_gradient:
        result = in(0);
        break;
      case OpKind::matmul:
        result = ops::matmul(g, prog, in(0), in(1), op.transpose_a, op.transpose_b, name);
        break;
      case OpKind::batch_matmul:
        result = batch_matmul(op, prog, info);
        break;
      case OpKind::add:
        result = ops::add(g, prog, in(0), in(1), name);
        break;
      case OpKind::add_bias:
        result = ops::add_bias(g, prog, in(0), in(1), name);
        break;
      case OpKind::relu:
        result = ops::relu(g, prog, in(0), name);
        break;
      case OpKind::relu_grad:
        result = ops::relu_grad(g, prog, in(0), in(1), name);
        break;
      case OpKind::column_sum:
        result = ops::column_sum(g, prog, in(0), name);
        break;
      case OpKind::softmax_cross_entropy:
        result = ops::softmax_cross_entropy(g, prog, in(0), in(1), name);
        break;
      case OpKind::softmax_cross_entropy_grad:
        result = ops::softmax_cross_entropy_grad(g, prog, in(0), in(1), in(2), name);
        break;
      case OpKind::unary:
        result = ops::unary(g, prog, unary_op(op), in(0), static_cast<float>(op.r("alpha")), name);
        break;
      case OpKind::unary_grad:
        result = ops::unary_grad(g, prog, unary_op(op), in(0), in(1),
                                 static_cast<float>(op.r("alpha")), name);
        break;
      case OpKind::binary:
        result = ops::binary(g, prog, binary_op(op), in(0), in(1), name);
        break;
      case OpKind::reduce_sum:
        result = ops::reduce_sum(g, prog, in(0), sizes(op.list("axes")), op.i("keepdims") != 0,
                                 static_cast<float>(op.r("scale")), name);
        break;
      case OpKind::broadcast_to:
        result =
            ops::broadcast_to(g, prog, in(0), info.shape, static_cast<float>(op.r("scale")), name);
        break;
      case OpKind::permute:
        result = ops::permute(g, prog, in(0), sizes(op.list("perm")), name);
        break;
      case OpKind::slice:
        result = ops::slice(g, prog, in(0), static_cast<std::size_t>(op.i("axis")),
                            static_cast<std::size_t>(op.i("begin")),
                            static_cast<std::size_t>(op.i("end")), name);
        break;
      case OpKind::slice_grad:
        result = ops::slice_grad(g, prog, in(0), info.shape, static_cast<std::size_t>(op.i("axis")),
                                 static_cast<std::size_t>(op.i("begin")),
                                 static_cast<std::size_t>(op.i("end")), name);
        break;
      case OpKind::concat: {
        std::vector<ipu::Tensor> xs;
        for (std::size_t k = 0; k < op.inputs.size(); ++k) xs.push_back(in(k));
        result = ops::concat(g, prog, xs, static_cast<std::size_t>(op.i("axis")), name);
        break;
      }
      case OpKind::softmax:
        result = ops::softmax(g, prog, in(0), name);
        break;
      case OpKind::softmax_grad:
        result = ops::softmax_grad(g, prog, in(0), in(1), name);
        break;
      case OpKind::conv2d:
        result = ops::conv2d(g, prog, in(0), in(1), conv_params(op), name);
        break;
      case OpKind::conv2d_grad_input:
        result = ops::conv2d_grad_input(g, prog, in(0), in(1), info.shape, conv_params(op), name);
        break;
      case OpKind::conv2d_grad_weight:
        result = ops::conv2d_grad_weight(g, prog, in(0), in(1), info.shape, conv_params(op), name);
        break;
      case OpKind::conv_transpose2d:
        result = ops::conv_transpose2d(g, prog, in(0), in(1), conv_params(op), name);
        break;
      case OpKind::max_pool2d:
        result = ops::max_pool2d(g, prog, in(0), pool_params(op), name);
        break;
      case OpKind::max_pool2d_grad:
        result = ops::max_pool2d_grad(g, prog, in(0), in(1), pool_params(op), name);
        break;
      case OpKind::avg_pool2d:
        result = ops::avg_pool2d(g, prog, in(0), pool_params(op), name);
        break;
      case OpKind::avg_pool2d_grad:
        result = ops::avg_pool2d_grad(g, prog, in(0), info.shape, pool_params(op), name);
        break;
      case OpKind::normalize:
        result = ops::normalize(g, prog, in(0), norm_params(op), name);
        break;
      case OpKind::normalize_grad:
        result = ops::normalize_grad(g, prog, in(0), in(1), norm_params(op), name);
        break;
      case OpKind::batch_norm_inference:
        result = ops::batch_norm_inference(g, prog, in(0), in(1), in(2), op.r("eps"), name);
        break;
      case OpKind::batch_norm_stats_update:
        ops::batch_norm_stats_update(g, prog, in(0), in(1), in(2), op.r("momentum"), name);
        return;
      case OpKind::random_mask:
        result = ops::random_mask(g, prog, info.shape, op.r("p"),
                                  static_cast<std::uint64_t>(op.i("seed")), name);
        break;
      case OpKind::sgd_step:
        throw std::logic_error("sgd_step is lowered by the optimizer phase");
      case OpKind::gather_rows:
        result = ops::gather_rows(g, prog, in(0), in(1), name);
        break;
      case OpKind::scatter_add_rows:
        result = ops::scatter_add_rows(g, prog, in(0), in(1),
                                       static_cast<std::size_t>(op.i("rows")), name);
        break;
      case OpKind::vq_nearest:
        result = ops::vq_nearest(g, prog, in(0), in(1), name);
        break;
      case OpKind::vq_ema_update:
        ops::vq_ema_update(g, prog, in(0), in(1), in(2), in(3), in(4), op.r("decay"), op.r("eps"),
                           name);
        return;
      case OpKind::increment:
        ops::increment(g, prog, in(0), name);
        return;
      case OpKind::lr_schedule: {
        ops::LrSchedule schedule;
        schedule.kind = static_cast<ops::LrSchedule::Kind>(op.i("schedule"));
        schedule.base_lr = op.r("base_lr");
        schedule.warmup_steps = static_cast<std::size_t>(op.i("warmup_steps"));
        schedule.total_steps = static_cast<std::size_t>(op.i("total_steps"));
        schedule.step_size = static_cast<std::size_t>(op.i("step_size"));
        schedule.gamma = op.r("gamma");
        schedule.min_lr = op.r("min_lr");
        result = ops::lr_schedule(g, prog, in(0), schedule, name);
        break;
      }
      case OpKind::sgd_momentum_step:
        ops::sgd_momentum_update(g, prog, updated(op), in(1), in(2), step_coefficients(op, prog),
                                 {.momentum = op.r("momentum"),
                                  .weight_decay = op.r("weight_decay"),
                                  .nesterov = op.i("nesterov") != 0,
                                  .grad_scale = gradient_scale_},
                                 name);
        return;
      case OpKind::adam_step:
        ops::adam_update(g, prog, updated(op), in(1), in(2), in(3), step_coefficients(op, prog),
                         {.beta1 = op.r("beta1"),
                          .beta2 = op.r("beta2"),
                          .eps = op.r("eps"),
                          .weight_decay = op.r("weight_decay"),
                          .decoupled = op.i("decoupled") != 0,
                          .grad_scale = gradient_scale_},
                         name);
        return;
      case OpKind::lamb_step:
        lamb_updates(op, prog);
        return;
      case OpKind::global_norm:
      case OpKind::clip_factor:
        throw std::logic_error(std::string("op ") + models::op_name(op.kind) + " ('" + name +
                               "') is lowered with the gradient accumulators, not on its own");
    }
    if (result.shape() != info.shape) {
      if (result.elements() != info.elements())
        throw std::logic_error("pod compiler: op '" + name + "' lowered to " +
                               std::to_string(result.elements()) + " elements, the IR has " +
                               info.str());
      result = result.reshape(info.shape);
    }
    if (result.dtype() != value_dtype(*op.output))
      throw std::logic_error("pod compiler: op '" + name + "' lowered to " +
                             ipu::dtype_name(result.dtype()) + ", the precision plan says " +
                             ipu::dtype_name(value_dtype(*op.output)));
    tensors_.emplace(*op.output, result);
  }

  // [..., m, k] x [..., k, n]: one matmul per leading index, joined along a new first axis.
  ipu::Tensor batch_matmul(const models::Op& op, ipu::Program& prog,
                           const models::TensorInfo& info) {
    ipu::Graph& g = *out_.graph;
    const ipu::Tensor &a = tensor(op.inputs[0]), &b = tensor(op.inputs[1]);
    const std::size_t rank = a.rank();
    std::size_t batch = 1;
    for (std::size_t d = 0; d + 2 < rank; ++d) batch *= a.dim(d);
    const ipu::Tensor a3 = a.reshape({batch, a.dim(rank - 2), a.dim(rank - 1)});
    const ipu::Tensor b3 = b.reshape({batch, b.dim(rank - 2), b.dim(rank - 1)});
    std::vector<ipu::Tensor> parts;
    for (std::size_t i = 0; i < batch; ++i) {
      ipu::Tensor c = ipu::ops::matmul(g, prog, a3.row(i), b3.row(i), op.transpose_a,
                                       op.transpose_b, op.name + "/" + std::to_string(i));
      parts.push_back(c.reshape({1, c.dim(0), c.dim(1)}));
    }
    ipu::Tensor joined =
        batch == 1 ? parts[0] : ipu::ops::concat(g, prog, parts, 0, op.name + "/join");
    return joined.reshape(info.shape);
  }

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
};

}  // namespace

CompiledModel compile_for_ipu(const models::Model& model, const ipu::ArchPreset& arch,
                              const StepShape& shape, const models::Model* eval_model) {
  const int stages = static_cast<int>(shape.stages), stage = static_cast<int>(shape.stage);
  if (stages > 1 && model.graph.max_stage() + 1 != stages)
    throw std::invalid_argument("model '" + model.name + "' is split into " +
                                std::to_string(model.graph.max_stage() + 1) +
                                " pipeline stages, the pod runs " + std::to_string(stages));
  CompiledModel out;
  out.graph = std::make_unique<ipu::Graph>(arch);
  out.graph->set_available_memory_proportion(shape.available_memory_proportion);
  ipu::Graph& g = *out.graph;
  Lowering lowering(out, shape.float16);
  lowering.set_model(model, true);
  lowering.share_casts_between_phases(stages == 1 || !shape.grouped);
  const Transfers transfers = plan_transfers(model, {model.loss}, 0);

  ipu::Program forward, backward, recompute;
  // Only a stage whose activations wait in a stash (grouped pipeline, not the last stage)
  // recomputes; it then stashes only what the recomputation cannot make again.
  const bool recomputing = shape.recompute && shape.grouped && stages > 1 && stage < stages - 1;
  const std::set<const models::Op*> recomputed =
      recomputing ? recomputed_ops(model.graph, stage) : std::set<const models::Op*>{};
  lowering.lower_phase(Phase::forward, forward, stage, transfers, recomputed,
                       recomputing ? &recompute : nullptr);
  const std::vector<models::ValueId> forward_values = lowering.lowered();
  lowering.lower_phase(Phase::backward, backward, stage, transfers);
  const bool host_side = stage == 0;
  if (host_side) {
    out.input = lowering.tensor(model.input);
    out.labels = lowering.tensor(model.labels);
    if (!lowering.has(model.loss)) lowering.receive(model.loss, 0, transfers, backward);
    out.loss = lowering.tensor(model.loss);
    if (lowering.has(model.logits)) out.logits = lowering.tensor(model.logits);
  }

  // Gradient accumulators, laid out like their parameters (the optimizer works in place).
  ipu::Program zero_accumulators, accumulate, optimizer;
  std::vector<ipu::Tensor> accumulators;
  // Stateful optimizers read the mean accumulated gradient in place of the last micro-batch's.
  std::vector<std::pair<models::ValueId, ipu::Tensor>> mean_gradients;
  std::vector<ipu::Tensor> updated_accumulators;  // theirs, once each
  std::vector<const models::Op*> updates;         // the stateful updates of this stage
  // The sum of a parameter's gradients over the step's micro-batches, zeroed at its start.
  const auto accumulator = [&](models::ValueId param_id, models::ValueId grad_id) {
    const std::string name = model.graph.value(param_id).name;
    ipu::Tensor acc = ipu::ops::clone_like(g, out.parameters.at(param_id), name + "/accumulator",
                                           ipu::MemoryCategory::optimizer_state, ipu::DType::f32);
    accumulators.push_back(acc);
    ipu::ops::zero(g, zero_accumulators, acc, name + "/zero");
    ipu::ops::scaled_add_in_place(g, accumulate, acc, lowering.tensor(grad_id), 1.0f,
                                  name + "/accumulate");
    return acc;
  };
  for (const auto& op : model.graph.ops()) {
    if (is_update(op.kind) && op.pipeline_stage == stage) {
      // The gradient, or the gradient times the step's factor (clipping), which the update
      // applies itself: both stand for the accumulator.
      models::ValueId grad_id = op.inputs[1];
      const models::Op& producer = model.graph.producer(grad_id);
      if (producer.phase == Phase::optimizer) {
        if (producer.kind != OpKind::binary ||
            static_cast<models::BinaryFn>(producer.i("fn")) != models::BinaryFn::mul ||
            model.graph.producer(producer.inputs[1]).kind != OpKind::clip_factor)
          throw std::invalid_argument("optimizer op '" + op.name + "' updates with '" +
                                      producer.name +
                                      "', which is neither a gradient nor one times the clip "
                                      "factor; the IPU lowers only those");
        grad_id = producer.inputs[0];
      }
      const ipu::Tensor acc = accumulator(op.inputs[0], grad_id);
      mean_gradients.emplace_back(grad_id, acc);
      if (op.inputs[1] != grad_id) mean_gradients.emplace_back(op.inputs[1], acc);
      updated_accumulators.push_back(acc);
      updates.push_back(&op);
      continue;
    }
    if (op.kind != OpKind::sgd_step || op.pipeline_stage != stage) continue;
    const ipu::Tensor& param = out.parameters.at(op.inputs[0]);
    const ipu::Tensor acc = accumulator(op.inputs[0], op.inputs[1]);
    const std::string name = model.graph.value(op.inputs[0]).name;
    // Mean over the accumulated micro-batches; the all-reduce already averaged the replicas.
    const float factor =
        -static_cast<float>(op.scalar / static_cast<double>(shape.gradient_accumulation));
    ipu::ops::scaled_add_in_place(g, optimizer, param, acc, factor, name + "/sgd");
  }

  ipu::Program forward_mb, backward_mb = ipu::Program::sequence({backward, accumulate});
  // The loss goes to the host right after it is made (a local loss would be overwritten by
  // later forward passes before this micro-batch's backward pass in the grouped schedule),
  // or after the backward pass once the last stage's copy has arrived.
  const bool local_loss = stage_of(model.graph, model.loss) == stage;
  if (host_side) {
    forward_mb.add(ipu::Program::stream_to_device(kInputStream, out.input));
    forward_mb.add(ipu::Program::stream_to_device(kLabelStream, out.labels));
  }
  forward_mb.add(forward);
  // The host reads float32.
  const auto for_host = [&](ipu::Program& prog, const ipu::Tensor& t, const std::string& name) {
    return ipu::ops::cast(g, prog, t, ipu::DType::f32, ipu::Rounding::nearest_even, 0,
                          name + "/float32");
  };
  const ipu::Tensor device_loss = out.loss;  // what the training forward pass makes
  if (host_side) {
    ipu::Program& loss_program = local_loss ? forward_mb : backward_mb;
    out.loss = for_host(loss_program, out.loss, "loss");
    loss_program.add(ipu::Program::stream_from_device(kLossStream, out.loss));
  }
  const std::size_t k = shape.gradient_accumulation;
  ipu::Program step = ipu::Program::sequence({zero_accumulators});
  if (stages == 1) {
    step.add(ipu::Program::repeat(k, ipu::Program::sequence({forward_mb, backward_mb})));
  } else if (!shape.grouped) {
    // Sequential (sharded) execution: one micro-batch at a time, stage after stage forward and
    // back; a sync after each stage's turn keeps every IPU's clock on the serial timeline.
    ipu::Program micro_batch;
    for (int slot = 0; slot < 2 * stages; ++slot) {
      if (slot == stage) micro_batch.add(forward_mb);
      if (slot == 2 * stages - 1 - stage) micro_batch.add(backward_mb);
      micro_batch.add(ipu::Program::sync(ipu::SyncKind::external));
    }
    step.add(ipu::Program::repeat(k, micro_batch));
  } else {
    // Grouped pipeline: in slot t this stage runs the forward pass of micro-batch t - stage and
    // the backward pass of micro-batch t - (2 (stages - 1) - stage); every slot ends with a
    // sync across the replica's IPUs. Activations wait in a ring of stash slots in between.
    if (k < shape.stages)
      throw std::invalid_argument("the grouped pipeline needs gradient accumulation >= stages");
    const std::size_t depth = 2 * (shape.stages - 1 - shape.stage) + 1;
    out.stash_slots = depth;
    std::vector<std::vector<std::pair<ipu::Tensor, ipu::Tensor>>> stash(depth);
    if (depth > 1) {
      // What the backward pass (and the recomputation, which re-makes its own outputs) reads.
      std::set<models::ValueId> used_backward;
      for (const auto& op : model.graph.ops())
        if (op.phase == Phase::backward && op.pipeline_stage == stage)
          used_backward.insert(op.inputs.begin(), op.inputs.end());
      for (const models::Op* op : recomputed)
        used_backward.insert(op->inputs.begin(), op->inputs.end());
      for (models::ValueId v : forward_values) {
        const models::Op& producer = model.graph.producer(v);
        const auto kind = producer.kind;
        if (!used_backward.count(v) || kind == OpKind::parameter || kind == OpKind::state ||
            kind == OpKind::constant || recomputed.count(&producer))
          continue;
        const ipu::Tensor& t = lowering.tensor(v);
        for (std::size_t slot = 0; slot < depth; ++slot)
          stash[slot].emplace_back(
              t, ipu::ops::clone_like(g, t,
                                      model.graph.value(v).name + "/stash" + std::to_string(slot),
                                      ipu::MemoryCategory::activation, t.dtype()));
      }
    }
    const auto stash_copy = [&](std::size_t slot, bool out_of_stash) {
      std::vector<std::pair<ipu::Tensor, ipu::Tensor>> pairs;
      for (const auto& [work, kept] : stash[slot])
        pairs.emplace_back(out_of_stash ? kept : work, out_of_stash ? work : kept);
      return pairs.empty() ? ipu::Program() : ipu::Program::copy(std::move(pairs));
    };
    const long long slots = static_cast<long long>(k + 2 * (shape.stages - 1));
    const long long kk = static_cast<long long>(k);
    for (long long t = 0; t < slots; ++t) {
      const long long f = t - stage, b = t - (2 * (stages - 1) - stage);
      ipu::Program slot;
      if (f >= 0 && f < kk) {
        slot.add(forward_mb);
        if (depth > 1) slot.add(stash_copy(static_cast<std::size_t>(f) % depth, false));
      }
      if (b >= 0 && b < kk) {
        if (depth > 1) slot.add(stash_copy(static_cast<std::size_t>(b) % depth, true));
        if (recomputing) slot.add(recompute);
        slot.add(backward_mb);
      }
      slot.add(ipu::Program::sync(ipu::SyncKind::external));
      step.add(slot);
    }
  }
  // Replicated tensor sharding: the stateful updates' accumulators, end to end, form one buffer
  // of which this replica keeps block `replica` of the reduction; each parameter's part of that
  // block is its shard (possibly none), updated here and gathered back from every replica after.
  const bool sharding = shape.replicated_tensor_sharding && shape.replicas > 1;
  std::vector<ipu::Tensor> gradient_blocks, weight_blocks, sharded_weights;
  if (sharding) {
    for (const auto& op : model.graph.ops())
      if (op.kind == OpKind::lamb_step || op.kind == OpKind::global_norm)
        throw std::invalid_argument(
            "replicated tensor sharding does not support " +
            std::string(op.kind == OpKind::lamb_step ? "LAMB" : "gradient clipping") +
            " yet (their norms would span the replicas' shards); use adam, adamw or "
            "sgd_momentum without --clip-norm, or drop --replicated-tensor-sharding");
    std::size_t total = 0;
    for (const ipu::Tensor& acc : updated_accumulators) total += acc.elements();
    const auto block = fabric::ring_chunk(total, static_cast<int>(shape.replicas),
                                          static_cast<int>(shape.replica));
    std::size_t offset = 0;
    lowering.set_sharded(true);
    for (std::size_t j = 0; j < updates.size(); ++j) {
      const ipu::Tensor& acc = updated_accumulators[j];
      const std::size_t lo = std::max(block.begin, offset),
                        hi = std::min(block.end, offset + acc.elements());
      const models::ValueId param_id = updates[j]->inputs[0];
      sharded_weights.push_back(out.parameters.at(param_id).flatten());
      if (lo < hi) {
        const ipu::Tensor weights = sharded_weights.back().slice(lo - offset, hi - offset);
        // The block lands in the accumulator's own elements (the collective reads all of its
        // input before it writes the block): no buffer for it.
        const ipu::Tensor gradient = acc.flatten().slice(lo - offset, hi - offset);
        lowering.shard(param_id, lo - offset, hi - offset);
        for (auto& [grad_id, bound] : mean_gradients)
          if (bound.variable() == acc.variable()) bound = gradient;
        gradient_blocks.push_back(gradient);
        weight_blocks.push_back(weights);
      }
      offset += acc.elements();
    }
    std::vector<ipu::Tensor> flat;
    for (const ipu::Tensor& acc : updated_accumulators) flat.push_back(acc.flatten());
    if (!flat.empty())
      step.add(ipu::Program::reduce_scatter(flat, gradient_blocks, ipu::CollectiveOp::mean));
    std::vector<ipu::Tensor> rest;  // plain SGD's, which keeps no state
    for (const ipu::Tensor& acc : accumulators)
      if (std::none_of(updated_accumulators.begin(), updated_accumulators.end(),
                       [&](const ipu::Tensor& u) { return u.variable() == acc.variable(); }))
        rest.push_back(acc);
    if (!rest.empty()) step.add(ipu::Program::all_reduce(rest, ipu::CollectiveOp::mean));
  } else if (shape.replicas > 1 && !accumulators.empty()) {
    step.add(ipu::Program::all_reduce(accumulators, ipu::CollectiveOp::mean));
  }
  // The stateful optimizers read the accumulators in place, scaled to their mean over the
  // micro-batches by the update itself (the all-reduce averaged the replicas): no mean tensor,
  // no exchange to bring one onto the parameter's layout.
  for (const auto& [grad_id, acc] : mean_gradients) lowering.bind(grad_id, acc);
  const double mean_scale = 1.0 / static_cast<double>(shape.gradient_accumulation);
  lowering.set_gradient_scale(mean_scale);
  // Clipping by the global norm: each stage sums the squares of its own mean gradients, sends
  // that to every other stage of the replica and takes theirs, and every stage makes the same
  // factor from the same sums in stage order (every stage takes part, parameters or not).
  const auto norm_tag = [&](int from, int to) {
    return static_cast<unsigned>(transfers.size()) + static_cast<unsigned>(from * stages + to);
  };
  for (const auto& op : model.graph.ops()) {
    if (op.kind != OpKind::clip_factor) continue;
    // Without a global norm (loss scaling alone) the factor is the op's scale.
    const bool clipping = model.graph.producer(op.inputs[0]).kind == OpKind::global_norm;
    const ipu::Tensor local = ipu::ops::sum_of_squares(
        g, optimizer, clipping ? updated_accumulators : std::vector<ipu::Tensor>{}, mean_scale, 0,
        "optimizer/squared_norm");
    std::vector<ipu::Tensor> squared_norms;
    for (int s = 0; s < stages && clipping; ++s)
      if (s != stage)
        optimizer.add(ipu::Program::send(local, static_cast<unsigned>(s), norm_tag(stage, s)));
    for (int s = 0; s < stages; ++s) {
      if (s == stage) {
        squared_norms.push_back(local);
      } else if (clipping) {
        ipu::Tensor theirs =
            g.add_variable(ipu::DType::f32, {}, "optimizer/squared_norm/stage" + std::to_string(s),
                           ipu::MemoryCategory::temporary);
        g.set_tile_mapping(theirs, 0);
        optimizer.add(ipu::Program::receive(theirs, static_cast<unsigned>(s), norm_tag(s, stage)));
        squared_norms.push_back(theirs);
        out.transfers += 2;
      }
    }
    lowering.set_gradient_factor(ipu::ops::clip_factor(
        g, optimizer, squared_norms, op.r("max_norm"), op.r("scale"), "optimizer/grad_factor"));
  }
  lowering.lower_optimizer(stage, optimizer);
  step.add(optimizer);
  if (sharding && !sharded_weights.empty())
    step.add(ipu::Program::all_gather(weight_blocks, sharded_weights));
  out.programs["train"] = ipu::Program::repeat(shape.device_iterations, step);

  // Evaluation runs the inference-mode model (running statistics, no dropout) on the same
  // weights when one is given, else the training model's forward pass; one batch at a time.
  const models::Model& evaluated = eval_model ? *eval_model : model;
  ipu::Program eval_forward = forward;
  if (eval_model || stages > 1) {
    const auto first_eval_tag = norm_tag(stages, 0);  // after the norms' tags
    const Transfers eval_transfers =
        plan_transfers(evaluated, {evaluated.logits, evaluated.loss}, first_eval_tag);
    eval_forward = ipu::Program();
    lowering.set_model(evaluated, false);
    lowering.lower_phase(Phase::forward, eval_forward, stage, eval_transfers);
    if (host_side) {
      for (models::ValueId v : {evaluated.logits, evaluated.loss})
        if (!lowering.has(v)) lowering.receive(v, 0, eval_transfers, eval_forward);
      out.eval_logits = lowering.tensor(evaluated.logits);
      out.eval_loss = lowering.tensor(evaluated.loss);
    }
  } else {
    out.eval_logits = out.logits;
    out.eval_loss = device_loss;
  }
  ipu::Program eval;
  if (host_side) {
    eval.add(ipu::Program::stream_to_device(kInputStream, out.input));
    eval.add(ipu::Program::stream_to_device(kLabelStream, out.labels));
  }
  eval.add(eval_forward);
  if (host_side) {
    out.eval_logits = for_host(eval, out.eval_logits, "eval/logits");
    out.eval_loss = for_host(eval, out.eval_loss, "eval/loss");
    eval.add(ipu::Program::stream_from_device(kLogitsStream, out.eval_logits));
    eval.add(ipu::Program::stream_from_device(kLossStream, out.eval_loss));
  }
  out.programs["eval"] = eval;
  return out;
}

}  // namespace ipupod::pod

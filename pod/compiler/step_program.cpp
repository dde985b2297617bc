// The step programs of one IPU: the training step (micro-batches in the pipeline schedule,
// gradient accumulation, the replicas' all-reduce, clipping, the optimizer, device iterations)
// and the evaluation of one batch.
#include <stdexcept>
#include <string>

#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/optimizer.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
#include "pod/compiler/compiler.hpp"
#include "pod/compiler/lowering.hpp"
#include "pod/compiler/op_params.hpp"
#include "pod/compiler/pipeline_plan.hpp"
#include "pod/compiler/pipeline_schedule.hpp"
#include "pod/compiler/replicated_sharding.hpp"

namespace ipupod::pod {
namespace {

// Gradient accumulators, laid out like their parameters (the optimizer works in place): each
// zeroed at the step's start and summed into after each micro-batch's backward pass. Plain SGD
// steps are fused with them into `optimizer`; the stateful updates read them later.
StepAccumulators make_accumulators(const models::Model& model, const StepShape& shape,
                                   const CompiledModel& out, const Lowering& lowering,
                                   ipu::Program& zero_accumulators, ipu::Program& accumulate,
                                   ipu::Program& optimizer) {
  const int stage = static_cast<int>(shape.stage);
  ipu::Graph& g = *out.graph;
  StepAccumulators acc;
  // The sum of a parameter's gradients over the step's micro-batches, zeroed at its start.
  const auto accumulator = [&](models::ValueId param_id, models::ValueId grad_id) {
    const std::string name = model.graph.value(param_id).name;
    ipu::Tensor a = ipu::ops::clone_like(g, out.parameters.at(param_id), name + "/accumulator",
                                         ipu::MemoryCategory::optimizer_state, ipu::DType::f32);
    acc.all.push_back(a);
    ipu::ops::zero(g, zero_accumulators, a, name + "/zero");
    ipu::ops::scaled_add_in_place(g, accumulate, a, lowering.tensor(grad_id), 1.0f,
                                  name + "/accumulate");
    return a;
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
      const ipu::Tensor a = accumulator(op.inputs[0], grad_id);
      acc.mean_gradients.emplace_back(grad_id, a);
      if (op.inputs[1] != grad_id) acc.mean_gradients.emplace_back(op.inputs[1], a);
      acc.updated.push_back(a);
      acc.updates.push_back(&op);
      continue;
    }
    if (op.kind != OpKind::sgd_step || op.pipeline_stage != stage) continue;
    const ipu::Tensor& param = out.parameters.at(op.inputs[0]);
    const ipu::Tensor a = accumulator(op.inputs[0], op.inputs[1]);
    const std::string name = model.graph.value(op.inputs[0]).name;
    // Mean over the accumulated micro-batches; the all-reduce already averaged the replicas.
    const float factor =
        -static_cast<float>(op.scalar / static_cast<double>(shape.gradient_accumulation));
    ipu::ops::scaled_add_in_place(g, optimizer, param, a, factor, name + "/sgd");
  }
  return acc;
}

// The host reads float32.
ipu::Tensor for_host(ipu::Graph& g, ipu::Program& prog, const ipu::Tensor& t,
                     const std::string& name) {
  return ipu::ops::cast(g, prog, t, ipu::DType::f32, ipu::Rounding::nearest_even, 0,
                        name + "/float32");
}

// The tag of the squared gradient norm stage `from` sends stage `to` (after the transfers').
unsigned norm_tag(const Transfers& transfers, int stages, int from, int to) {
  return static_cast<unsigned>(transfers.size()) + static_cast<unsigned>(from * stages + to);
}

// Clipping by the global norm: each stage sums the squares of its own mean gradients, sends
// that to every other stage of the replica and takes theirs, and every stage makes the same
// factor from the same sums in stage order (every stage takes part, parameters or not).
void add_gradient_clipping(const models::Model& model, const StepShape& shape,
                           const Transfers& transfers, const StepAccumulators& acc,
                           double mean_scale, CompiledModel& out, Lowering& lowering,
                           ipu::Program& optimizer) {
  const int stages = static_cast<int>(shape.stages), stage = static_cast<int>(shape.stage);
  ipu::Graph& g = *out.graph;
  for (const auto& op : model.graph.ops()) {
    if (op.kind != OpKind::clip_factor) continue;
    // Without a global norm (loss scaling alone) the factor is the op's scale.
    const bool clipping = model.graph.producer(op.inputs[0]).kind == OpKind::global_norm;
    const ipu::Tensor local =
        ipu::ops::sum_of_squares(g, optimizer, clipping ? acc.updated : std::vector<ipu::Tensor>{},
                                 mean_scale, 0, "optimizer/squared_norm");
    std::vector<ipu::Tensor> squared_norms;
    for (int s = 0; s < stages && clipping; ++s)
      if (s != stage)
        optimizer.add(ipu::Program::send(local, static_cast<unsigned>(s),
                                         norm_tag(transfers, stages, stage, s)));
    for (int s = 0; s < stages; ++s) {
      if (s == stage) {
        squared_norms.push_back(local);
      } else if (clipping) {
        ipu::Tensor theirs =
            g.add_variable(ipu::DType::f32, {}, "optimizer/squared_norm/stage" + std::to_string(s),
                           ipu::MemoryCategory::temporary);
        g.set_tile_mapping(theirs, 0);
        optimizer.add(ipu::Program::receive(theirs, static_cast<unsigned>(s),
                                            norm_tag(transfers, stages, s, stage)));
        squared_norms.push_back(theirs);
        out.transfers += 2;
      }
    }
    lowering.set_gradient_factor(ipu::ops::clip_factor(
        g, optimizer, squared_norms, op.r("max_norm"), op.r("scale"), "optimizer/grad_factor"));
  }
}

// Evaluation runs the inference-mode model (running statistics, no dropout) on the same
// weights when one is given, else the training model's forward pass; one batch at a time.
void add_eval_program(const models::Model& model, const StepShape& shape,
                      const models::Model* eval_model, const Transfers& transfers,
                      const ipu::Program& forward, const ipu::Tensor& device_loss,
                      CompiledModel& out, Lowering& lowering) {
  const int stages = static_cast<int>(shape.stages), stage = static_cast<int>(shape.stage);
  const bool host_side = stage == 0;
  const models::Model& evaluated = eval_model ? *eval_model : model;
  ipu::Program eval_forward = forward;
  if (eval_model || stages > 1) {
    const auto first_eval_tag = norm_tag(transfers, stages, stages, 0);  // after the norms' tags
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
    ipu::Graph& g = *out.graph;
    out.eval_logits = for_host(g, eval, out.eval_logits, "eval/logits");
    out.eval_loss = for_host(g, eval, out.eval_loss, "eval/loss");
    eval.add(ipu::Program::stream_from_device(kLogitsStream, out.eval_logits));
    eval.add(ipu::Program::stream_from_device(kLossStream, out.eval_loss));
  }
  out.programs["eval"] = eval;
}

}  // namespace

std::string timed_train_program(std::size_t gradient_accumulation, std::size_t device_iterations) {
  return "train g=" + std::to_string(gradient_accumulation) +
         " d=" + std::to_string(device_iterations);
}

CompiledModel compile_for_ipu(const models::Model& model, const ipu::ArchPreset& arch,
                              const StepShape& shape, const models::Model* eval_model,
                              const CompileProgressFn& progress) {
  const int stages = static_cast<int>(shape.stages), stage = static_cast<int>(shape.stage);
  if (stages > 1 && model.graph.max_stage() + 1 != stages)
    throw std::invalid_argument("model '" + model.name + "' is split into " +
                                std::to_string(model.graph.max_stage() + 1) +
                                " pipeline stages, the pod runs " + std::to_string(stages));
  CompiledModel out;
  out.graph = std::make_unique<ipu::Graph>(arch);
  out.graph->set_available_memory_proportion(shape.available_memory_proportion);
  out.graph->set_half_partials(shape.half_partials);
  if (shape.plan_only) {
    out.graph->drop_vertex_params();
    out.graph->drop_vertex_regions();
  }
  ipu::Graph& g = *out.graph;
  Lowering lowering(out, shape.float16);
  lowering.set_progress(&progress);
  lowering.set_model(model, true);
  lowering.share_casts_between_phases(stages == 1 || !shape.grouped);
  const Transfers transfers = plan_transfers(model, {model.loss}, 0);

  ipu::Program forward, backward;
  // Only a stage whose activations wait in a stash (grouped pipeline, not the last stage)
  // recomputes; it then stashes only what the recomputation cannot make again.
  const bool recomputing = shape.recompute && shape.grouped && stages > 1 && stage < stages - 1;
  MicroBatchPrograms mb;
  const Recomputation plan =
      recomputing ? plan_recomputation(model.graph, stage, stash_slots(shape)) : Recomputation{};
  RecomputePrograms recompute(plan);
  for (const auto& [op, segment] : plan.segment) mb.recomputed.insert(op);
  lowering.lower_phase(Phase::forward, forward, stage, transfers,
                       recomputing ? &recompute : nullptr);
  mb.forward_values = lowering.lowered();
  lowering.lower_phase(Phase::backward, backward, stage, transfers,
                       recomputing ? &recompute : nullptr);
  const bool host_side = stage == 0;
  if (host_side) {
    out.input = lowering.tensor(model.input);
    out.labels = lowering.tensor(model.labels);
    if (!lowering.has(model.loss)) lowering.receive(model.loss, 0, transfers, backward);
    out.loss = lowering.tensor(model.loss);
    if (lowering.has(model.logits)) out.logits = lowering.tensor(model.logits);
  }

  ipu::Program zero_accumulators, accumulate, optimizer;
  StepAccumulators acc =
      make_accumulators(model, shape, out, lowering, zero_accumulators, accumulate, optimizer);

  mb.backward = ipu::Program::sequence({backward, accumulate});
  // The loss goes to the host right after it is made (a local loss would be overwritten by
  // later forward passes before this micro-batch's backward pass in the grouped schedule),
  // or after the backward pass once the last stage's copy has arrived.
  const bool local_loss = stage_of(model.graph, model.loss) == stage;
  if (host_side) {
    mb.forward.add(ipu::Program::stream_to_device(kInputStream, out.input));
    mb.forward.add(ipu::Program::stream_to_device(kLabelStream, out.labels));
  }
  mb.forward.add(forward);
  const ipu::Tensor device_loss = out.loss;  // what the training forward pass makes
  if (host_side) {
    ipu::Program& loss_program = local_loss ? mb.forward : mb.backward;
    out.loss = for_host(g, loss_program, out.loss, "loss");
    loss_program.add(ipu::Program::stream_from_device(kLossStream, out.loss));
  }
  const PipelineSchedule schedule = pipeline_schedule(model, shape, mb, lowering, out);
  // The step after its micro-batches: the replicas' reduction, the optimizer, the gather.
  ipu::Program tail;
  const bool sharding = shape.replicated_tensor_sharding && shape.replicas > 1;
  ShardedWeights sharded;
  if (sharding) {
    sharded = shard_optimizer_state(model, shape, acc, out, lowering, tail);
  } else if (shape.replicas > 1 && !acc.all.empty()) {
    tail.add(ipu::Program::all_reduce(acc.all, ipu::CollectiveOp::mean));
  }
  // The stateful optimizers read the accumulators in place, scaled to their mean over the
  // micro-batches by the update itself (the all-reduce averaged the replicas): no mean tensor,
  // no exchange to bring one onto the parameter's layout.
  for (const auto& [grad_id, a] : acc.mean_gradients) lowering.bind(grad_id, a);
  const double mean_scale = 1.0 / static_cast<double>(shape.gradient_accumulation);
  lowering.set_gradient_scale(mean_scale);
  add_gradient_clipping(model, shape, transfers, acc, mean_scale, out, lowering, optimizer);
  lowering.lower_optimizer(stage, optimizer);
  tail.add(optimizer);
  if (sharding && !sharded.whole.empty())
    tail.add(ipu::Program::all_gather(sharded.blocks, sharded.whole));
  const auto train_step = [&](std::size_t gradient_accumulation, std::size_t device_iterations) {
    ipu::Program step = ipu::Program::sequence({zero_accumulators});
    schedule(gradient_accumulation, step);
    for (const ipu::Program& p : tail.children()) step.add(p);
    return ipu::Program::repeat(device_iterations, step);
  };
  out.programs["train"] = train_step(shape.gradient_accumulation, shape.device_iterations);
  for (const auto& [gradient_accumulation, device_iterations] : shape.timed_steps) {
    const std::string name = timed_train_program(gradient_accumulation, device_iterations);
    if (out.programs.count(name)) continue;
    out.programs[name] = train_step(gradient_accumulation, device_iterations);
    out.timing_only_programs.push_back(name);
  }

  add_eval_program(model, shape, eval_model, transfers, forward, device_loss, out, lowering);
  out.graph->shrink_to_fit();
  return out;
}

}  // namespace ipupod::pod

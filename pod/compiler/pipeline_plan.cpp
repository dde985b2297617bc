// Pipeline planning: the transfers between stages and the ops recomputation runs again.
#include "pod/compiler/pipeline_plan.hpp"

namespace ipupod::pod {

using models::OpKind;
using models::Phase;

int stage_of(const models::Graph& g, models::ValueId v) {
  return g.producer(v).pipeline_stage;
}

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

}  // namespace ipupod::pod

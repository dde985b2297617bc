// Pipeline planning: the transfers between stages and the ops recomputation runs again.
#include "pod/compiler/pipeline_plan.hpp"

#include <algorithm>
#include <map>

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

std::set<const models::Op*> recomputed_ops(const models::Graph& g, int stage,
                                           const std::set<const models::Op*>& checkpoints) {
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
    if (reads_updated_state || checkpoints.count(&op)) continue;
    out.insert(&op);
    needed.insert(op.inputs.begin(), op.inputs.end());
  }
  return out;
}

Recomputation plan_recomputation(const models::Graph& g, int stage, std::size_t stash_depth) {
  const std::set<const models::Op*> all = recomputed_ops(g, stage);
  // The recomputed ops in graph order, and where each of their results is last read when they
  // run again.
  std::vector<const models::Op*> order;
  std::map<const models::Op*, std::size_t> position;
  for (const auto& op : g.ops())
    if (all.count(&op)) position.emplace(&op, order.size()), order.push_back(&op);
  std::vector<std::size_t> last_read(order.size(), 0);
  for (std::size_t i = 0; i < order.size(); ++i)
    for (models::ValueId v : order[i]->inputs) {
      const auto at = position.find(&g.producer(v));
      if (at != position.end()) last_read[at->second] = std::max(last_read[at->second], i);
    }
  const auto bytes = [&](const models::Op* op) {
    return static_cast<double>(g.info(*op->output).elements());
  };
  // Candidate checkpoints: ops after which only their own result is still read.
  std::vector<bool> candidate(order.size(), false);
  double total = 0;
  for (std::size_t i = 0, open_until = 0; i < order.size(); ++i) {
    total += bytes(order[i]);
    candidate[i] = open_until <= i && i + 1 < order.size();
    open_until = std::max(open_until, last_read[i]);
  }
  // Checkpoints at the first candidate after every `target` bytes of results: of the targets
  // total / 2^k, the one whose checkpoints (stashed in every slot, and restored) and largest
  // segment (live while it is recomputed) take the fewest bytes.
  const double slots = static_cast<double>(std::max<std::size_t>(1, stash_depth)) + 1;
  const auto choose = [&](double target, std::set<const models::Op*>* chosen) {
    double run = 0, kept = 0, largest = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      run += bytes(order[i]);
      if (candidate[i] && run >= target) {
        if (chosen) chosen->insert(order[i]);
        largest = std::max(largest, run);
        kept += bytes(order[i]);
        run = 0;
      }
    }
    return slots * kept + std::max(largest, run);
  };
  double best_target = total + 1, best = choose(best_target, nullptr);
  for (double target = total; target >= 1; target /= 2)
    if (const double cost = choose(target, nullptr); cost < best) best = cost, best_target = target;
  std::set<const models::Op*> checkpoints;
  choose(best_target, &checkpoints);
  Recomputation out;
  const std::set<const models::Op*> recomputed = recomputed_ops(g, stage, checkpoints);
  std::size_t segment = 0;
  bool used = false;
  for (const auto& op : g.ops()) {
    if (checkpoints.count(&op)) {
      segment += used ? 1 : 0;
      used = false;
    }
    if (!recomputed.count(&op)) continue;
    out.segment.emplace(&op, segment);
    used = true;
  }
  out.reads_segments.resize(recomputed.empty() ? 0 : segment + 1);
  for (const auto& [op, s] : out.segment)
    for (models::ValueId v : op->inputs)
      if (const auto read = out.segment_of(&g.producer(v)); read && *read != s)
        out.reads_segments[s].insert(*read);
  return out;
}

}  // namespace ipupod::pod

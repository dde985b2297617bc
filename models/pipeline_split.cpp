// The automatic split: per-op cost and memory estimates, the bytes crossing each possible cut,
// and a dynamic programme over cut positions (linear partition with a memory constraint).
#include "models/pipeline_split.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace ipupod::models {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// The backward pass of a layer does about twice the work of its forward pass.
constexpr double kForwardAndBackward = 3.0;
// Every value of the IR is float32 or int32.
constexpr double kBytesPerElement = 4.0;

bool is_variable(OpKind kind) {
  return kind == OpKind::input || kind == OpKind::parameter || kind == OpKind::state ||
         kind == OpKind::constant;
}

double elements(const Graph& g, ValueId v) {
  return static_cast<double>(g.info(v).elements());
}

// Multiply-accumulates of the ops that run on the matrix units, as FLOPs; 0 for the others.
double matrix_flops(const Graph& g, const Op& op) {
  if (!op.output) return 0;
  const double out = elements(g, *op.output);
  switch (op.kind) {
    case OpKind::matmul:
    case OpKind::batch_matmul: {
      const Shape& a = g.info(op.inputs[0]).shape;
      const std::size_t k = op.transpose_a ? a[a.size() - 2] : a.back();
      return 2.0 * out * static_cast<double>(k);
    }
    case OpKind::conv2d: {  // weight [co, ci/groups, kh, kw]
      const Shape& w = g.info(op.inputs[1]).shape;
      return 2.0 * out * elements(g, op.inputs[1]) / static_cast<double>(w[0]);
    }
    case OpKind::conv_transpose2d: {  // weight [ci, co/groups, kh, kw]: per input element
      const Shape& w = g.info(op.inputs[1]).shape;
      return 2.0 * elements(g, op.inputs[0]) * elements(g, op.inputs[1]) /
             static_cast<double>(w[0]);
    }
    default:
      return 0;
  }
}

double op_cycles(const Graph& g, const Op& op, const SplitCosts& c) {
  const double flops = matrix_flops(g, op);
  const double touched = op.output ? elements(g, *op.output) : elements(g, op.inputs.at(0));
  const double work =
      flops > 0 ? flops / c.matmul_flops_per_cycle : touched / c.vector_elements_per_cycle;
  return kForwardAndBackward * (work + c.per_op_cycles);
}

// The estimates of every contiguous run of compute ops on every stage, from prefix sums.
struct CostTable {
  const Graph& g;
  std::size_t stages;
  SplitCosts c;
  std::vector<std::size_t> units;       // indices of the compute ops, in graph order
  std::vector<std::size_t> unit_of_op;  // per op: its unit, or SIZE_MAX for variables
  // Prefix sums over units, and the bytes crossing the cut before each unit (and at the end).
  std::vector<double> cycle_sum, parameter_sum, activation_sum, crossing;

  CostTable(const Graph& graph, std::size_t stage_count, const SplitCosts& costs)
      : g(graph), stages(stage_count), c(costs) {
    if (stages == 0) throw std::invalid_argument("automatic split: stages must be at least 1");
    if (!(c.matmul_flops_per_cycle > 0 && c.vector_elements_per_cycle > 0 &&
          c.link_bytes_per_cycle > 0 && c.memory_bytes > 0))
      throw std::invalid_argument(
          "automatic split: the hardware rates and memory must be positive");
    const std::vector<Op>& ops = g.ops();
    unit_of_op.assign(ops.size(), SIZE_MAX);
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (!is_variable(ops[i].kind)) unit_of_op[i] = units.size(), units.push_back(i);
    const std::size_t n = units.size();
    if (n < stages)
      throw std::invalid_argument("automatic split: the model has " + std::to_string(n) +
                                  " compute ops, fewer than the " + std::to_string(stages) +
                                  " stages asked for; use fewer stages");
    const std::size_t values = g.values().size();
    cycle_sum.assign(n + 1, 0);
    parameter_sum.assign(n + 1, 0);
    activation_sum.assign(n + 1, 0);
    std::vector<bool> counted(values, false), read(values, false);
    std::vector<std::size_t> last_reader(values, 0);
    for (std::size_t u = 0; u < n; ++u) {
      const Op& op = ops[units[u]];
      double parameters = 0;
      for (ValueId v : op.inputs) {
        const auto id = static_cast<std::size_t>(v);
        last_reader[id] = u;
        read[id] = true;
        const OpKind kind = g.producer(v).kind;
        if ((kind == OpKind::parameter || kind == OpKind::state) && !counted[id]) {
          counted[id] = true;  // on the stage of its first user
          parameters += kBytesPerElement * elements(g, v) * c.parameter_copies;
        }
      }
      cycle_sum[u + 1] = cycle_sum[u] + op_cycles(g, op, c);
      parameter_sum[u + 1] = parameter_sum[u] + parameters;
      activation_sum[u + 1] =
          activation_sum[u] + (op.output ? kBytesPerElement * elements(g, *op.output) : 0);
    }
    // A value made by unit p (inputs: before unit 0) and last read by unit q crosses every cut
    // in (p, q]; its gradient crosses them back, hence twice its bytes.
    std::vector<std::size_t> made_by(values, 0);  // the first cut a value may cross
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ops[i].output && unit_of_op[i] != SIZE_MAX)
        made_by[static_cast<std::size_t>(*ops[i].output)] = unit_of_op[i] + 1;
    std::vector<double> delta(n + 2, 0);
    for (std::size_t v = 0; v < values; ++v) {
      if (!read[v]) continue;
      const OpKind kind = g.producer(static_cast<ValueId>(v)).kind;
      if (kind != OpKind::input && is_variable(kind)) continue;  // on every stage, not sent
      if (last_reader[v] < made_by[v]) continue;
      const double bytes = 2.0 * kBytesPerElement * elements(g, static_cast<ValueId>(v));
      delta[made_by[v]] += bytes;
      delta[last_reader[v] + 1] -= bytes;
    }
    crossing.assign(n + 1, 0);
    for (std::size_t p = 0; p <= n; ++p) crossing[p] = (p > 0 ? crossing[p - 1] : 0) + delta[p];
    crossing[0] = crossing[n] = 0;  // nothing enters the first stage or leaves the last
  }
  std::size_t size() const { return units.size(); }
  // Stage s running units [begin, end): compute plus its links to both neighbours.
  double cycles(std::size_t begin, std::size_t end) const {
    return cycle_sum[end] - cycle_sum[begin] +
           (crossing[begin] + crossing[end]) / c.link_bytes_per_cycle;
  }
  // Its parameters with their copies, and its activations in 2(S-1-s)+1 stash slots plus the
  // working copy.
  double bytes(std::size_t s, std::size_t begin, std::size_t end) const {
    const double copies = 2.0 * static_cast<double>(stages - 1 - s) + 2.0;
    return parameter_sum[end] - parameter_sum[begin] +
           copies * (activation_sum[end] - activation_sum[begin]);
  }
  // The estimates of the split starting its stages at `starts`; it fits when every stage does.
  SplitPlan plan(const std::vector<std::size_t>& starts) const {
    SplitPlan out;
    out.stages.resize(stages);
    for (std::size_t s = 0; s < stages; ++s) {
      const std::size_t begin = starts[s], end = s + 1 < stages ? starts[s + 1] : size();
      StageEstimate& e = out.stages[s];
      e.ops = end - begin;
      e.first = g.ops()[units[begin]].name;
      e.last = g.ops()[units[end - 1]].name;
      e.cycles = cycles(begin, end);
      e.bytes = bytes(s, begin, end);
      out.fits = out.fits && e.bytes <= c.memory_bytes;
    }
    return out;
  }
};

// The first unit of each stage minimising the largest stage's cycles (within memory when
// `bounded`); false when no split is within memory.
bool solve(const CostTable& t, bool bounded, std::vector<std::size_t>& starts) {
  const std::size_t n = t.size(), stages = t.stages;
  // best[s][e]: the smallest largest-stage cost of units [0, e) on stages 0..s; cut[s][e]: where
  // stage s starts in that split.
  std::vector<std::vector<double>> best(stages, std::vector<double>(n + 1, kInfinity));
  std::vector<std::vector<std::size_t>> cut(stages, std::vector<std::size_t>(n + 1, 0));
  for (std::size_t e = 1; e <= n; ++e)
    if (!bounded || t.bytes(0, 0, e) <= t.c.memory_bytes) best[0][e] = t.cycles(0, e);
  for (std::size_t s = 1; s < stages; ++s)
    for (std::size_t e = s + 1; e <= n; ++e)
      for (std::size_t b = s; b < e; ++b) {
        if (best[s - 1][b] == kInfinity) continue;
        if (bounded && t.bytes(s, b, e) > t.c.memory_bytes) continue;
        const double value = std::max(best[s - 1][b], t.cycles(b, e));
        if (value < best[s][e]) best[s][e] = value, cut[s][e] = b;
      }
  if (best[stages - 1][n] == kInfinity) return false;
  starts.assign(stages, 0);
  for (std::size_t s = stages - 1, e = n; s > 0; --s) e = starts[s] = cut[s][e];
  return true;
}

// Compute ops on their unit's stage (stage s from unit starts[s]), inputs on stage 0, the rest
// on their first user's.
void assign_stages(Graph& g, const CostTable& table, const std::vector<std::size_t>& starts) {
  const std::size_t stages = starts.size();
  const std::vector<Op>& ops = g.ops();
  const std::size_t n = table.size();
  std::vector<int> stage_of_unit(n);
  for (std::size_t s = 0; s < stages; ++s)
    for (std::size_t u = starts[s]; u < (s + 1 < stages ? starts[s + 1] : n); ++u)
      stage_of_unit[u] = static_cast<int>(s);
  std::vector<int> first_user(g.values().size(), 0);
  for (std::size_t u = n; u-- > 0;)
    for (ValueId v : ops[table.units[u]].inputs)
      first_user[static_cast<std::size_t>(v)] = stage_of_unit[u];
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (table.unit_of_op[i] != SIZE_MAX)
      g.set_op_stage(i, stage_of_unit[table.unit_of_op[i]]);
    else if (ops[i].kind == OpKind::input)
      g.set_op_stage(i, 0);
    else
      g.set_op_stage(i, first_user[static_cast<std::size_t>(*ops[i].output)]);
  }
}

// The module path an op's name spells: the name itself, or from an exported ONNX node's
// scopes, each either the one before it extended ("features.1" after "features") or a child of
// it ("block" after "features.1.0": features.1.0.block).
std::string module_path(std::string_view name) {
  if (name.find('/') == std::string_view::npos) return std::string(name);
  std::string path;
  std::string_view last;
  for (std::size_t at = 0; at <= name.size();) {
    const std::size_t end = std::min(name.find('/', at), name.size());
    const std::string_view part = name.substr(at, end - at);
    at = end + 1;
    if (part.empty()) continue;
    if (!last.empty() && part.size() > last.size() && part.substr(0, last.size()) == last &&
        part[last.size()] == '.')
      path += part.substr(last.size());
    else
      path += (path.empty() ? "" : ".") + std::string(part);
    last = part;
  }
  return path;
}

}  // namespace

bool names_block(std::string_view name, std::string_view block) {
  const std::string path = module_path(name);
  return !block.empty() && path.compare(0, block.size(), block) == 0 &&
         (path.size() == block.size() || path[block.size()] == '.');
}

SplitPlan split_pipeline(Graph& g, std::size_t stages, const SplitCosts& c) {
  const CostTable table(g, stages, c);
  std::vector<std::size_t> starts;
  if (!solve(table, true, starts)) solve(table, false, starts);  // none fits: the fastest
  assign_stages(g, table, starts);
  return table.plan(starts);
}

SplitPlan split_at(Graph& g, const std::vector<std::string>& blocks, const SplitCosts& c) {
  const CostTable table(g, blocks.size() + 1, c);
  std::vector<std::size_t> starts = {0};
  for (const std::string& block : blocks) {
    std::size_t u = starts.back() + 1;
    while (u < table.size() && !names_block(g.ops()[table.units[u]].name, block)) ++u;
    if (u == table.size()) {
      const std::string& after = g.ops()[table.units[starts.back()]].name;
      throw std::invalid_argument(
          "--split-at '" + block + "': no forward compute op after '" + after + "' (where stage " +
          std::to_string(starts.size() - 1) +
          " begins) is in that block; give the blocks in graph order, each a module path as "
          "'ipupod info --model' lists the layers (e.g. 'layer3' or 'features.4')");
    }
    if (names_block(g.ops()[table.units[u - 1]].name, block))
      throw std::invalid_argument("--split-at '" + block + "': the block begins before stage " +
                                  std::to_string(starts.size()) +
                                  " would (in an earlier stage): give each block once, in graph "
                                  "order, each after the one before");
    starts.push_back(u);
  }
  assign_stages(g, table, starts);
  SplitPlan plan = table.plan(starts);
  plan.given = true;
  return plan;
}

SplitPlan estimate_split(const Graph& g, std::size_t stages, const SplitCosts& c) {
  const CostTable table(g, stages, c);
  std::vector<std::size_t> starts(stages, 0);
  int previous = 0;
  for (std::size_t u = 0; u < table.size(); ++u) {
    const int stage = g.ops()[table.units[u]].pipeline_stage;
    if (stage < previous || stage >= static_cast<int>(stages) ||
        (stage > previous && stage != previous + 1))
      throw std::invalid_argument("estimate_split: the compute ops are not in " +
                                  std::to_string(stages) + " contiguous stages in graph order");
    if (stage > previous) starts[static_cast<std::size_t>(stage)] = u, previous = stage;
  }
  if (previous + 1 != static_cast<int>(stages))
    throw std::invalid_argument("estimate_split: the graph has " + std::to_string(previous + 1) +
                                " stages, not " + std::to_string(stages));
  return table.plan(starts);
}

std::map<std::string, int> variable_stages(const Graph& g) {
  std::map<std::string, int> out;
  for (const auto& op : g.ops())
    if ((op.kind == OpKind::parameter || op.kind == OpKind::state) && op.output)
      out[g.value(*op.output).name] = op.pipeline_stage;
  return out;
}

void follow_split(Graph& g, const std::map<std::string, int>& stage_of) {
  const std::vector<Op>& ops = g.ops();
  std::vector<int> stage_of_value(g.values().size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    int stage = 0;
    if (op.kind == OpKind::parameter || op.kind == OpKind::state) {
      const auto it = stage_of.find(g.value(*op.output).name);
      if (it == stage_of.end())
        throw std::invalid_argument("automatic split: '" + g.value(*op.output).name +
                                    "' is not in the split being followed");
      stage = it->second;
    } else if (op.kind != OpKind::input && op.kind != OpKind::constant) {
      for (ValueId v : op.inputs)
        stage = std::max(stage, stage_of_value[static_cast<std::size_t>(v)]);
    }
    g.set_op_stage(i, stage);
    if (op.output) stage_of_value[static_cast<std::size_t>(*op.output)] = stage;
  }
}

}  // namespace ipupod::models

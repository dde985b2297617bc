// The automatic pipeline split: optimal against brute force over every cut, better balanced
// than the model's own split marks on an uneven model, within memory when a split fits, and an
// evaluation model that follows it keeps every parameter on its training stage.
#include "models/pipeline_split.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "models/zoo.hpp"

namespace ipupod::models {
namespace {

// Rates of a made-up IPU: the test checks the search, not the hardware figures.
SplitCosts costs() {
  SplitCosts c;
  c.matmul_flops_per_cycle = 64;
  c.vector_elements_per_cycle = 16;
  c.per_op_cycles = 10;
  c.link_bytes_per_cycle = 8;
  c.memory_bytes = 1e12;
  return c;
}

// An MLP whose later layers hold most of the work (its split marks count layers).
ModelOptions uneven_mlp() {
  ModelOptions o;
  o.micro_batch = 4;
  o.sample_shape = {1, 4, 4};
  o.hidden = {16, 16, 16, 16, 96, 96, 96, 96};
  return o;
}

bool is_compute(const Op& op) {
  return op.kind != OpKind::input && op.kind != OpKind::parameter && op.kind != OpKind::state &&
         op.kind != OpKind::constant;
}

// Puts the compute ops on stages by the given first op of each stage (in compute-op order).
void assign(Graph& g, const std::vector<std::size_t>& starts) {
  std::size_t unit = 0;
  for (std::size_t i = 0; i < g.ops().size(); ++i) {
    if (!is_compute(g.ops()[i])) continue;
    const auto stage = std::upper_bound(starts.begin(), starts.end(), unit) - starts.begin() - 1;
    g.set_op_stage(i, static_cast<int>(stage));
    ++unit;
  }
}

double largest(const SplitPlan& plan) {
  double worst = 0;
  for (const auto& e : plan.stages) worst = std::max(worst, e.cycles);
  return worst;
}

Model forward_only(const ModelOptions& options, Graph* captured) {
  ModelOptions o = options;
  o.assign_stages = [captured](Graph& g) { *captured = g; };
  return build_model("mlp", o);
}

TEST(PipelineSplit, IsTheBestContiguousSplitFoundByBruteForce) {
  Graph forward;
  forward_only(uneven_mlp(), &forward);
  std::size_t units = 0;
  for (const auto& op : forward.ops()) units += is_compute(op) ? 1 : 0;
  ASSERT_GT(units, 6u);
  for (std::size_t stages : {2, 3}) {
    Graph g = forward;
    const SplitPlan plan = split_pipeline(g, stages, costs());
    ASSERT_EQ(plan.stages.size(), stages);
    EXPECT_TRUE(plan.fits);
    double best = 1e300;
    for (std::size_t a = 1; a < units; ++a)
      for (std::size_t b = stages == 3 ? a + 1 : units; b <= units; ++b) {
        if (stages == 3 && b == units) continue;
        Graph trial = forward;
        assign(trial,
               stages == 2 ? std::vector<std::size_t>{0, a} : std::vector<std::size_t>{0, a, b});
        best = std::min(best, largest(estimate_split(trial, stages, costs())));
      }
    EXPECT_DOUBLE_EQ(largest(plan), best) << stages << " stages";
    // What the split assigned is what it estimated.
    EXPECT_DOUBLE_EQ(largest(estimate_split(g, stages, costs())), largest(plan));
  }
}

TEST(PipelineSplit, BalancesAnUnevenModelBetterThanItsSplitMarks) {
  ModelOptions marked = uneven_mlp();
  marked.pipeline_stages = 2;
  Graph by_marks;
  {
    ModelOptions o = marked;
    o.assign_stages = [&](Graph& g) {
      // Re-apply the model's own marks: build it split the usual way and copy the stages.
      const Model reference = build_model("mlp", marked);
      for (std::size_t i = 0; i < g.ops().size(); ++i)
        g.set_op_stage(i, reference.graph.ops()[i].pipeline_stage);
      by_marks = g;
    };
    build_model("mlp", o);
  }
  Graph automatic;
  forward_only(uneven_mlp(), &automatic);
  const double marks = largest(estimate_split(by_marks, 2, costs()));
  const double balanced = largest(split_pipeline(automatic, 2, costs()));
  EXPECT_LT(balanced, 0.9 * marks) << "marks " << marks << ", automatic " << balanced;
}

TEST(PipelineSplit, KeepsWithinMemoryWhenASplitFitsAndSaysSoWhenNoneDoes) {
  // A large micro-batch: activations, stashed more on the first stage, dominate the memory, so
  // the split that needs least memory is not the one that balances cycles.
  ModelOptions o = uneven_mlp();
  o.micro_batch = 256;
  Graph forward;
  forward_only(o, &forward);
  Graph free_split = forward;
  const SplitPlan unbounded = split_pipeline(free_split, 2, costs());
  const auto most_bytes = [](const SplitPlan& p) {
    double worst = 0;
    for (const auto& e : p.stages) worst = std::max(worst, e.bytes);
    return worst;
  };
  // Memory for exactly the split that needs least: the fastest one does not fit in it.
  std::size_t units = 0;
  for (const auto& op : forward.ops()) units += is_compute(op) ? 1 : 0;
  double least = 1e300;
  for (std::size_t a = 1; a < units; ++a) {
    Graph trial = forward;
    assign(trial, {0, a});
    least = std::min(least, most_bytes(estimate_split(trial, 2, costs())));
  }
  ASSERT_GT(most_bytes(unbounded), least);
  SplitCosts tight = costs();
  tight.memory_bytes = least;
  Graph g = forward;
  const SplitPlan plan = split_pipeline(g, 2, tight);
  ASSERT_TRUE(plan.fits);
  EXPECT_LE(most_bytes(plan), tight.memory_bytes);
  EXPECT_GT(largest(plan), largest(unbounded));  // slower, since the fastest does not fit
  SplitCosts tiny = costs();
  tiny.memory_bytes = 1;
  Graph h = forward;
  const SplitPlan none = split_pipeline(h, 2, tiny);
  EXPECT_FALSE(none.fits);
  EXPECT_DOUBLE_EQ(largest(none), largest(unbounded));  // the fastest split is taken instead
  Graph too_many = forward;
  EXPECT_THROW(split_pipeline(too_many, 1000, costs()), std::invalid_argument);
}

TEST(PipelineSplit, TheEvaluationModelFollowsTheTrainingSplit) {
  ModelOptions o = uneven_mlp();
  o.pipeline_stages = 3;
  o.assign_stages = [](Graph& g) { split_pipeline(g, 3, costs()); };
  const Model trained = build_model("mlp", o);
  EXPECT_EQ(trained.graph.max_stage(), 2);
  const std::map<std::string, int> stages = variable_stages(trained.graph);
  ModelOptions e = uneven_mlp();
  e.training = false;
  e.assign_stages = [&](Graph& g) { follow_split(g, stages); };
  const Model eval = build_model("mlp", e);
  EXPECT_EQ(variable_stages(eval.graph), stages);
  for (const auto& op : eval.graph.ops())  // forward: values flow to the same or later stages
    for (ValueId v : op.phase == Phase::forward ? op.inputs : std::vector<ValueId>{}) {
      if (eval.graph.producer(v).kind != OpKind::constant) {
        EXPECT_GE(op.pipeline_stage, eval.graph.producer(v).pipeline_stage) << op.name;
      }
    }
}

// A block names the ops of a module path, whether the op's name spells it with dots (the zoo's)
// or as an exported ONNX node's scopes.
TEST(PipelineSplit, ABlockNamesTheOpsOfItsModulePath) {
  EXPECT_TRUE(names_block("fc3.matmul", "fc3"));
  EXPECT_TRUE(names_block("fc3", "fc3"));
  EXPECT_FALSE(names_block("fc30.matmul", "fc3"));
  EXPECT_FALSE(names_block("fc3.matmul", "fc"));
  EXPECT_FALSE(names_block("fc3.matmul", ""));
  EXPECT_TRUE(names_block("/layer3/layer3.0/conv1/Conv", "layer3"));
  EXPECT_TRUE(names_block("/layer3/layer3.0/conv1/Conv", "layer3.0.conv1"));
  EXPECT_FALSE(names_block("/layer3/layer3.0/conv1/Conv", "layer3.1"));
  EXPECT_FALSE(names_block("/layer30/layer30.0/Relu", "layer3"));
  const char* node = "/features/features.1/features.1.0/block/block.0/block.0.0/Conv";
  EXPECT_TRUE(names_block(node, "features.1"));
  EXPECT_TRUE(names_block(node, "features.1.0.block.0"));
  EXPECT_FALSE(names_block(node, "features.1.0.block.1"));
  EXPECT_FALSE(names_block(node, "block.0"));  // a module path from the model's root
}

// --split-at: each named block begins a stage at its first op, as PopTorch's BeginBlock does;
// parameters go with their first user; blocks that name no later op are refused.
TEST(PipelineSplit, SplitsAtTheBlocksTheUserNames) {
  Graph forward;
  forward_only(uneven_mlp(), &forward);
  Graph g = forward;
  const SplitPlan plan = split_at(g, {"fc3", "fc6"}, costs());
  EXPECT_TRUE(plan.given);
  ASSERT_EQ(plan.stages.size(), 3u);
  EXPECT_TRUE(names_block(plan.stages[1].first, "fc3")) << plan.stages[1].first;
  EXPECT_TRUE(names_block(plan.stages[2].first, "fc6")) << plan.stages[2].first;
  std::size_t compute = 0;
  for (const Op& op : g.ops()) {
    if (op.kind == OpKind::input) {
      EXPECT_EQ(op.pipeline_stage, 0);
    }
    if (op.kind == OpKind::parameter || !is_compute(op)) continue;
    ++compute;
    // flatten, then fcK and reluK for K = 0..7, then the head and the loss.
    const std::size_t digit = op.name.find_first_of("0123456789");
    const int layer = digit == std::string::npos || op.name.rfind("head", 0) == 0
                          ? (op.name.rfind("flatten", 0) == 0 ? -1 : 8)  // the head and loss
                          : std::stoi(op.name.substr(digit));
    EXPECT_EQ(op.pipeline_stage, layer < 3 ? 0 : layer < 6 ? 1 : 2) << op.name;
  }
  EXPECT_GT(compute, 8u);
  for (const Op& op : g.ops())
    if (op.kind == OpKind::parameter && names_block(g.value(*op.output).name, "fc4")) {
      EXPECT_EQ(op.pipeline_stage, 1) << g.value(*op.output).name;
    }
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"fc6", "fc3"}, {"fc3", "fc3"}, {"fc"}, {"flatten"}, {"nothing"}}) {
    Graph h = forward;
    EXPECT_THROW(split_at(h, bad, costs()), std::invalid_argument) << bad[0];
  }
}

}  // namespace
}  // namespace ipupod::models

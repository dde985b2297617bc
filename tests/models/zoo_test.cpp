// The zoo at small configurations: every model runs forward, backward and an optimizer step in
// the interpreter, marks its pipeline stages, and summarises itself; optimizer options wire up.
#include "models/zoo.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/interpreter.hpp"

namespace ipupod::models {
namespace {

Buffer random_for(const TensorInfo& info, std::uint32_t seed) {
  Buffer b = Buffer::zeros(info);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(0.f, 1.f);
  for (auto& v : b.f) v = d(gen);
  for (std::size_t i = 0; i < b.i.size(); ++i) b.i[i] = static_cast<std::int32_t>(i % 3);
  return b;
}

struct SmallCase {
  const char* name;
  ModelOptions options;
};

std::vector<SmallCase> small_cases() {
  std::vector<SmallCase> cases;
  ModelOptions o;
  o.micro_batch = 2;
  o.classes = 3;
  o.learning_rate = 0.01;
  ModelOptions cnn = o;
  cnn.sample_shape = {1, 8, 8};
  cnn.width = 0.125;
  cases.push_back({"cnn", cnn});
  ModelOptions resnet = o;
  resnet.sample_shape = {3, 32, 32};
  resnet.width = 1.0 / 16;
  resnet.depth = 0.25;
  resnet.pipeline_stages = 4;
  cases.push_back({"resnet50", resnet});
  ModelOptions eff = o;
  eff.sample_shape = {3, 32, 32};
  eff.width = 1.0 / 8;
  eff.depth = 0.1;
  eff.pipeline_stages = 4;
  eff.optimizer.kind = OptimizerKind::adamw;
  cases.push_back({"efficientnetv2_s", eff});
  ModelOptions hae = o;
  hae.sample_shape = {1, 32, 32};
  hae.width = 1.0 / 16;
  hae.pipeline_stages = 2;
  hae.optimizer.kind = OptimizerKind::adamw;
  hae.optimizer.clip_global_norm = 1.0;
  hae.optimizer.schedule.kind = ScheduleKind::cosine;
  hae.optimizer.schedule.warmup_steps = 1;
  hae.optimizer.schedule.total_steps = 10;
  cases.push_back({"hae", hae});
  ModelOptions gan = o;
  gan.sample_shape = {3, 16, 16};
  gan.width = 1.0 / 16;
  gan.depth = 0.2;
  gan.pipeline_stages = 2;
  gan.optimizer.kind = OptimizerKind::adam;
  gan.optimizer.beta1 = 0;
  gan.optimizer.beta2 = 0.99;
  cases.push_back({"transcyclegan", gan});
  return cases;
}

TEST(Zoo, EverySmallModelTrainsOneStepInTheInterpreter) {
  for (const auto& c : small_cases()) {
    SCOPED_TRACE(c.name);
    const Model m = build_model(c.name, c.options);
    EXPECT_EQ(m.graph.max_stage() + 1, static_cast<int>(c.options.pipeline_stages));
    Interpreter in(m.graph, 1);
    in.set(m.input, random_for(m.graph.info(m.input), 1));
    in.set(m.labels, random_for(m.graph.info(m.labels), 2));
    in.run();
    const float first = in.get(m.loss).f[0];
    EXPECT_TRUE(std::isfinite(first));
    std::size_t changed = 0;
    const ValueId p = m.graph.parameters().front();
    const Buffer before = initial_parameter(m.graph, p, 1);
    for (std::size_t i = 0; i < before.f.size(); ++i) changed += before.f[i] != in.get(p).f[i];
    EXPECT_GT(changed, 0u) << "the optimizer step moved " << m.graph.value(p).name;
    for (const auto& [param, grad] : m.gradients)
      for (float v : in.get(grad).f) ASSERT_TRUE(std::isfinite(v)) << m.graph.value(param).name;
    in.run();
    EXPECT_TRUE(std::isfinite(in.get(m.loss).f[0]));
  }
}

TEST(Zoo, SummaryShowsStagesAndParameterCount) {
  ModelOptions o;
  o.micro_batch = 1;
  o.pipeline_stages = 2;
  o.width = 0.25;
  o.sample_shape = {1, 32, 32};
  const Model m = build_model("hae", o);
  const std::string s = m.summary();
  EXPECT_NE(s.find("pipeline stage 1"), std::string::npos) << s;
  EXPECT_NE(s.find("parameters: " + std::to_string(m.parameter_count())), std::string::npos) << s;
  EXPECT_NE(s.find("encoder0.0.gdn"), std::string::npos) << s;
}

TEST(Zoo, FixedGeometryModelsRejectOtherSampleShapes) {
  ModelOptions o;
  o.sample_shape = {1, 28, 28};
  try {
    build_model("hae", o);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[1,28,28]"), std::string::npos) << e.what();
  }
  o.pipeline_stages = 3;
  o.sample_shape = {3, 32, 32};
  EXPECT_THROW(build_model("efficientnetv2_s", o), std::invalid_argument);
}

TEST(Zoo, EfficientNetSplitsLikeThePaper) {
  ModelOptions o;
  o.sample_shape = {3, 32, 32};
  o.width = 0.125;
  o.depth = 0.1;
  o.pipeline_stages = 2;
  const Model m = build_model("efficientnetv2_s", o);
  for (const Op& op : m.graph.ops()) {
    if (op.kind != OpKind::parameter) continue;
    const bool late = op.name.rfind("features.6", 0) == 0 || op.name.rfind("features.7", 0) == 0 ||
                      op.name.rfind("head", 0) == 0;
    EXPECT_EQ(op.pipeline_stage, late ? 1 : 0) << op.name;
  }
}

TEST(Optimizers, LossScalingDoesNotChangeTheUpdate) {
  std::vector<float> after[2];
  for (int scaled = 0; scaled < 2; ++scaled) {
    ModelOptions o;
    o.micro_batch = 3;
    o.sample_shape = {4};
    o.hidden = {5};
    o.optimizer.kind = OptimizerKind::sgd_momentum;
    o.optimizer.loss_scale = scaled ? 128.0 : 1.0;
    const Model m = build_model("mlp", o);
    Interpreter in(m.graph, 4);
    in.set(m.input, random_for(m.graph.info(m.input), 3));
    in.set(m.labels, random_for(m.graph.info(m.labels), 4));
    in.run();
    in.run();
    after[scaled] = in.get(m.graph.parameters().front()).f;
  }
  ASSERT_EQ(after[0].size(), after[1].size());
  for (std::size_t i = 0; i < after[0].size(); ++i) EXPECT_NEAR(after[0][i], after[1][i], 1e-6);
}

TEST(Optimizers, PlainSgdStaysOneSgdStepPerParameter) {
  ModelOptions o;
  o.micro_batch = 2;
  o.sample_shape = {3};
  const Model m = build_model("mlp", o);
  std::size_t steps = 0;
  for (const Op& op : m.graph.ops())
    if (op.phase == Phase::optimizer) {
      EXPECT_EQ(op.kind, OpKind::sgd_step);
      ++steps;
    }
  EXPECT_EQ(steps, m.graph.parameters().size());
  EXPECT_THROW(optimizer_from_name("adagrad"), std::invalid_argument);
}

}  // namespace
}  // namespace ipupod::models

namespace ipupod::models {
namespace {

// The rate each schedule gives at steps 1..n (read back from the lr_schedule op's output).
std::vector<float> rates(const LrSchedule& schedule, int steps) {
  Graph g;
  const ValueId p = g.parameter("p", {DType::f32, {1}}, 1.0);
  const ValueId grad = g.input("grad", {DType::f32, {1}});
  OptimizerOptions o;
  o.kind = OptimizerKind::sgd_momentum;
  o.momentum = 0;
  o.schedule = schedule;
  build_optimizer(g, {{p, grad}}, 0.1, o);
  ValueId lr = -1;
  for (const Op& op : g.ops())
    if (op.kind == OpKind::lr_schedule) lr = *op.output;
  Interpreter in(g);
  in.set(grad, Buffer::zeros(g.info(grad)));
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) {
    in.run({Phase::optimizer});
    out.push_back(in.get(lr).f[0]);
  }
  return out;
}

TEST(Optimizers, ScheduleShapes) {
  LrSchedule step;
  step.kind = ScheduleKind::step;
  step.step_size = 2;
  step.gamma = 0.5;
  const auto s = rates(step, 5);
  EXPECT_FLOAT_EQ(s[0], 0.1f);
  EXPECT_FLOAT_EQ(s[1], 0.1f);
  EXPECT_FLOAT_EQ(s[2], 0.05f);
  EXPECT_FLOAT_EQ(s[4], 0.025f);
  LrSchedule cosine;
  cosine.kind = ScheduleKind::cosine;
  cosine.warmup_steps = 2;
  cosine.total_steps = 6;
  cosine.min_lr = 0.01;
  const auto c = rates(cosine, 8);
  EXPECT_FLOAT_EQ(c[0], 0.05f);  // warm-up: lr * 1/2, lr * 2/2
  EXPECT_FLOAT_EQ(c[1], 0.1f);
  EXPECT_FLOAT_EQ(c[2], 0.1f);      // cosine starts at the full rate
  EXPECT_NEAR(c[4], 0.055f, 1e-6);  // half-way: (lr + min) / 2
  EXPECT_FLOAT_EQ(c[6], 0.01f);     // and stays at min_lr after total_steps
  EXPECT_FLOAT_EQ(c[7], 0.01f);
}

}  // namespace
}  // namespace ipupod::models

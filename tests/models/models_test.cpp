// The model IR: shape errors that name the op, gradients checked by finite differences, and
// the reference interpreter learning on a fixed batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/autodiff.hpp"
#include "models/interpreter.hpp"
#include "models/zoo.hpp"

namespace ipupod::models {
namespace {

TEST(Ir, ShapeMismatchNamesOpInputsAndShapes) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {4, 3}});
  ValueId b = g.input("b", {DType::f32, {5, 2}});
  try {
    g.matmul(a, b, false, false, "proj");
    FAIL() << "expected an IrError";
  } catch (const IrError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MatMul 'proj'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("float32[4,3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("float32[5,2]"), std::string::npos) << msg;
  }
  EXPECT_THROW(g.add_bias(a, g.input("bias", {DType::f32, {4}})), IrError);
}

TEST(Zoo, UnknownModelListsKnownOnes) {
  ModelOptions o;
  o.sample_shape = {4};
  try {
    build_model("resnet-5000", o);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("known models: mlp"), std::string::npos);
  }
}

struct Fixture {
  Model model;
  Buffer x, y;
  explicit Fixture(std::vector<std::size_t> hidden) {
    ModelOptions o;
    o.micro_batch = 5;
    o.sample_shape = {2, 3};
    o.classes = 4;
    o.hidden = std::move(hidden);
    o.learning_rate = 0.1;
    model = build_model("mlp", o);
    x = Buffer::zeros(model.graph.info(model.input));
    y = Buffer::zeros(model.graph.info(model.labels));
    std::mt19937 gen(7);
    std::normal_distribution<float> d;
    for (auto& v : x.f) v = d(gen);
    for (std::size_t i = 0; i < y.i.size(); ++i) y.i[i] = static_cast<std::int32_t>(i % 4);
  }
};

TEST(Autodiff, GradientsMatchFiniteDifferences) {
  Fixture f({6, 5});
  Interpreter interp(f.model.graph, 3);
  interp.set(f.model.input, f.x);
  interp.set(f.model.labels, f.y);
  interp.run({Phase::forward, Phase::backward});
  std::size_t checked = 0;
  for (auto [param, grad] : f.model.gradients) {
    const Buffer analytic = interp.get(grad);
    const Buffer original = interp.get(param);
    for (std::size_t i = 0; i < original.f.size(); i += 3) {
      const float eps = 1e-2f;
      double losses[2];
      for (int s = 0; s < 2; ++s) {
        Buffer p = original;
        p.f[i] += s ? -eps : eps;
        Interpreter probe(f.model.graph, 3);
        for (auto [q, unused] : f.model.gradients) probe.set(q, q == param ? p : interp.get(q));
        probe.set(f.model.input, f.x);
        probe.set(f.model.labels, f.y);
        probe.run({Phase::forward});
        losses[s] = probe.get(f.model.loss).f[0];
      }
      const double numeric = (losses[0] - losses[1]) / (2 * eps);
      EXPECT_NEAR(analytic.f[i], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << f.model.graph.value(param).name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20u);
}

// A parameter read on stage 0 with its gradient stopped (a GAN's discriminator judging the
// generator's images) and read again on stage 1: its gradient ends on stage 0, where the
// optimizer updates it (the pipeline carries the sum over), and is the later reader's.
TEST(Autodiff, AParametersGradientEndsOnItsOwnStage) {
  Graph g;
  g.set_stage(0);
  const ValueId x = g.input("x", {DType::f32, {2, 3}});
  const ValueId w = g.parameter("w", {DType::f32, {3, 3}}, 0.5);
  const ValueId h = g.matmul(x, g.stop_gradient(w, "w_held"), false, false, "h");
  g.set_stage(1);
  const ValueId y = g.matmul(h, w, false, false, "y");
  const ValueId loss = g.reduce_sum(y, {0, 1}, false, 1.0, "loss");
  const auto grads = build_backward(g, loss);
  EXPECT_EQ(g.producer(w).pipeline_stage, 0);
  EXPECT_EQ(g.producer(grads.at(w)).pipeline_stage, 0);
  // d loss / d w = h^T 1 (h held): each row i of the gradient is the sum of column i of h.
  Interpreter in(g, 1);
  Buffer xb = Buffer::zeros(g.info(x));
  xb.f = {1, 2, 3, -1, 0, 2};
  in.set(x, xb);
  in.run({Phase::forward, Phase::backward});
  const Buffer hb = in.get(h), gw = in.get(grads.at(w));
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      EXPECT_FLOAT_EQ(gw.f[i * 3 + j], hb.f[i] + hb.f[3 + i]) << i << "," << j;
}

TEST(Interpreter, SgdStepsLowerTheLossOnAFixedBatch) {
  Fixture f({16});
  Interpreter interp(f.model.graph, 1);
  interp.set(f.model.input, f.x);
  interp.set(f.model.labels, f.y);
  interp.run();
  const float first = interp.get(f.model.loss).f[0];
  for (int i = 0; i < 50; ++i) interp.run();
  const float later = interp.get(f.model.loss).f[0];
  EXPECT_LT(later, 0.5f * first) << "first " << first << " later " << later;
}

TEST(Interpreter, DeterministicInitialisationDependsOnSeedOnly) {
  Fixture f({8});
  const ValueId p = f.model.graph.parameters().front();
  const Buffer a = initial_parameter(f.model.graph, p, 42),
               b = initial_parameter(f.model.graph, p, 42);
  const Buffer c = initial_parameter(f.model.graph, p, 43);
  EXPECT_EQ(a.f, b.f);
  EXPECT_NE(a.f, c.f);
  const double bound = 1.0 / std::sqrt(6.0);
  for (float v : a.f) EXPECT_LE(std::abs(v), bound);
}

}  // namespace
}  // namespace ipupod::models

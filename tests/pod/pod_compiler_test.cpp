// The pod compiler against the reference interpreter: one replica, one stage, gradient
// accumulation and device iterations, weights and losses compared step for step.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ipu_process/engine.hpp"
#include "models/interpreter.hpp"
#include "pod/compiler.hpp"

namespace ipupod::pod {
namespace {

TEST(Compiler, OneReplicaMatchesTheInterpreterStepForStep) {
  models::ModelOptions o;
  o.micro_batch = 6;
  o.sample_shape = {1, 5, 7};
  o.classes = 4;
  o.hidden = {13, 9};
  o.learning_rate = 0.2;
  const models::Model model = models::build_model("mlp", o);
  const std::size_t accumulation = 3, iterations = 2, seed = 11;
  CompiledModel compiled =
      compile_for_ipu(model, ipu::ArchPreset::get("tiny"), {accumulation, iterations, 1});
  ipu::Engine engine(*compiled.graph, compiled.programs);
  models::Interpreter reference(model.graph, seed);
  for (const auto& [id, tensor] : compiled.parameters)
    engine.write(tensor, std::as_bytes(std::span(reference.get(id).f)));
  for (const auto& [tensor, value] : compiled.constants) {
    std::vector<float> fill(tensor.elements(), value);
    engine.write(tensor, std::as_bytes(std::span(fill)));
  }

  // The same micro-batches for both: random inputs, labels cycling through the classes.
  const std::size_t micro_batches = accumulation * iterations;
  std::vector<models::Buffer> xs, ys;
  std::mt19937 gen(5);
  std::normal_distribution<float> d;
  for (std::size_t b = 0; b < micro_batches; ++b) {
    xs.push_back(models::Buffer::zeros(model.graph.info(model.input)));
    ys.push_back(models::Buffer::zeros(model.graph.info(model.labels)));
    for (auto& v : xs.back().f) v = d(gen);
    for (std::size_t i = 0; i < o.micro_batch; ++i)
      ys.back().i[i] = static_cast<std::int32_t>((i + b) % o.classes);
  }
  std::size_t next_x = 0, next_y = 0;
  std::vector<float> device_losses;
  engine.connect_input_stream(kInputStream, [&](std::span<std::byte> dst) {
    std::memcpy(dst.data(), xs.at(next_x++).f.data(), dst.size());
  });
  engine.connect_input_stream(kLabelStream, [&](std::span<std::byte> dst) {
    std::memcpy(dst.data(), ys.at(next_y++).i.data(), dst.size());
  });
  engine.connect_output_stream(kLossStream, [&](std::span<const std::byte> src) {
    float v;
    std::memcpy(&v, src.data(), sizeof v);
    device_losses.push_back(v);
  });
  engine.run("train");
  ASSERT_EQ(device_losses.size(), micro_batches);

  // Reference: accumulate each step's gradients, then one SGD update with their mean.
  for (std::size_t step = 0; step < iterations; ++step) {
    std::map<models::ValueId, std::vector<float>> sum;
    for (std::size_t k = 0; k < accumulation; ++k) {
      const std::size_t b = step * accumulation + k;
      reference.set(model.input, xs[b]);
      reference.set(model.labels, ys[b]);
      reference.run({models::Phase::forward, models::Phase::backward});
      EXPECT_NEAR(device_losses[b], reference.get(model.loss).f[0], 1e-5) << "micro-batch " << b;
      for (auto [param, grad] : model.gradients) {
        auto& s = sum[param];
        const auto& g = reference.get(grad).f;
        s.resize(g.size());
        for (std::size_t i = 0; i < g.size(); ++i) s[i] += g[i];
      }
    }
    for (auto& [param, s] : sum) {
      models::Buffer p = reference.get(param);
      for (std::size_t i = 0; i < s.size(); ++i)
        p.f[i] -= static_cast<float>(o.learning_rate / accumulation) * s[i];
      reference.set(param, p);
    }
  }
  for (const auto& [id, tensor] : compiled.parameters) {
    const auto bytes = engine.read(tensor);
    std::vector<float> device(bytes.size() / 4);
    std::memcpy(device.data(), bytes.data(), bytes.size());
    const auto& expected = reference.get(id).f;
    ASSERT_EQ(device.size(), expected.size());
    for (std::size_t i = 0; i < device.size(); ++i)
      ASSERT_NEAR(device[i], expected[i], 1e-5) << model.graph.value(id).name << "[" << i << "]";
  }
  EXPECT_GT(engine.cycles().compute, 0u);
  EXPECT_GT(engine.cycles().host, 0u);
}

}  // namespace
}  // namespace ipupod::pod

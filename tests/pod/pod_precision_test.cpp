// --precision fp16 in the pod compiler: an MLP trains on float16 weights and activations (loss
// falling, close to the float32 run but not bitwise), with half the bytes in tile memory, with
// stochastic rounding, with static loss scaling, and over pipeline stages like on one IPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "ipu_process/engine.hpp"
#include "models/interpreter.hpp"
#include "pod/compiler/compiler.hpp"
#include "tests/ipu/mailbox.hpp"

namespace ipupod::pod {
namespace {

struct Precision {
  bool float16 = false;
  ipu::Rounding rounding = ipu::Rounding::nearest_even;
  double loss_scale = 1;
  double learning_rate = 0.05;
  std::size_t stages = 1;  // pipeline stages (grouped schedule), one engine and thread each
  std::size_t gradient_accumulation = 1;
  bool recompute = false;
  models::OptimizerKind optimizer = models::OptimizerKind::sgd;
  double clip_norm = 0;
};

struct TrainingRun {
  std::vector<float> losses;                                   // one per micro-batch
  std::map<std::string, std::vector<float>> initial, weights;  // as stored on the device
  std::map<ipu::MemoryCategory, std::size_t> bytes;  // over all tiles, before liveness sharing
};

constexpr std::size_t kClasses = 4, kMicroBatch = 16;

// Trains an MLP on a learnable task (each class a Gaussian blob around its own centre) for
// `steps` SGD steps on tiny IPUs, from the same initial weights and data whatever the
// precision.
TrainingRun train_mlp(const Precision& p, std::size_t steps) {
  models::ModelOptions o;
  o.micro_batch = kMicroBatch;
  o.sample_shape = {1, 6, 6};
  o.classes = kClasses;
  o.hidden = {48, 24};
  o.learning_rate = p.learning_rate;
  o.optimizer.loss_scale = p.loss_scale;
  o.optimizer.kind = p.optimizer;
  o.optimizer.clip_global_norm = p.clip_norm;
  o.pipeline_stages = p.stages;
  const models::Model model = models::build_model("mlp", o);
  std::vector<CompiledModel> compiled;
  std::vector<std::unique_ptr<ipu::Engine>> engines;
  testing_support::Mailbox mail(static_cast<unsigned>(p.stages));
  TrainingRun run;
  for (std::size_t s = 0; s < p.stages; ++s) {
    compiled.push_back(compile_for_ipu(model, ipu::ArchPreset::get("tiny"),
                                       {.gradient_accumulation = p.gradient_accumulation,
                                        .stages = p.stages,
                                        .stage = s,
                                        .recompute = p.recompute,
                                        .float16 = p.float16}));
    engines.push_back(std::make_unique<ipu::Engine>(
        *compiled[s].graph, compiled[s].programs,
        ipu::EngineOptions{.float16_stores = {.rounding = p.rounding, .seed = 5}}));
    ipu::Engine& engine = *engines[s];
    engine.bind_collectives(mail.binding(static_cast<unsigned>(s)));
    for (const auto& [id, tensor] : compiled[s].initial_values)
      engine.write_values(tensor, models::initial_parameter(model.graph, id, 3).f);
    for (const auto& [tensor, value] : compiled[s].constants)
      engine.write_values(tensor, std::vector<float>(tensor.elements(), value));
    for (const auto& [id, tensor] : compiled[s].parameters)
      run.initial[model.graph.value(id).name] = engine.read_values(tensor);
    for (const auto& tile : engine.memory().tiles)
      for (const auto& [category, bytes] : tile.by_category) run.bytes[category] += bytes;
  }

  const std::size_t features = 36;
  std::mt19937 gen(17);
  std::normal_distribution<float> normal;
  std::vector<float> centres(kClasses * features);
  for (auto& c : centres) c = normal(gen);
  std::vector<std::int32_t> labels(kMicroBatch);
  ipu::Engine& first = *engines[0];
  first.connect_input_stream(kInputStream, [&](std::span<std::byte> dst) {
    std::vector<float> x(kMicroBatch * features);
    for (std::size_t i = 0; i < kMicroBatch; ++i) {
      labels[i] = static_cast<std::int32_t>(gen() % kClasses);
      for (std::size_t f = 0; f < features; ++f)
        x[i * features + f] = centres[labels[i] * features + f] + 1.5F * normal(gen);
    }
    std::memcpy(dst.data(), x.data(), dst.size());
  });
  first.connect_input_stream(kLabelStream, [&](std::span<std::byte> dst) {
    std::memcpy(dst.data(), labels.data(), dst.size());
  });
  first.connect_output_stream(kLossStream, [&](std::span<const std::byte> src) {
    float v;
    std::memcpy(&v, src.data(), sizeof v);
    run.losses.push_back(v);
  });
  std::vector<std::thread> later;
  for (std::size_t s = 1; s < p.stages; ++s)
    later.emplace_back([&, s] {
      for (std::size_t i = 0; i < steps; ++i) engines[s]->run("train");
    });
  for (std::size_t i = 0; i < steps; ++i) first.run("train");
  for (auto& t : later) t.join();
  for (std::size_t s = 0; s < p.stages; ++s)
    for (const auto& [id, tensor] : compiled[s].parameters)
      run.weights[model.graph.value(id).name] = engines[s]->read_values(tensor);
  return run;
}

double mean(const std::vector<float>& v, std::size_t begin, std::size_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, 0.0) / double(end - begin);
}

constexpr std::size_t kSteps = 60;

TEST(Float16Training, LearnsCloseToFloat32WithHalfTheBytes) {
  const TrainingRun fp32 = train_mlp({}, kSteps);
  const TrainingRun fp16 = train_mlp({.float16 = true}, kSteps);
  ASSERT_EQ(fp16.losses.size(), kSteps);
  const double first = mean(fp16.losses, 0, 10), last = mean(fp16.losses, kSteps - 10, kSteps);
  EXPECT_LT(last, 0.5 * first) << "the float16 run learns";
  const double last32 = mean(fp32.losses, kSteps - 10, kSteps);
  EXPECT_NEAR(last, last32, 0.1 * last32) << "and lands close to the float32 run";
  bool differs = false;
  for (const auto& [name, w] : fp32.weights) {
    const auto& h = fp16.weights.at(name);
    for (std::size_t i = 0; i < w.size(); ++i) {
      differs = differs || h[i] != w[i];
      ASSERT_NEAR(h[i], w[i], 0.05 + 0.05 * std::abs(w[i])) << name << "[" << i << "]";
    }
  }
  EXPECT_TRUE(differs) << "float16 arithmetic cannot be bitwise float32's";

  // Parameters are float16 (the constants beside them stay float32); activations mostly so.
  using ipu::MemoryCategory;
  const double weights =
      double(fp16.bytes.at(MemoryCategory::weight)) / double(fp32.bytes.at(MemoryCategory::weight));
  const double activations = double(fp16.bytes.at(MemoryCategory::activation)) /
                             double(fp32.bytes.at(MemoryCategory::activation));
  EXPECT_NEAR(weights, 0.5, 0.05);
  EXPECT_LT(activations, 0.6);
  EXPECT_EQ(fp16.bytes.at(MemoryCategory::optimizer_state),
            fp32.bytes.at(MemoryCategory::optimizer_state))
      << "gradient accumulators stay float32";
}

// How much of the float32 run's weight updates a run reproduces: the projection of its updates
// on the float32 run's (1: all of them, on average; 0: none).
double share_of_float32_updates(const TrainingRun& run, const TrainingRun& fp32) {
  double dot = 0, norm = 0;
  for (const auto& [name, w] : fp32.weights)
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double want = w[i] - fp32.initial.at(name)[i];
      dot += (run.weights.at(name)[i] - run.initial.at(name)[i]) * want;
      norm += want * want;
    }
  return dot / norm;
}

// Updates far smaller than the spacing of float16 weights: rounding to nearest drops them,
// stochastic rounding keeps them on average.
TEST(Float16Training, StochasticRoundingKeepsUpdatesThatNearestRoundingLoses) {
  const double rate = 0.00005;
  const std::size_t steps = 40;
  const TrainingRun fp32 = train_mlp({.learning_rate = rate}, steps);
  const TrainingRun nearest = train_mlp({.float16 = true, .learning_rate = rate}, steps);
  const TrainingRun stochastic = train_mlp(
      {.float16 = true, .rounding = ipu::Rounding::stochastic, .learning_rate = rate}, steps);
  const double kept_nearest = share_of_float32_updates(nearest, fp32);
  const double kept_stochastic = share_of_float32_updates(stochastic, fp32);
  EXPECT_NEAR(kept_stochastic, 1.0, 0.15);
  EXPECT_LT(kept_nearest, 0.5);
}

TEST(Float16Training, LossScalingDividesOutOfTheUpdates) {
  // A power of two scales float32 gradients exactly: the same training up to the update's
  // rounding.
  const TrainingRun plain = train_mlp({}, 10);
  const TrainingRun scaled = train_mlp({.loss_scale = 1024}, 10);
  for (std::size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_NEAR(scaled.losses[i], plain.losses[i], 1e-5) << "step " << i;
  // float16 with a loss scale learns like float32.
  const TrainingRun fp32 = train_mlp({}, kSteps);
  const TrainingRun fp16 = train_mlp({.float16 = true, .loss_scale = 256}, kSteps);
  const double last = mean(fp16.losses, kSteps - 10, kSteps);
  EXPECT_NEAR(last, mean(fp32.losses, kSteps - 10, kSteps), 0.1 * last);
  // A scale past float16's range overflows the backward pass: the loss stops being finite.
  const TrainingRun overflow = train_mlp({.float16 = true, .loss_scale = 1e9}, 3);
  EXPECT_FALSE(std::isfinite(overflow.losses.back())) << overflow.losses.back();
}

// The float16 plan is the same on every stage: values cross between stages as float16 where
// they are, and three stages train bitwise like one, stashing or recomputing activations.
TEST(Float16Training, PipelinedStagesTrainLikeOneIpu) {
  const Precision one{.float16 = true, .gradient_accumulation = 3};
  const TrainingRun a = train_mlp(one, 4);
  ASSERT_EQ(a.losses.size(), 12u);
  EXPECT_LT(mean(a.losses, 9, 12), mean(a.losses, 0, 3));
  for (bool recompute : {false, true}) {
    Precision split = one;
    split.stages = 3;
    split.recompute = recompute;
    const TrainingRun b = train_mlp(split, 4);
    EXPECT_EQ(a.losses, b.losses) << "recompute " << recompute;
    EXPECT_EQ(a.weights, b.weights) << "recompute " << recompute;
  }
}

// The stateful optimizers (float32 moments) update float16 weights in place, with loss scaling
// and clipping folded into the same factor.
TEST(Float16Training, StatefulOptimizersUpdateFloat16Weights) {
  using models::OptimizerKind;
  for (const OptimizerKind kind :
       {OptimizerKind::sgd_momentum, OptimizerKind::adam, OptimizerKind::lamb}) {
    const Precision p{.float16 = true,
                      .rounding = ipu::Rounding::stochastic,
                      .loss_scale = 128,
                      .learning_rate = kind == OptimizerKind::adam ? 0.005 : 0.02,
                      .optimizer = kind,
                      .clip_norm = 5};
    const TrainingRun run = train_mlp(p, 30);
    EXPECT_LT(mean(run.losses, 20, 30), 0.6 * mean(run.losses, 0, 10))
        << models::optimizer_name(kind);
  }
}

}  // namespace
}  // namespace ipupod::pod

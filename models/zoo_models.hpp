// Builders of the zoo's forward graphs (internal to models/): each sets the model's input,
// labels, main output and loss; build_model adds the backward and optimizer phases.
#pragma once

#include <cmath>
#include <string>

#include "models/layers.hpp"
#include "models/zoo.hpp"

namespace ipupod::models::zoo_impl {

void build_mlp(Model& m, Builder& b, const ModelOptions& o);
void build_cnn(Model& m, Builder& b, const ModelOptions& o);
void build_resnet50(Model& m, Builder& b, const ModelOptions& o);
void build_efficientnetv2_s(Model& m, Builder& b, const ModelOptions& o);
void build_hae(Model& m, Builder& b, const ModelOptions& o);
void build_transcyclegan(Model& m, Builder& b, const ModelOptions& o);

// One (Fused-)MBConv block of EfficientNetV2 (conv + BN + SiLU units, squeeze-and-excitation,
// residual with stochastic depth when stride 1 and in == out); the golden test checks it
// against PyTorch.
struct EfficientNetBlock {
  bool fused = false;
  std::size_t expansion = 1, kernel = 3, in = 0, out = 0, stride = 1;
  double drop = 0;  // stochastic-depth probability
};
ValueId efficientnet_block(Builder& b, ValueId x, const EfficientNetBlock& spec);

// Channels scaled by the width option, at least `minimum` and a multiple of `multiple`.
inline std::size_t scaled(std::size_t channels, double width, std::size_t multiple = 1,
                          std::size_t minimum = 1) {
  auto c = static_cast<std::size_t>(std::llround(static_cast<double>(channels) * width));
  c = (c + multiple - 1) / multiple * multiple;
  return std::max(c, std::max(minimum, multiple));
}
inline std::size_t repeats(std::size_t n, double depth) {
  return std::max<std::size_t>(1,
                               static_cast<std::size_t>(std::ceil(static_cast<double>(n) * depth)));
}
// The sample shape to use: the option if given, else the model's default.
Shape sample_shape_or(const ModelOptions& o, Shape fallback);
// Stage of unit i of `units` when they are split evenly over `stages`.
int even_stage(std::size_t i, std::size_t units, std::size_t stages);

}  // namespace ipupod::models::zoo_impl

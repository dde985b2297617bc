// EfficientNetV2-S with the conductivity regression head (arXiv 2404.10730): FusedMBConv and
// MBConv stages like torchvision's, BN eps 1e-3, stochastic depth 0.2 scaled by block index.
#include <stdexcept>

#include "models/zoo_models.hpp"

namespace ipupod::models::zoo_impl {
namespace {

struct StageSpec {
  bool fused;
  std::size_t expansion, kernel, stride, in, out, repeats;
};
constexpr StageSpec kStages[] = {
    {true, 1, 3, 1, 24, 24, 2},   {true, 4, 3, 2, 24, 48, 4},    {true, 4, 3, 2, 48, 64, 4},
    {false, 4, 3, 2, 64, 128, 6}, {false, 6, 3, 1, 128, 160, 9}, {false, 6, 3, 2, 160, 256, 15},
};
constexpr double kBnEps = 1e-3;

ValueId conv_bn(Builder& b, ValueId x, std::size_t out, std::size_t k, std::size_t stride,
                std::size_t groups, bool act, const std::string& name) {
  Scope s(b, name);
  x = nn::conv2d(b, x,
                 {.out_channels = out,
                  .kernel = k,
                  .stride = stride,
                  .padding = (k - 1) / 2,
                  .groups = groups,
                  .bias = false},
                 "0");
  x = nn::batch_norm2d(b, x, kBnEps, 0.1, "1");
  return act ? nn::silu(b, x) : x;
}

// Which of the 8 feature children (stem, 6 stages, head conv) sits on which stage.
std::vector<int> feature_stages(std::size_t stages) {
  switch (stages) {
    case 1:
      return {0, 0, 0, 0, 0, 0, 0, 0};
    case 2:
      return {0, 0, 0, 0, 0, 0, 1, 1};  // [6, 2]
    case 4:
      return {0, 0, 0, 0, 0, 1, 2, 3};  // [5, 1, 1, 1]
    case 8:
      return {0, 1, 2, 3, 4, 5, 6, 7};  // [1] * 8
    default:
      throw std::invalid_argument(
          "efficientnetv2_s splits over 1, 2, 4 or 8 pipeline stages "
          "(as in arXiv 2404.10730), got " +
          std::to_string(stages));
  }
}

}  // namespace

ValueId efficientnet_block(Builder& b, ValueId x, const EfficientNetBlock& spec) {
  Graph& g = b.graph();
  const std::size_t hidden = spec.in * spec.expansion;
  ValueId h = x;
  Scope s(b, "block");
  if (spec.fused) {
    if (spec.expansion == 1) {
      h = conv_bn(b, h, spec.out, spec.kernel, spec.stride, 1, true, "0");
    } else {
      h = conv_bn(b, h, hidden, spec.kernel, spec.stride, 1, true, "0");
      h = conv_bn(b, h, spec.out, 1, 1, 1, false, "1");
    }
  } else {
    h = conv_bn(b, h, hidden, 1, 1, 1, true, "0");
    h = conv_bn(b, h, hidden, spec.kernel, spec.stride, hidden, true, "1");
    h = nn::squeeze_excitation(b, h, std::max<std::size_t>(1, spec.in / 4), "2");
    h = conv_bn(b, h, spec.out, 1, 1, 1, false, "3");
  }
  if (spec.stride == 1 && spec.in == spec.out) {
    h = nn::stochastic_depth(b, h, spec.drop);
    h = g.binary(BinaryFn::add, h, x, b.name("residual"));
  }
  return h;
}

void build_efficientnetv2_s(Model& m, Builder& b, const ModelOptions& o) {
  Graph& g = m.graph;
  const Shape sample = sample_shape_or(o, {3, 256, 256});
  if (sample.size() != 3)
    throw std::invalid_argument("efficientnetv2_s takes [channels, height, width] samples, got " +
                                shape_str(sample));
  const std::vector<int> stage_of = feature_stages(o.pipeline_stages);
  Shape in_shape = {o.micro_batch};
  in_shape.insert(in_shape.end(), sample.begin(), sample.end());
  m.input = g.input("input", {DType::f32, in_shape});
  m.labels = g.input("labels", {DType::f32, {o.micro_batch, 1}});
  m.task = Task::regression;
  const auto ch = [&](std::size_t c) { return scaled(c, o.width, 8); };

  std::size_t total_blocks = 0;
  for (const auto& st : kStages) total_blocks += repeats(st.repeats, o.depth);
  g.set_stage(stage_of[0]);
  ValueId x;
  {
    Scope s(b, "features.0");
    x = conv_bn(b, m.input, ch(24), 3, 2, 1, true, "");
  }
  std::size_t index = 0;
  for (std::size_t si = 0; si < 6; ++si) {
    const StageSpec& st = kStages[si];
    g.set_stage(stage_of[si + 1]);
    for (std::size_t r = 0; r < repeats(st.repeats, o.depth); ++r, ++index) {
      Scope s(b, "features." + std::to_string(si + 1) + "." + std::to_string(r));
      const std::size_t in = r == 0 ? ch(st.in) : ch(st.out);
      const double drop = 0.2 * static_cast<double>(index) / static_cast<double>(total_blocks);
      x = efficientnet_block(
          b, x, {st.fused, st.expansion, st.kernel, in, ch(st.out), r == 0 ? st.stride : 1, drop});
    }
  }
  g.set_stage(stage_of[7]);
  {
    Scope s(b, "features.7");
    x = conv_bn(b, x, ch(1280), 1, 1, 1, true, "");
  }
  x = nn::adaptive_avg_pool2d(b, x, 1, 1);
  x = g.reshape(x, {o.micro_batch, g.info(x).shape[1]}, "flatten");
  x = nn::linear(b, x, ch(320), true, "head.0");
  m.logits = nn::linear(b, x, 1, true, "head.1");
  m.loss = nn::l1_loss(b, m.logits, m.labels);
}

}  // namespace ipupod::models::zoo_impl

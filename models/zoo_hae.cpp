// The hierarchical VQ autoencoder for climate-field patches (Le & Tao, arXiv 2307.04216), built
// from REFERENCES.md: GDN DownResBlocks, two EMA vector quantisers, an inverse-GDN decoder.
#include <stdexcept>

#include "models/zoo_models.hpp"

namespace ipupod::models::zoo_impl {
namespace {

nn::Conv2dOptions conv(std::size_t out, std::size_t k, std::size_t stride = 1, bool bias = false) {
  return {.out_channels = out, .kernel = k, .stride = stride, .padding = k / 2, .bias = bias};
}

// GDN, then a strided 1x1 shortcut plus kxk conv -> 1x1 expand x4 -> GELU -> 1x1 project.
ValueId down_res_block(Builder& b, ValueId x, std::size_t out, std::size_t k, std::size_t s,
                       const std::string& name) {
  Scope scope(b, name);
  const ValueId h = nn::gdn(b, x, false, "gdn");
  const ValueId shortcut = nn::conv2d(b, h, conv(out, 1, s), "shortcut");
  ValueId y = nn::conv2d(b, h, conv(out, k, s), "conv1");
  y = nn::gelu(b, nn::conv2d(b, y, conv(4 * out, 1), "conv2"));
  y = nn::conv2d(b, y, conv(out, 1), "conv3");
  return b.graph().binary(BinaryFn::add, shortcut, y, b.name("residual"));
}

// The mirror image: inverse GDN, transposed strided convolutions up by s.
ValueId up_res_block(Builder& b, ValueId x, std::size_t out, std::size_t k, std::size_t s,
                     const std::string& name) {
  Scope scope(b, name);
  const ValueId h = nn::gdn(b, x, true, "igdn");
  const ValueId shortcut = nn::conv_transpose2d(b, h, out, 1, s, 0, s - 1, false, "shortcut");
  ValueId y = nn::conv_transpose2d(b, h, out, k, s, k / 2, s - 1, false, "conv1");
  y = nn::gelu(b, nn::conv2d(b, y, conv(4 * out, 1), "conv2"));
  y = nn::conv2d(b, y, conv(out, 1), "conv3");
  return b.graph().binary(BinaryFn::add, shortcut, y, b.name("residual"));
}

}  // namespace

void build_hae(Model& m, Builder& b, const ModelOptions& o) {
  Graph& g = m.graph;
  const Shape sample = sample_shape_or(o, {1, 64, 64});
  if (sample.size() != 3 || sample[0] != 1 || sample[1] != sample[2] || sample[1] % 32 != 0)
    throw std::invalid_argument(
        "hae takes single-channel square patches whose side is a multiple of 32 ([1, 64, 64] "
        "in the paper), got " +
        shape_str(sample) + "; pass an empty sample shape for the default");
  const Shape shape = {o.micro_batch, 1, sample[1], sample[2]};
  m.input = g.input("input", {DType::f32, shape});
  // The climate data set's targets: channel 0 the field to reconstruct, channel 1 its mask (1
  // where the value is real, 0 on land or where it was missing).
  m.labels = g.input("targets", {DType::f32, {o.micro_batch, 2, sample[1], sample[2]}});
  m.task = Task::reconstruction;
  const std::size_t c = scaled(64, o.width), code = scaled(128, o.width);
  const std::size_t codes = scaled(256, o.width, 1, 8);
  const int decoder_stage = o.pipeline_stages > 1 ? 1 : 0;

  ValueId x;
  {
    Scope s(b, "pre");
    x = nn::gelu(b,
                 nn::conv2d(b, m.input, {.out_channels = scaled(32, o.width), .kernel = 1}, "0"));
    x = nn::gelu(b, nn::conv2d(b, x, {.out_channels = c, .kernel = 4, .same = true}, "2"));
    x = nn::conv2d(b, x, {.out_channels = c, .kernel = 3, .padding = 1}, "4");
  }
  for (int i = 0; i < 3; ++i) x = down_res_block(b, x, c, 5, 2, "encoder0." + std::to_string(i));
  const ValueId y_enc = nn::conv2d(b, x, conv(code, 3, 1, true), "encoder0.out");
  ValueId z = down_res_block(b, x, code, 5, 2, "encoder1.0");
  const ValueId z_enc = nn::conv2d(b, z, conv(code, 3, 1, true), "encoder1.out");

  const nn::Quantized zq = nn::vector_quantizer(b, z_enc, codes, 0.99, 0.25, "vq1");
  const ValueId up_z = nn::conv_transpose2d(b, zq.quantized, code, 5, 2, 2, 1, true, "prior_up");
  const ValueId y_in = g.binary(BinaryFn::add, y_enc, up_z, "y_plus_prior");
  const nn::Quantized yq = nn::vector_quantizer(b, y_in, codes, 0.99, 0.25, "vq0");

  g.set_stage(decoder_stage);
  ValueId dz = nn::conv_transpose2d(b, zq.quantized, code, 3, 1, 1, 0, true, "decoder1.in");
  dz = up_res_block(b, dz, c, 3, 2, "decoder1.up");
  const ValueId dy = nn::conv_transpose2d(b, yq.quantized, c, 3, 1, 1, 0, true, "decoder0.in");
  ValueId d = g.binary(BinaryFn::add, dz, dy, "decoder0.join");
  for (int i = 0; i < 3; ++i) d = up_res_block(b, d, c, 3, 2, "decoder0." + std::to_string(i));
  {
    Scope s(b, "post");
    d = nn::conv_transpose2d(b, nn::gelu(b, d), scaled(32, o.width), 3, 1, 1, 0, true, "1");
    m.logits = nn::conv_transpose2d(b, nn::gelu(b, d), 1, 1, 1, 0, 0, true, "3");
  }
  const ValueId field = g.slice(m.labels, 1, 0, 1, "target_field");
  const ValueId mask = g.slice(m.labels, 1, 1, 2, "target_mask");
  const ValueId mse = nn::mse_loss(b, m.logits, field, mask);
  const ValueId vq = g.binary(BinaryFn::add, zq.loss, yq.loss, "vq_loss");
  const ValueId weighted = g.binary(BinaryFn::mul, mse, b.scalar(3.0), "reconstruction_loss");
  m.loss = g.binary(BinaryFn::add, weighted, vq, "loss");
  m.metrics = {{"mse", mse}, {"vq_loss", vq}};
  // Each patch is stored as its two code grids (side / 8 and side / 16 cells) of log2(codes)
  // bits each, against 32 bits per input value (before any entropy coding).
  const double grid = static_cast<double>(sample[1]) / 8;
  const double code_bits = (grid * grid + grid * grid / 4) * std::log2(static_cast<double>(codes));
  m.compression_ratio = static_cast<double>(sample[1] * sample[2]) * 32 / code_bits;
}

}  // namespace ipupod::models::zoo_impl

// TransCycleGAN for x4 super-resolution: transformer generators (patch embedding, pixel-shuffle
// upsampling) and multi-scale transformer discriminators, trained as one graph: the generator
// loss reads the discriminators through stop_gradient, the discriminator loss reads detached
// fakes, so one backward pass gives each network only its own gradient.
#include <stdexcept>

#include "models/zoo_models.hpp"

namespace ipupod::models::zoo_impl {
namespace {

struct Dims {
  std::size_t g0, g1, g2, d;  // generator widths per resolution, discriminator width
  std::size_t g_blocks[3], d_blocks;
  std::size_t heads = 4;
};

// [n, c, h, w] <-> [n, h*w, c]
ValueId to_tokens(Graph& g, ValueId x, const std::string& name) {
  const Shape s = g.info(x).shape;
  const ValueId t = g.permute(x, {0, 2, 3, 1}, name + "/channels_last");
  return g.reshape(t, {s[0], s[2] * s[3], s[1]}, name + "/tokens");
}
ValueId to_image(Graph& g, ValueId x, std::size_t h, std::size_t w, const std::string& name) {
  const Shape s = g.info(x).shape;
  const ValueId t = g.reshape(x, {s[0], h, w, s[2]}, name + "/grid");
  return g.permute(t, {0, 3, 1, 2}, name + "/channels_first");
}

ValueId add_positions(Builder& b, ValueId tokens, const std::string& name) {
  const Shape s = b.graph().info(tokens).shape;
  const ValueId pos = b.param(name, {1, s[1], s[2]}, InitKind::normal, 0.02);
  return b.graph().binary(BinaryFn::add, tokens, pos, b.name(name + "_add"));
}

ValueId blocks(Builder& b, ValueId x, std::size_t count, std::size_t heads,
               const std::string& name) {
  for (std::size_t i = 0; i < count; ++i)
    x = nn::transformer_block(b, x, heads, 4, name + "." + std::to_string(i));
  return x;
}

ValueId generator(Builder& b, ValueId img, const Dims& d, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const Shape is = g.info(img).shape;
  const std::size_t h = is[2] / 4, w = is[3] / 4;
  ValueId x = nn::conv2d(b, img, {.out_channels = d.g0, .kernel = 4, .stride = 4}, "patch_embed");
  x = add_positions(b, to_tokens(g, x, b.name("embed")), "pos0");
  x = blocks(b, x, d.g_blocks[0], d.heads, "stage0");
  x = nn::pixel_shuffle(b, to_image(g, x, h, w, b.name("up1")), 2);
  x = add_positions(b, to_tokens(g, x, b.name("up1")), "pos1");
  x = blocks(b, x, d.g_blocks[1], d.heads, "stage1");
  x = nn::pixel_shuffle(b, to_image(g, x, 2 * h, 2 * w, b.name("up2")), 2);
  x = add_positions(b, to_tokens(g, x, b.name("up2")), "pos2");
  x = blocks(b, x, d.g_blocks[2], d.heads, "stage2");
  return nn::conv2d(b, to_image(g, x, 4 * h, 4 * w, b.name("out")),
                    {.out_channels = 3, .kernel = 1}, "to_rgb");
}

// Three patch embeddings (2x2, 4x4, 8x8) joined stage by stage: blocks at 1/2 resolution with
// width d/4, pool and join the 4x4 embedding (d/2), pool and join the 8x8 embedding (d), then a
// class token, one block, LayerNorm and Linear -> 1 on the class token.
ValueId discriminator(Builder& b, ValueId img, const Dims& d, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const Shape is = g.info(img).shape;
  const std::size_t n = is[0], h = is[2], w = is[3];
  const std::size_t widths[3] = {d.d / 4, d.d / 4, d.d / 2};
  ValueId x;
  for (std::size_t k = 0; k < 3; ++k) {
    const std::size_t patch = std::size_t{2} << k, ph = h / patch, pw = w / patch;
    ValueId e = nn::conv2d(b, img, {.out_channels = widths[k], .kernel = patch, .stride = patch},
                           "patch_embed" + std::to_string(k));
    if (k == 0) {
      x = e;
    } else {
      x = nn::avg_pool2d(b, x, 2, 2);
      x = g.concat({x, e}, 1, b.name("join" + std::to_string(k)));
    }
    ValueId t = add_positions(b, to_tokens(g, x, b.name("tokens" + std::to_string(k))),
                              "pos" + std::to_string(k));
    t = blocks(b, t, d.d_blocks, d.heads, "stage" + std::to_string(k));
    x = to_image(g, t, ph, pw, b.name("grid" + std::to_string(k)));
  }
  ValueId t = to_tokens(g, x, b.name("final_tokens"));
  const ValueId cls = b.param("cls_token", {1, 1, d.d}, InitKind::normal, 0.02);
  t = g.concat({g.broadcast_to(cls, {n, 1, d.d}, 1.0, b.name("cls_batch")), t}, 1,
               b.name("with_cls"));
  t = blocks(b, t, 1, d.heads, "last");
  t = nn::layer_norm(b, t, 1e-5, "norm");
  const ValueId head =
      g.reshape(g.slice(t, 1, 0, 1, b.name("cls_out")), {n, d.d}, b.name("cls_flat"));
  return nn::linear(b, head, 1, true, "head");
}

}  // namespace

void build_transcyclegan(Model& m, Builder& b, const ModelOptions& o) {
  Graph& g = m.graph;
  const Shape sample = sample_shape_or(o, {3, 64, 64});
  if (sample.size() != 3 || sample[0] != 3 || sample[1] % 16 != 0 || sample[2] % 16 != 0)
    throw std::invalid_argument(
        "transcyclegan takes RGB samples with height and width multiples "
        "of 16 ([3, 64, 64] in the paper), got " +
        shape_str(sample) + "; pass an empty sample shape for the default");
  Dims d;
  d.g0 = scaled(1024, o.width, 16), d.g1 = d.g0 / 4, d.g2 = d.g0 / 16;
  d.d = scaled(384, o.width, 16);
  d.g_blocks[0] = repeats(5, o.depth), d.g_blocks[1] = repeats(4, o.depth),
  d.g_blocks[2] = repeats(3, o.depth);
  d.d_blocks = repeats(3, o.depth);
  const Shape shape = {o.micro_batch, 3, sample[1], sample[2]};
  m.input = g.input("low_resolution", {DType::f32, shape});  // bicubic-upsampled x4
  m.labels = g.input("high_resolution", {DType::f32, shape});
  m.task = Task::image_to_image;
  const ValueId a = m.input, hr = m.labels;
  const bool split = o.pipeline_stages > 1;

  // Generators: a -> b (super-resolution) and b -> a; cycle consistency both ways.
  const ValueId fake_b = generator(b, a, d, "g_ab");
  const ValueId fake_a = generator(b, hr, d, "g_ba");
  const ValueId cycle_a = generator(b, fake_b, d, "g_ba");
  const ValueId cycle_b = generator(b, fake_a, d, "g_ab");
  m.logits = fake_b;

  if (split) g.set_stage(1);
  // Generator loss through frozen discriminators.
  b.set_frozen(true);
  const ValueId adv_b = nn::lsgan_loss(b, discriminator(b, fake_b, d, "d_b"), 1.0);
  const ValueId adv_a = nn::lsgan_loss(b, discriminator(b, fake_a, d, "d_a"), 1.0);
  b.set_frozen(false);
  const ValueId cycle =
      g.binary(BinaryFn::add, nn::l1_loss(b, cycle_a, a), nn::l1_loss(b, cycle_b, hr), "cycle_l1");
  const ValueId loss_g =
      g.binary(BinaryFn::add, g.binary(BinaryFn::add, adv_a, adv_b, "adversarial"),
               g.binary(BinaryFn::mul, cycle, b.scalar(10.0), "cycle_weighted"), "loss_g");
  // Discriminator loss on real images and detached fakes.
  const auto d_loss = [&](ValueId real, ValueId fake, const std::string& name) {
    const ValueId r = nn::lsgan_loss(b, discriminator(b, real, d, name), 1.0);
    const ValueId f =
        nn::lsgan_loss(b, discriminator(b, g.stop_gradient(fake, name + "/detach"), d, name), 0.0);
    return g.binary(BinaryFn::mul, g.binary(BinaryFn::add, r, f, name + "/sum"), b.scalar(0.5),
                    name + "/loss");
  };
  const ValueId loss_d =
      g.binary(BinaryFn::add, d_loss(hr, fake_b, "d_b"), d_loss(a, fake_a, "d_a"), "loss_d");
  m.loss = g.binary(BinaryFn::add, loss_g, loss_d, "loss");
  m.metrics = {{"loss_g", loss_g}, {"loss_d", loss_d}, {"cycle_l1", cycle}};
}

}  // namespace ipupod::models::zoo_impl

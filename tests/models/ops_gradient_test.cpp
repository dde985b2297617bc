// Finite-difference gradient checks for every differentiable op and layer, on small awkward
// shapes; plus the shape errors and the non-differentiable ops' contracts.
#include <gtest/gtest.h>

#include "gradient_check.hpp"
#include "models/layers.hpp"

namespace ipupod::models {
namespace {

using testing::check_gradients;
using testing::GradCheckOptions;

ValueId param(Graph& g, const std::string& name, Shape shape) {
  return g.parameter(name, {DType::f32, std::move(shape)}, 1.0);
}

TEST(OpGradients, Unary) {
  for (UnaryFn fn : {UnaryFn::gelu, UnaryFn::silu, UnaryFn::sigmoid, UnaryFn::tanh,
                     UnaryFn::leaky_relu, UnaryFn::sqrt, UnaryFn::rsqrt, UnaryFn::exp, UnaryFn::log,
                     UnaryFn::square, UnaryFn::abs, UnaryFn::neg, UnaryFn::erf}) {
    SCOPED_TRACE(unary_fn_name(fn));
    Graph g;
    const ValueId x = param(g, "x", {3, 5});
    GradCheckOptions o;
    const bool positive = fn == UnaryFn::sqrt || fn == UnaryFn::rsqrt || fn == UnaryFn::log;
    if (positive) o.lo = 0.5f, o.hi = 2.f;
    o.eps = 1e-3;
    check_gradients(g, g.unary(fn, x, "f", 0.2), o);
  }
}

TEST(OpGradients, BinaryWithBroadcasting) {
  for (BinaryFn fn : {BinaryFn::add, BinaryFn::sub, BinaryFn::mul, BinaryFn::div}) {
    SCOPED_TRACE(binary_fn_name(fn));
    Graph g;
    const ValueId a = param(g, "a", {2, 3, 4});
    const ValueId b = param(g, "b", {3, 1});
    GradCheckOptions o;
    o.lo = 0.5f, o.hi = 1.5f;  // keeps the divisor away from zero
    check_gradients(g, g.binary(fn, a, b), o);
  }
}

TEST(OpGradients, ReduceBroadcastPermuteSliceConcat) {
  Graph g;
  const ValueId x = param(g, "x", {2, 3, 4});
  const ValueId r = g.reduce_mean(x, {0, 2}, true);      // [1,3,1]
  const ValueId bx = g.broadcast_to(r, {2, 3, 5}, 2.0);  // [2,3,5]
  const ValueId p = g.permute(bx, {2, 0, 1});            // [5,2,3]
  const ValueId s = g.slice(p, 0, 1, 4);                 // [3,2,3]
  const ValueId y = param(g, "y", {3, 2, 2});
  const ValueId c = g.concat({s, y, g.permute(g.slice(x, 2, 0, 3), {2, 0, 1})}, 2);  // [3,2,8]
  check_gradients(g, c);
}

TEST(OpGradients, BatchMatmulAllTransposes) {
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    Graph g;
    const ValueId a = param(g, "a", ta ? Shape{2, 3, 4, 5} : Shape{2, 3, 5, 4});
    const ValueId b = param(g, "b", tb ? Shape{2, 3, 6, 4} : Shape{2, 3, 4, 6});
    check_gradients(g, g.batch_matmul(a, b, ta, tb));
  }
}

TEST(OpGradients, SoftmaxAndCrossEntropy) {
  Graph g;
  const ValueId x = param(g, "x", {3, 2, 5});
  check_gradients(g, g.softmax(x));
  Graph h;
  const ValueId logits = param(h, "logits", {4, 3});
  const ValueId labels = h.input("labels", {DType::i32, {4}});
  check_gradients(h, h.softmax_cross_entropy(logits, labels), {}, [&](Interpreter& in) {
    Buffer l = Buffer::zeros(h.info(labels));
    l.i = {0, 2, 1, 2};
    in.set(labels, l);
  });
}

struct ConvCase {
  Shape x, w;
  Conv2dGeometry geo;
};

TEST(OpGradients, Conv2dStridePaddingDilationGroups) {
  Conv2dGeometry strided = Conv2dGeometry::symmetric(2, 1);
  Conv2dGeometry dilated = Conv2dGeometry::symmetric(1, 2, 2);
  Conv2dGeometry grouped = Conv2dGeometry::symmetric(2, 1, 1, 2);
  Conv2dGeometry depthwise = Conv2dGeometry::symmetric(1, 1, 1, 3);
  const ConvCase cases[] = {
      {{2, 3, 5, 4}, {4, 3, 3, 3}, strided},
      {{1, 2, 6, 5}, {3, 2, 3, 2}, dilated},
      {{2, 4, 5, 5}, {6, 2, 3, 3}, grouped},
      {{1, 3, 4, 5}, {3, 1, 3, 3}, depthwise},
      {{1, 2, 5, 6}, {2, 2, 4, 4}, Conv2dGeometry::same(4, 4)},
  };
  for (const auto& c : cases) {
    Graph g;
    const ValueId x = param(g, "x", c.x), w = param(g, "w", c.w);
    check_gradients(g, g.conv2d(x, w, c.geo));
  }
}

TEST(OpGradients, ConvTranspose2d) {
  Graph g;
  const ValueId x = param(g, "x", {2, 4, 3, 3});
  const ValueId w = param(g, "w", {4, 3, 3, 3});  // groups 2: out = 2 * 3
  Conv2dGeometry geo = Conv2dGeometry::symmetric(2, 1, 1, 2);
  const ValueId y = g.conv_transpose2d(x, w, geo, 1, 1);
  EXPECT_EQ(g.info(y).shape, (Shape{2, 6, 6, 6}));
  check_gradients(g, y);
}

TEST(OpGradients, Pooling) {
  {
    Graph g;
    const ValueId x = param(g, "x", {2, 2, 5, 6});
    Pool2dGeometry p;
    p.kernel_h = p.kernel_w = 3;
    p.stride_h = p.stride_w = 2;
    p.pad_h = p.pad_w = 1;
    GradCheckOptions o;
    o.eps = 1e-3;
    check_gradients(g, g.max_pool2d(x, p), o);
  }
  for (bool include : {true, false}) {
    Graph g;
    const ValueId x = param(g, "x", {1, 2, 5, 6});
    Pool2dGeometry p;
    p.kernel_h = 3, p.kernel_w = 2;
    p.stride_h = 2, p.stride_w = 2;
    p.pad_h = 1, p.pad_w = 1;
    p.count_include_pad = include;
    check_gradients(g, g.avg_pool2d(x, p));
  }
  Graph g;
  const ValueId x = param(g, "x", {1, 2, 7, 5});
  Pool2dGeometry p;
  p.adaptive = true;
  p.out_h = 3, p.out_w = 2;
  check_gradients(g, g.avg_pool2d(x, p));
}

TEST(OpGradients, Normalisation) {
  GradCheckOptions o;
  o.eps = 1e-3;  // normalisation is strongly curved where a set's variance is small
  for (NormKind k : {NormKind::batch, NormKind::layer, NormKind::group}) {
    Graph g;
    const ValueId x = param(g, "x", {3, 4, 2, 3});
    check_gradients(g, g.normalize(x, k, 1e-5, 2), o);
  }
  Graph g;
  const ValueId x = param(g, "x", {2, 3, 2, 2});
  const ValueId mean = g.state("mean", {DType::f32, {3}}, InitKind::uniform, 0.5);
  const ValueId var = g.state("var", {DType::f32, {3}}, InitKind::fill, 2.0);
  check_gradients(g, g.batch_norm_inference(x, mean, var, 1e-3));
}

TEST(OpGradients, GatherRows) {
  Graph g;
  const ValueId table = param(g, "table", {5, 3});
  const ValueId idx = g.input("idx", {DType::i32, {2, 3}});
  check_gradients(g, g.gather_rows(table, idx), {}, [&](Interpreter& in) {
    Buffer b = Buffer::zeros(g.info(idx));
    b.i = {4, 0, 4, 2, 2, 1};
    in.set(idx, b);
  });
}

// Layers: every layer of the library through its composed ops.
class LayerGradients : public ::testing::Test {
 protected:
  Graph g;
  Builder b{g, true, 3};
};

TEST_F(LayerGradients, ConvLayersAndNorms) {
  ValueId x = b.param("x", {2, 3, 6, 5}, InitKind::uniform, 1.0);
  x = nn::conv2d(b, x, {.out_channels = 4, .kernel = 3, .stride = 2, .padding = 1}, "conv");
  x = nn::batch_norm2d(b, x, 1e-3, 0.1, "bn");
  x = nn::conv_transpose2d(b, x, 4, 3, 2, 1, 1, true, "up");
  x = nn::group_norm(b, x, 2, 1e-5, "gn");
  x = nn::leaky_relu(b, x, 0.1);
  GradCheckOptions o;
  o.eps = 1e-3;
  check_gradients(g, x, o);
}

TEST_F(LayerGradients, GdnAndInverse) {
  ValueId x = b.param("x", {2, 3, 3, 2}, InitKind::uniform, 1.0);
  x = nn::gdn(b, x, false, "gdn");
  x = nn::gdn(b, x, true, "igdn");
  GradCheckOptions o;
  o.lo = 0.1f, o.hi = 0.6f;  // positive betas and gammas keep the root defined
  check_gradients(g, x, o);
}

TEST_F(LayerGradients, SqueezeExcitationPixelShuffle) {
  ValueId x = b.param("x", {2, 8, 3, 3}, InitKind::uniform, 1.0);
  x = nn::squeeze_excitation(b, x, 2, "se");
  x = nn::pixel_shuffle(b, x, 2);
  EXPECT_EQ(g.info(x).shape, (Shape{2, 2, 6, 6}));
  check_gradients(g, x);
}

TEST_F(LayerGradients, TransformerBlock) {
  ValueId x = b.param("x", {2, 3, 4}, InitKind::uniform, 1.0);
  x = nn::transformer_block(b, x, 2, 2, "block");
  check_gradients(g, x);
}

TEST_F(LayerGradients, EmbeddingDropoutStochasticDepth) {
  const ValueId idx = g.input("idx", {DType::i32, {4}});
  ValueId x = nn::embedding(b, idx, 6, 3, "emb");
  x = nn::dropout(b, x, 0.3);
  x = nn::stochastic_depth(b, g.reshape(x, {4, 3, 1, 1}), 0.4);
  check_gradients(g, x, {}, [&](Interpreter& in) {
    Buffer i = Buffer::zeros(g.info(idx));
    i.i = {1, 5, 1, 0};
    in.set(idx, i);
  });
}

TEST_F(LayerGradients, VectorQuantiserCommitmentLoss) {
  // The commitment loss has a true derivative (the chosen codes are locally constant).
  const ValueId z = b.param("z", {2, 3, 2, 2}, InitKind::uniform, 1.0);
  check_gradients(g, nn::vector_quantizer(b, z, 5, 0.9, 0.25, "vq").loss);
}

TEST(Ops, StraightThroughPassesTheGradientUnchangedAndOutputsCodes) {
  // Forward: the nearest codes (piecewise constant, so finite differences see 0);
  // backward: the identity, by design.
  Graph g;
  Builder b(g, false);
  const ValueId z = b.param("z", {1, 2, 2, 1}, InitKind::uniform, 1.0);
  const nn::Quantized q = nn::vector_quantizer(b, z, 3, 0.9, 0.25, "vq");
  const ValueId w = g.input("w", g.info(q.quantized));
  const ValueId loss = g.reduce_sum(g.binary(BinaryFn::mul, q.quantized, w), {0, 1, 2, 3}, false);
  const auto grads = build_backward(g, loss);
  Interpreter in(g, 2);
  Buffer wb = Buffer::zeros(g.info(w));
  wb.f = {0.5f, -2.f, 3.f, 1.f};
  in.set(w, wb);
  in.run({Phase::forward, Phase::backward});
  EXPECT_EQ(in.get(grads.at(z)).f, wb.f);
  const Buffer& codebook = in.get(g.states().front());
  const Buffer& out = in.get(q.quantized);
  const Buffer& idx = in.get(q.indices);
  for (std::size_t r = 0; r < 2; ++r)  // [1, d=2, h=2, w=1]: row r is (out[r], out[2 + r])
    for (std::size_t d = 0; d < 2; ++d)
      EXPECT_FLOAT_EQ(out.f[d * 2 + r], codebook.f[static_cast<std::size_t>(idx.i[r]) * 2 + d]);
}

TEST_F(LayerGradients, Losses) {
  const ValueId pred = b.param("pred", {2, 1, 3, 3}, InitKind::uniform, 1.0);
  const ValueId target = g.input("target", {DType::f32, {2, 1, 3, 3}});
  const ValueId mask = g.input("mask", {DType::f32, {2, 1, 3, 3}});
  ValueId loss =
      g.binary(BinaryFn::add, nn::mse_loss(b, pred, target, mask), nn::l1_loss(b, pred, target));
  loss = g.binary(BinaryFn::add, loss, nn::lsgan_loss(b, pred, 1.0));
  loss = g.binary(BinaryFn::add, loss, nn::mse_loss(b, pred, target));
  check_gradients(g, loss, {}, [&](Interpreter& in) {
    in.set(target, testing::random_buffer(g.info(target), 7));
    Buffer m = Buffer::zeros(g.info(mask));
    for (std::size_t i = 0; i < m.f.size(); ++i) m.f[i] = i % 3 ? 1.f : 0.f;
    in.set(mask, m);
  });
}

TEST(Ops, ErrorsNameOpInputExpectedAndGot) {
  Graph g;
  const ValueId x = g.input("x", {DType::f32, {2, 3, 8, 8}});
  const ValueId w = g.parameter("w", {DType::f32, {4, 2, 3, 3}}, 1.0);
  try {
    g.conv2d(x, w, Conv2dGeometry{}, "stem");
    FAIL();
  } catch (const IrError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Conv2d 'stem'"), std::string::npos) << m;
    EXPECT_NE(m.find("float32[4,2,3,3]"), std::string::npos) << m;
    EXPECT_NE(m.find("float32[2,3,8,8]"), std::string::npos) << m;
  }
  EXPECT_THROW(g.binary(BinaryFn::add, x, g.input("y", {DType::f32, {3, 8}})), IrError);
  EXPECT_THROW(g.permute(x, {0, 1, 1, 2}), IrError);
  EXPECT_THROW(g.slice(x, 1, 2, 4), IrError);
  EXPECT_THROW(g.normalize(x, NormKind::group, 1e-5, 2), IrError);
}

TEST(Ops, DropoutMaskIsDeterministicAndKeepsTheMean) {
  Graph g;
  const ValueId m = g.random_mask({100, 100}, 0.25, 11);
  Interpreter a(g), b(g);
  a.run({Phase::forward});
  b.run({Phase::forward});
  EXPECT_EQ(a.get(m).f, b.get(m).f);
  double sum = 0;
  std::size_t zeros = 0;
  for (float v : a.get(m).f) sum += v, zeros += v == 0.f;
  EXPECT_NEAR(sum / 10000.0, 1.0, 0.03);
  EXPECT_NEAR(static_cast<double>(zeros) / 10000.0, 0.25, 0.02);
  const std::vector<float> first = a.get(m).f;
  a.run({Phase::forward});
  EXPECT_NE(a.get(m).f, first) << "a new draw every run";
}

TEST(Ops, BatchNormRunningStatisticsAndEvalMode) {
  Graph g;
  Builder b(g, true);
  const ValueId x = g.input("x", {DType::f32, {4, 2, 3, 3}});
  nn::batch_norm2d(b, x, 1e-5, 0.5, "bn");
  Interpreter in(g);
  Buffer xb = testing::random_buffer(g.info(x), 3, 1.f, 3.f);
  in.set(x, xb);
  in.run({Phase::forward});
  const ValueId mean = g.states()[0];
  for (float v : in.get(mean).f) EXPECT_GT(v, 0.4f);  // half-way to a batch mean of ~2
  Graph e;
  Builder eb(e, false);
  const ValueId ex = e.input("x", {DType::f32, {1, 2, 1, 1}});
  const ValueId y = nn::batch_norm2d(eb, ex, 0.0, 0.1, "bn");
  Interpreter ein(e);
  Buffer one = Buffer::zeros(e.info(ex));
  one.f = {3.f, -1.f};
  ein.set(ex, one);
  ein.run({Phase::forward});
  EXPECT_FLOAT_EQ(ein.get(y).f[0], 3.f);  // running mean 0, variance 1, gamma 1, beta 0
  EXPECT_FLOAT_EQ(ein.get(y).f[1], -1.f);
}

}  // namespace
}  // namespace ipupod::models

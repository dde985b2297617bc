// The layer library, losses, composite blocks and optimizers against PyTorch: every case of the
// golden fixture file (scripts/make_golden_fixtures.py) is rebuilt from IR ops and run in the
// reference interpreter; outputs, gradients and state updates must match tightly. Also the
// zoo's full-size parameter counts against PyTorch's.
#include <gtest/gtest.h>

#include <cmath>

#include "golden_file.hpp"
#include "models/autodiff.hpp"
#include "models/interpreter.hpp"
#include "models/layers.hpp"
#include "models/optimizers.hpp"
#include "models/zoo.hpp"
#include "models/zoo_models.hpp"

namespace ipupod::models {
namespace {

using testing::GoldenArray;
using testing::GoldenFile;

std::string golden_path() {
  return std::string(IPUPOD_GOLDEN_DIR) + "/layers.h5";
}

// Elementwise |a - b| <= abs + rel * |b|; reports the worst element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double abs,
                  double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double excess =
        std::abs(static_cast<double>(got[i]) - want[i]) - (abs + rel * std::abs(want[i]));
    if (excess > worst) worst = excess, at = i;
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << got[at] << ", PyTorch has "
                        << want[at];
}

Buffer to_buffer(const GoldenArray& a, const TensorInfo& info, const std::string& what) {
  Buffer b = Buffer::zeros(info);
  const std::size_t n = info.dtype == DType::f32 ? a.f.size() : a.i.size();
  if (n != info.elements())
    throw std::runtime_error(what + ": fixture has " + std::to_string(n) +
                             " elements, the graph wants " + info.str());
  if (info.dtype == DType::f32)
    b.f = a.f;
  else
    b.i = a.i;
  return b;
}

std::size_t u(double v) {
  return static_cast<std::size_t>(v);
}

struct Built {
  ValueId y = -1;
  ValueId extra_loss = -1;
};

// Rebuilds one fixture case from the layer library.
Built build_case(Builder& b, ValueId x, const std::string& op,
                 const std::map<std::string, double>& a,
                 const std::map<std::string, std::string>& s, const GoldenFile& file,
                 const std::string& group) {
  Graph& g = b.graph();
  const auto input = [&](const std::string& name, DType dtype) {
    const GoldenArray arr = file.read(group + "/input/" + name);
    return g.input(name, {dtype, arr.dims});
  };
  if (op == "conv2d")
    return {nn::conv2d(b, x,
                       {.out_channels = u(a.at("out")),
                        .kernel = u(a.at("kernel")),
                        .stride = u(a.at("stride")),
                        .padding = u(a.at("padding")),
                        .same = a.at("same") != 0,
                        .dilation = u(a.at("dilation")),
                        .groups = u(a.at("groups")),
                        .bias = a.at("bias") != 0})};
  if (op == "conv_transpose2d")
    return {nn::conv_transpose2d(b, x, u(a.at("out")), u(a.at("kernel")), u(a.at("stride")),
                                 u(a.at("padding")), u(a.at("output_padding")), a.at("bias") != 0)};
  if (op == "batch_norm2d") return {nn::batch_norm2d(b, x, a.at("eps"), a.at("momentum"))};
  if (op == "layer_norm") return {nn::layer_norm(b, x, a.at("eps"))};
  if (op == "group_norm") return {nn::group_norm(b, x, u(a.at("groups")), a.at("eps"))};
  if (op == "gdn") return {nn::gdn(b, x, a.at("inverse") != 0)};
  if (op == "activation") {
    const std::string fn = s.at("fn");
    if (fn == "relu") return {nn::relu(b, x)};
    if (fn == "gelu") return {nn::gelu(b, x)};
    if (fn == "silu") return {nn::silu(b, x)};
    if (fn == "sigmoid") return {nn::sigmoid(b, x)};
    if (fn == "tanh") return {nn::tanh(b, x)};
    if (fn == "leaky_relu") return {nn::leaky_relu(b, x, a.at("slope"))};
  }
  if (op == "max_pool2d")
    return {nn::max_pool2d(b, x, u(a.at("kernel")), u(a.at("stride")), u(a.at("padding")))};
  if (op == "avg_pool2d")
    return {nn::avg_pool2d(b, x, u(a.at("kernel")), u(a.at("stride")), u(a.at("padding")),
                           a.at("count_include_pad") != 0)};
  if (op == "adaptive_avg_pool2d")
    return {nn::adaptive_avg_pool2d(b, x, u(a.at("out_h")), u(a.at("out_w")))};
  if (op == "squeeze_excitation") return {nn::squeeze_excitation(b, x, u(a.at("squeeze")))};
  if (op == "pixel_shuffle") return {nn::pixel_shuffle(b, x, u(a.at("r")))};
  if (op == "attention") return {nn::multi_head_self_attention(b, x, u(a.at("heads")))};
  if (op == "transformer_block")
    return {nn::transformer_block(b, x, u(a.at("heads")), u(a.at("mlp_ratio")))};
  if (op == "embedding")
    return {nn::embedding(b, input("indices", DType::i32), u(a.at("rows")), u(a.at("dim")))};
  if (op == "vector_quantizer") {
    const nn::Quantized q =
        nn::vector_quantizer(b, x, u(a.at("codes")), a.at("decay"), a.at("commitment"));
    return {q.quantized, q.loss};
  }
  if (op == "mse_loss")
    return {nn::mse_loss(b, x, input("target", DType::f32),
                         a.at("masked") != 0 ? input("mask", DType::f32) : -1)};
  if (op == "l1_loss") return {nn::l1_loss(b, x, input("target", DType::f32))};
  if (op == "cross_entropy") return {nn::cross_entropy(b, x, input("labels", DType::i32))};
  if (op == "lsgan_loss") return {nn::lsgan_loss(b, x, a.at("target"))};
  // The zoo's own EfficientNetV2 block, not a copy of it.
  if (op == "mbconv" || op == "fused_mbconv") {
    const std::size_t in = g.info(x).shape[1];
    return {zoo_impl::efficientnet_block(b, x,
                                         {.fused = op == "fused_mbconv",
                                          .expansion = u(a.at("expansion")),
                                          .kernel = u(a.at("kernel")),
                                          .in = in,
                                          .out = u(a.at("out")),
                                          .stride = a.count("stride") ? u(a.at("stride")) : 1,
                                          .drop = 0})};
  }
  if (op == "down_res_block") {
    const std::size_t out = u(a.at("out")), k = u(a.at("kernel")), st = u(a.at("stride"));
    const ValueId h = nn::gdn(b, x, false, "gdn");
    const ValueId sc = nn::conv2d(
        b, h, {.out_channels = out, .kernel = 1, .stride = st, .bias = false}, "shortcut");
    ValueId y = nn::conv2d(
        b, h, {.out_channels = out, .kernel = k, .stride = st, .padding = k / 2, .bias = false},
        "conv1");
    y = nn::gelu(b,
                 nn::conv2d(b, y, {.out_channels = 4 * out, .kernel = 1, .bias = false}, "conv2"));
    y = nn::conv2d(b, y, {.out_channels = out, .kernel = 1, .bias = false}, "conv3");
    return {g.binary(BinaryFn::add, sc, y)};
  }
  throw std::runtime_error("golden case " + group + ": unknown op '" + op + "'");
}

TEST(Golden, LayersLossesAndBlocksMatchPyTorch) {
  const GoldenFile file(golden_path());
  std::size_t cases = 0;
  for (const std::string& name : file.groups()) {
    if (name == "parameter_counts") continue;
    const std::string group = "/" + name;
    const auto nums = file.numbers(group);
    const auto strs = file.strings(group);
    const std::string op = strs.at("op");
    if (op == "optimizer") continue;
    SCOPED_TRACE(name);
    Graph g;
    const bool training = !nums.count("training") || nums.at("training") != 0;
    Builder b(g, training);
    ValueId x = -1;
    if (file.has(group + "/x")) x = b.param("x", file.read(group + "/x").dims, InitKind::fill, 0.0);
    const Built built = build_case(b, x, op, nums, strs, file, group);
    const ValueId dy = g.input("dy", g.info(built.y));
    std::vector<std::size_t> axes(g.info(built.y).shape.size());
    for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = i;
    ValueId objective = g.binary(BinaryFn::mul, built.y, dy);
    if (!axes.empty()) objective = g.reduce_sum(objective, axes, false);
    if (built.extra_loss >= 0) objective = g.binary(BinaryFn::add, objective, built.extra_loss);
    const auto grads = build_backward(g, objective);

    Interpreter in(g);
    for (ValueId p : g.parameters()) {
      const std::string pname = g.value(p).name;
      const std::string path = pname == "x" ? group + "/x" : group + "/param/" + pname;
      ASSERT_TRUE(file.has(path)) << "the fixture has no " << path;
      in.set(p, to_buffer(file.read(path), g.info(p), path));
    }
    for (ValueId v : g.inputs()) {
      const std::string iname = g.value(v).name;
      const std::string path = iname == "dy" ? group + "/dy" : group + "/input/" + iname;
      in.set(v, to_buffer(file.read(path), g.info(v), path));
    }
    for (ValueId st : g.states()) {
      const std::string path = group + "/state/" + g.value(st).name;
      if (file.has(path)) in.set(st, to_buffer(file.read(path), g.info(st), path));
    }
    in.run({Phase::forward, Phase::backward});

    expect_close(in.get(built.y).f, file.read(group + "/y").f, 1e-5, 1e-4, "output");
    for (const auto& [p, grad] : grads) {
      const std::string pname = g.value(p).name;
      const std::string path = group + "/grad/" + pname;
      expect_close(in.get(grad).f, file.read(path).f, 2e-5, 1e-3, "gradient of " + pname);
    }
    for (ValueId st : g.states()) {
      const std::string path = group + "/state_after/" + g.value(st).name;
      if (file.has(path))
        expect_close(in.get(st).f, file.read(path).f, 1e-5, 1e-4, "state " + g.value(st).name);
    }
    ++cases;
  }
  EXPECT_GE(cases, 35u);
}

TEST(Golden, OptimizersMatchPyTorch) {
  const GoldenFile file(golden_path());
  std::size_t cases = 0;
  for (const std::string& name : file.groups()) {
    if (name.rfind("optimizer_", 0) != 0) continue;
    SCOPED_TRACE(name);
    const std::string group = "/" + name;
    const auto a = file.numbers(group);
    const auto s = file.strings(group);
    Graph g;
    const ValueId p = g.parameter("p", {DType::f32, {4, 3}}, 1.0);
    const ValueId q = g.parameter("q", {DType::f32, {5}}, 1.0);
    const ValueId gp = g.input("gp", g.info(p)), gq = g.input("gq", g.info(q));
    OptimizerOptions o;
    o.kind = optimizer_from_name(s.at("kind"));
    const auto get = [&](const char* k, double fallback) {
      return a.count(k) ? a.at(k) : fallback;
    };
    o.momentum = get("momentum", 0);
    o.nesterov = get("nesterov", 0) != 0;
    o.beta1 = get("beta1", 0.9), o.beta2 = get("beta2", 0.999), o.eps = get("eps", 1e-8);
    o.weight_decay = get("weight_decay", 0);
    o.clip_global_norm = get("clip", 0);
    if (a.count("warmup")) {
      o.schedule.kind = ScheduleKind::cosine;
      o.schedule.warmup_steps = u(a.at("warmup"));
      o.schedule.total_steps = u(a.at("total"));
    }
    build_optimizer(g, {{p, gp}, {q, gq}}, a.at("lr"), o);
    Interpreter in(g);
    in.set(p, to_buffer(file.read(group + "/p/init"), g.info(p), "p"));
    in.set(q, to_buffer(file.read(group + "/q/init"), g.info(q), "q"));
    for (std::size_t t = 0; t < u(a.at("steps")); ++t) {
      const std::string k = std::to_string(t);
      in.set(gp, to_buffer(file.read(group + "/p/grad" + k), g.info(gp), "gp"));
      in.set(gq, to_buffer(file.read(group + "/q/grad" + k), g.info(gq), "gq"));
      in.run({Phase::optimizer});
      expect_close(in.get(p).f, file.read(group + "/p/after" + k).f, 1e-6, 1e-5,
                   "p after step " + k);
      expect_close(in.get(q).f, file.read(group + "/q/after" + k).f, 1e-6, 1e-5,
                   "q after step " + k);
    }
    ++cases;
  }
  EXPECT_EQ(cases, 5u);
}

TEST(Golden, FullSizeParameterCountsEqualPyTorch) {
  const GoldenFile file(golden_path());
  const auto counts = file.numbers("/parameter_counts");
  EXPECT_GE(counts.size(), 5u);
  for (const auto& [name, expected] : counts) {
    SCOPED_TRACE(name);
    ModelOptions o;  // full size, each model's own sample shape
    o.classes = name == "resnet50" ? 1000 : 10;
    const Model m = build_model(name, o);
    EXPECT_EQ(m.parameter_count(), static_cast<std::size_t>(expected));
  }
}

}  // namespace
}  // namespace ipupod::models

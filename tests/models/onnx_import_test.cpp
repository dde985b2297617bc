// ONNX import: the zoo's CNN (width 1/8) and a small network of EfficientNetV2-S's blocks
// exported from PyTorch 1.13 by scripts/export_pytorch_model.py (committed with a fixed input
// and PyTorch's eval output) are read with the exported weights and compute what PyTorch
// computed; bad files and unsupported operators are errors naming what and where. The test
// needs only the ONNX library.
#include "models/onnx_import.hpp"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/interpreter.hpp"
#include "models/zoo.hpp"

namespace ipupod::models {
namespace {

namespace fs = std::filesystem;

const std::string kCnn = std::string(IPUPOD_ONNX_DIR) + "/cnn_w0125.onnx";

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// The loss of each of `steps` training steps on the fixture's input and these labels.
std::vector<float> training_losses(const Model& m, const std::string& input, const Buffer& labels,
                                   int steps) {
  Interpreter run(m.graph);
  Buffer x = Buffer::zeros(m.graph.info(m.input));
  x.f = read_floats(std::string(IPUPOD_ONNX_DIR) + "/" + input);
  run.set(m.input, x);
  run.set(m.labels, labels);
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    run.run();
    losses.push_back(run.get(m.loss).f.at(0));
  }
  return losses;
}

Model import(const std::string& path, bool training, std::size_t micro_batch = 2) {
  ModelOptions o;
  o.micro_batch = micro_batch;
  o.training = training;
  return build_model(path, o);
}

// The model's outputs (forward pass only) on input values `x`.
std::vector<float> outputs_on(const Model& m, const std::vector<float>& x) {
  Interpreter run(m.graph);
  Buffer in = Buffer::zeros(m.graph.info(m.input));
  in.f = x;
  run.set(m.input, in);
  run.set(m.labels, Buffer::zeros(m.graph.info(m.labels)));
  run.run({Phase::forward});
  return run.get(m.logits).f;
}

// A fixture made by scripts/export_pytorch_model.py --fixture: FILE.onnx, FILE.input.f32 and
// PyTorch's eval outputs FILE.output.f32. Its eval outputs here equal PyTorch's within 1e-5.
void expect_pytorchs_outputs(const std::string& stem, std::size_t input_size) {
  const Model m = import(std::string(IPUPOD_ONNX_DIR) + "/" + stem + ".onnx", false);
  const std::vector<float> x =
      read_floats(std::string(IPUPOD_ONNX_DIR) + "/" + stem + ".input.f32");
  ASSERT_EQ(x.size(), input_size);
  ASSERT_EQ(x.size(), m.graph.info(m.input).elements());
  const std::vector<float> expected =
      read_floats(std::string(IPUPOD_ONNX_DIR) + "/" + stem + ".output.f32");
  const std::vector<float> got = outputs_on(m, x);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], 1e-5) << stem << ", output " << i;
}

// Five training steps of the fixture from its exported weights on its input lower the loss;
// set_labels fills the labels (class indices or targets).
void expect_training_lowers_the_loss(const std::string& stem,
                                     const std::function<void(Buffer&)>& set_labels,
                                     double learning_rate = 0.01) {
  ModelOptions o;
  o.micro_batch = 2;
  o.learning_rate = learning_rate;
  const Model m = build_model(std::string(IPUPOD_ONNX_DIR) + "/" + stem + ".onnx", o);
  Buffer labels = Buffer::zeros(m.graph.info(m.labels));
  set_labels(labels);
  const std::vector<float> losses = training_losses(m, stem + ".input.f32", labels, 5);
  EXPECT_LT(losses.back(), losses.front()) << stem << ": " << ::testing::PrintToString(losses);
}

TEST(OnnxImport, TheExportedCnnKeepsPyTorchsParametersAndNames) {
  const Model m = import(kCnn, true);
  EXPECT_EQ(m.parameter_count(), 6806u);  // sum(p.numel()) in PyTorch, printed by the export
  std::vector<std::string> names;
  for (ValueId p : m.graph.parameters()) names.push_back(m.graph.value(p).name);
  EXPECT_EQ(names.front(), "features.0.weight");
  EXPECT_EQ(names.back(), "head.4.bias");
  EXPECT_EQ(m.graph.states().size(), 4u);  // two batch norms' running mean and variance
  EXPECT_EQ(m.graph.info(m.logits).shape, (Shape{2, 10}));
  EXPECT_FALSE(m.gradients.empty());  // trainable: backward and optimizer built
}

// float32 sums in another order than PyTorch's: a few units in the last place of values of
// order 0.1.
TEST(OnnxImport, EvalOutputsEqualPyTorchsOnTheSameInput) {
  expect_pytorchs_outputs("cnn_w0125", 2 * 28 * 28);
}

TEST(OnnxImport, TrainingStepsLowerTheLossFromTheExportedWeights) {
  const Model m = import(kCnn, true);
  Buffer labels = Buffer::zeros(m.graph.info(m.labels));
  labels.i = {3, 7};
  const std::vector<float> losses = training_losses(m, "cnn_w0125.input.f32", labels, 5);
  EXPECT_LT(losses.back(), losses.front());
}

// EfficientNetV2-S's blocks (torchvision's Fused-MBConv and MBConv with squeeze-and-excitation,
// SiLU as Sigmoid and Mul, batch norm eps 1e-3) with a one-value head: a regressor, trained on
// its mean absolute error as the conductivity model is.
const std::string kEffV2 = std::string(IPUPOD_ONNX_DIR) + "/effv2_blocks.onnx";

TEST(OnnxImport, AnEfficientNetV2RegressorIsARegressorWithPyTorchsParameters) {
  const Model m = import(kEffV2, true);
  EXPECT_EQ(m.parameter_count(), 39433u);  // sum(p.numel()) in PyTorch, printed by the export
  EXPECT_EQ(m.task, Task::regression);
  EXPECT_EQ(m.graph.info(m.logits).shape, (Shape{2, 1}));
  EXPECT_EQ(m.graph.info(m.labels).dtype, DType::f32);
  EXPECT_EQ(m.graph.info(m.labels).shape, (Shape{2, 1}));
  EXPECT_EQ(m.graph.states().size(), 32u);  // 16 batch norms' running mean and variance
}

TEST(OnnxImport, EfficientNetV2BlocksComputeWhatPyTorchComputedAndTrain) {
  expect_pytorchs_outputs("effv2_blocks", 2 * 3 * 32 * 32);
  expect_training_lowers_the_loss("effv2_blocks", [](Buffer& b) { b.f = {0.25f, 0.75f}; });
}

// Transposed convolutions (strides 2, pads, output padding, bias, groups) as a generator's
// decoder uses them, exported from PyTorch's ConvTranspose2d.
TEST(OnnxImport, TransposedConvolutionsComputeWhatPyTorchComputedAndTrain) {
  const Model m = import(std::string(IPUPOD_ONNX_DIR) + "/upsampling.onnx", false);
  EXPECT_EQ(m.parameter_count(), 12942u);  // sum(p.numel()) in PyTorch, printed by the export
  std::size_t transposed = 0;
  for (const Op& op : m.graph.ops()) transposed += op.kind == OpKind::conv_transpose2d;
  EXPECT_EQ(transposed, 2u);
  expect_pytorchs_outputs("upsampling", 2 * 16 * 16);
  expect_training_lowers_the_loss("upsampling", [](Buffer& b) { b.i = {3, 7}; });
}

// A transformer encoder block as PyTorch 1.13 exports it at opset 13: Linear layers on a
// sequence (MatMul by a matrix), LayerNorm decomposed (ReduceMean, Sub, Pow, Sqrt, Div),
// multi-head attention (Split, Reshape, Transpose, batched MatMul, Softmax), the exact GELU
// (Erf) and a tanh GELU, and
// Slice, Squeeze and Concat for the pooled tokens. Its layer norms' scales and shifts are
// parameters although no Conv or Gemm reads them: every float initializer but a batch norm's
// running statistics is.
TEST(OnnxImport, ATransformerBlockComputesWhatPyTorchComputedAndTrains) {
  const Model m = import(std::string(IPUPOD_ONNX_DIR) + "/attention.onnx", false);
  EXPECT_EQ(m.parameter_count(), 2698u);  // sum(p.numel()) in PyTorch, printed by the export
  expect_pytorchs_outputs("attention", 2 * 8 * 8);
  expect_training_lowers_the_loss("attention", [](Buffer& b) { b.i = {1, 4}; });
}

// MobileNetV3's pieces (HardSwish, ReLU6 as Clip, a HardSigmoid gate) and Gathers: a
// fixed-position embedding (a parameter gathered by constant indices) and picked tokens (x[:, 0],
// x[:, -1], x[:, [1, 2, 5]]), with the shape arithmetic of x.flatten(2) (Shape, Slice, Concat)
// folded to constants.
TEST(OnnxImport, MobileNetPiecesAndGathersComputeWhatPyTorchComputedAndTrain) {
  const Model m = import(std::string(IPUPOD_ONNX_DIR) + "/mobile.onnx", false);
  EXPECT_EQ(m.parameter_count(), 1286u);  // sum(p.numel()) in PyTorch, printed by the export
  expect_pytorchs_outputs("mobile", 2 * 3 * 8 * 8);
  expect_training_lowers_the_loss("mobile", [](Buffer& b) { b.i = {2, 9}; });
}

// torchvision's efficientnet_v2_s, all its blocks (Fused-MBConv, MBConv with squeeze and
// excitation), its channels at 1/16 and the conductivity paper's head (Linear 1280 -> 320 ->
// 1 at full width; at full width 20,587,729 parameters, as the zoo's efficientnetv2_s).
TEST(OnnxImport, TorchvisionsEfficientNetV2SComputesWhatPyTorchComputedAndTrains) {
  const Model m = import(std::string(IPUPOD_ONNX_DIR) + "/effv2s_w00625.onnx", true);
  EXPECT_EQ(m.parameter_count(), 112632u);  // sum(p.numel()) in PyTorch, printed by the export
  EXPECT_EQ(m.task, Task::regression);
  EXPECT_EQ(m.graph.states().size(), 224u);  // 112 batch norms' running mean and variance
  // SiLU exports as Mul(x, Sigmoid(x)): one SiLU op each (102), the squeeze-and-excitation
  // gates' Sigmoids (30, which multiply another value) stay.
  std::map<UnaryFn, std::size_t> unary;
  for (const Op& op : m.graph.ops())
    if (op.kind == OpKind::unary && op.phase == Phase::forward)
      ++unary[static_cast<UnaryFn>(op.i("fn"))];
  EXPECT_EQ(unary[UnaryFn::silu], 102u);
  EXPECT_EQ(unary[UnaryFn::sigmoid], 30u);
  expect_pytorchs_outputs("effv2s_w00625", 2 * 3 * 32 * 32);
  expect_training_lowers_the_loss(
      "effv2s_w00625",
      [](Buffer& b) {
        b.f = {0.25f, 0.75f};
      },
      0.001);
}

// torchvision's resnet50 (its Bottleneck blocks and module names), channels at 1/16: the
// stem's 7x7 convolution and max pool, strided 1x1 downsample branches, 53 batch norms.
TEST(OnnxImport, TorchvisionsResNet50ComputesWhatPyTorchComputedAndTrains) {
  const Model m = import(std::string(IPUPOD_ONNX_DIR) + "/resnet50_w00625.onnx", true);
  EXPECT_EQ(m.parameter_count(), 96782u);  // sum(p.numel()) in PyTorch, printed by the export
  EXPECT_EQ(m.graph.states().size(), 106u);
  EXPECT_EQ(m.graph.value(m.graph.parameters().back()).name, "fc.bias");
  expect_pytorchs_outputs("resnet50_w00625", 2 * 3 * 32 * 32);
  expect_training_lowers_the_loss("resnet50_w00625", [](Buffer& b) { b.i = {3, 7}; });
}

// --loss: an autoencoder's [N, 1, 8, 8] output against target images, or against a field
// where its mask is 1 when the data's targets are the field and its mask; a vector output
// against target values; and what each loss cannot take.
TEST(OnnxImport, TheLossOptionScoresImagesFieldsAndValues) {
  const std::string ae = std::string(IPUPOD_ONNX_DIR) + "/autoencoder.onnx";
  const auto build = [&](const std::string& loss, const Shape& targets) {
    ModelOptions o;
    o.micro_batch = 2;
    o.training = false;
    o.loss = loss;
    o.target_shape = targets;
    return build_model(ae, o);
  };
  const auto output_and_loss = [](const Model& m, const Buffer& labels) {
    Interpreter run(m.graph);
    Buffer x = Buffer::zeros(m.graph.info(m.input));
    x.f = read_floats(std::string(IPUPOD_ONNX_DIR) + "/autoencoder.input.f32");
    run.set(m.input, x);
    run.set(m.labels, labels);
    run.run({Phase::forward});
    return std::pair{run.get(m.logits).f, run.get(m.loss).f.at(0)};
  };
  // PyTorch's output, then the mean squared error against target images.
  const Model images = build("mse", {});
  EXPECT_EQ(images.task, Task::image_to_image);
  ASSERT_EQ(images.graph.info(images.labels).shape, (Shape{2, 1, 8, 8}));
  Buffer targets = Buffer::zeros(images.graph.info(images.labels));
  for (std::size_t i = 0; i < targets.f.size(); ++i) targets.f[i] = 0.01f * static_cast<float>(i);
  const auto [y, mse] = output_and_loss(images, targets);
  const std::vector<float> expected =
      read_floats(std::string(IPUPOD_ONNX_DIR) + "/autoencoder.output.f32");
  ASSERT_EQ(y.size(), expected.size());
  double squared = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    EXPECT_NEAR(y[i], expected[i], 1e-5) << i;
    squared += std::pow(double{y[i]} - targets.f[i], 2);
  }
  EXPECT_NEAR(mse, squared / 128, 1e-5);
  // A field and its mask (the climate data's [2, 8, 8]): only the cells whose mask is 1 count.
  for (const std::string loss : {"mse", "l1"}) {
    const Model field = build(loss, {2, 8, 8});
    EXPECT_EQ(field.task, Task::reconstruction);
    ASSERT_EQ(field.graph.info(field.labels).shape, (Shape{2, 2, 8, 8}));
    Buffer t = Buffer::zeros(field.graph.info(field.labels));
    double sum = 0, count = 0;
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t c = 0; c < 64; ++c) {
        const float value = 0.02f * static_cast<float>(c), mask = (c + n) % 3 == 0 ? 0.f : 1.f;
        t.f[n * 128 + c] = value;
        t.f[n * 128 + 64 + c] = mask;
        const double d = double{y[n * 64 + c]} - value;
        sum += mask * (loss == "mse" ? d * d : std::abs(d));
        count += mask;
      }
    EXPECT_NEAR(output_and_loss(field, t).second, sum / count, 1e-5) << loss;
  }
  // Refused: cross entropy of an image, and an image under the automatic loss.
  for (const std::string loss : {"cross-entropy", "auto"}) {
    try {
      build(loss, {});
      ADD_FAILURE() << loss << ": expected an error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("the output 'logits' is [2,1,8,8]"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("--loss mse or l1"), std::string::npos) << e.what();
    }
  }
  // A classifier's [N, classes] output trained on squared errors is a regressor of 10 values.
  ModelOptions o;
  o.micro_batch = 2;
  o.loss = "mse";
  const Model values = build_model(kCnn, o);
  EXPECT_EQ(values.task, Task::regression);
  EXPECT_EQ(values.graph.info(values.labels).shape, (Shape{2, 10}));
  EXPECT_EQ(values.graph.info(values.labels).dtype, DType::f32);
}

// The same block exported at opset 17, where each LayerNorm is one LayerNormalization node (its
// scale and bias initializers parameters as the decomposed form's are).
TEST(OnnxImport, Opset17sLayerNormalizationNodeComputesWhatPyTorchComputed) {
  const Model m = import(std::string(IPUPOD_ONNX_DIR) + "/attention_opset17.onnx", false);
  EXPECT_EQ(m.parameter_count(), 2698u);
  std::size_t normalizing = 0;
  for (const Op& op : m.graph.ops()) normalizing += op.kind == OpKind::normalize;
  EXPECT_EQ(normalizing, 2u);  // one op per LayerNormalization node, not a decomposition
  expect_pytorchs_outputs("attention_opset17", 2 * 8 * 8);
  expect_training_lowers_the_loss("attention_opset17", [](Buffer& b) { b.i = {1, 4}; });
}

// LayerNormalization over more than the last axis (PyTorch's LayerNorm([3, 4])): x [2, 12]
// reshaped to [2, 3, 4], normalised over its last two axes, scaled and shifted element-wise,
// reshaped back, as computed here.
TEST(OnnxImport, LayerNormalizationOverSeveralAxes) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  onnx::GraphProto* g = model.mutable_graph();
  auto* type = g->add_input()->mutable_type()->mutable_tensor_type();
  g->mutable_input(0)->set_name("x");
  type->set_elem_type(onnx::TensorProto::FLOAT);
  for (int d : {2, 12}) type->mutable_shape()->add_dim()->set_dim_value(d);
  const auto int64s = [&](const std::string& name, const std::vector<std::int64_t>& v) {
    onnx::TensorProto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(v.size()));
    for (std::int64_t x : v) t->add_int64_data(x);
  };
  int64s("cube", {2, 3, 4});
  int64s("flat", {2, 12});
  std::vector<float> scale(12), bias(12);
  for (std::size_t i = 0; i < 12; ++i) {
    scale[i] = 0.5f + 0.1f * static_cast<float>(i);
    bias[i] = 0.05f * (static_cast<float>(i) - 6.f);
  }
  const auto floats = [&](const std::string& name, const std::vector<float>& v) {
    onnx::TensorProto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(3);
    t->add_dims(4);
    for (float x : v) t->add_float_data(x);
  };
  floats("scale", scale);
  floats("bias", bias);
  const auto add_node = [&](const std::string& op, const std::vector<std::string>& in,
                            const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_name(out);
    n->set_op_type(op);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  add_node("Reshape", {"x", "cube"}, "x3");
  onnx::AttributeProto* axis =
      add_node("LayerNormalization", {"x3", "scale", "bias"}, "n3")->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  add_node("Reshape", {"n3", "flat"}, "y");
  g->add_output()->set_name("y");
  const fs::path path =
      fs::temp_directory_path() / ("ipupod_ln_" + std::to_string(getpid()) + ".onnx");
  {
    std::ofstream out(path, std::ios::binary);
    model.SerializeToOstream(&out);
  }
  const Model m = import(path.string(), false);
  fs::remove(path);
  Buffer x = Buffer::zeros(m.graph.info(m.input));
  for (std::size_t i = 0; i < x.f.size(); ++i) x.f[i] = static_cast<float>((i * 7) % 11) - 3.f;
  const std::vector<float> got = outputs_on(m, x.f);
  ASSERT_EQ(got.size(), 24u);
  for (std::size_t n = 0; n < 2; ++n) {
    double mean = 0, var = 0;
    for (std::size_t i = 0; i < 12; ++i) mean += x.f[n * 12 + i] / 12.0;
    for (std::size_t i = 0; i < 12; ++i) var += std::pow(x.f[n * 12 + i] - mean, 2) / 12.0;
    for (std::size_t i = 0; i < 12; ++i)
      EXPECT_NEAR(got[n * 12 + i],
                  (x.f[n * 12 + i] - mean) / std::sqrt(var + 1e-5) * scale[i] + bias[i], 1e-5)
          << i;
  }
}

// A file written here with the ONNX library: one node of operator `op` on input x of `dims`,
// with an int64 initializer "axes" as its second input when `axes` is given.
std::string write_model_with(const std::string& op, const std::vector<int>& dims,
                             const fs::path& dir, int opset = 13,
                             const std::vector<std::int64_t>& axes = {}) {
  onnx::ModelProto model;
  model.set_ir_version(7);
  model.add_opset_import()->set_version(opset);
  onnx::GraphProto* g = model.mutable_graph();
  onnx::ValueInfoProto* in = g->add_input();
  in->set_name("x");
  auto* type = in->mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::FLOAT);
  for (int d : dims) type->mutable_shape()->add_dim()->set_dim_value(d);
  onnx::NodeProto* node = g->add_node();
  node->set_name("the_node");
  node->set_op_type(op);
  node->add_input("x");
  if (!axes.empty()) {
    onnx::TensorProto* t = g->add_initializer();
    t->set_name("axes");
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(axes.size()));
    for (std::int64_t a : axes) t->add_int64_data(a);
    node->add_input("axes");
  }
  node->add_output("y");
  g->add_output()->set_name("y");
  const std::string path =
      (dir / (op + std::to_string(dims.size()) + "_" + std::to_string(opset) + ".onnx")).string();
  std::ofstream out(path, std::ios::binary);
  model.SerializeToOstream(&out);
  return path;
}

TEST(OnnxImport, AnUnsupportedOperatorNamesTheNodeTheOperatorAndItsInputs) {
  const fs::path dir = fs::temp_directory_path() / ("ipupod_onnx_" + std::to_string(getpid()));
  fs::create_directories(dir);
  try {
    import(write_model_with("Hardmax", {2, 4}, dir), true);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("node 'the_node' (Hardmax) with inputs x [2,4]"), std::string::npos)
        << what;
    EXPECT_NE(what.find("operator Hardmax is not supported"), std::string::npos) << what;
  }
  // The same graph with a mapped operator imports: [2, 4] outputs are a 4-class classifier's.
  EXPECT_EQ(import(write_model_with("Relu", {2, 4}, dir), true).graph.info(0).shape, (Shape{2, 4}));
  // An output that is no classifier's [N, classes] is named.
  try {
    import(write_model_with("Relu", {2, 4, 3}, dir), true);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the output 'y' is [2,4,3]"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// Malformed or unreadable nodes are errors that say what is wrong, never a crash or a wrong
// shape: an opset whose operators read otherwise, too few inputs, a squeezed axis that is not 1.
TEST(OnnxImport, NodesThatCannotBeReadAsOpset13DefinesThemAreRefused) {
  const fs::path dir = fs::temp_directory_path() / ("ipupod_onnx_bad_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto refused = [&](const std::string& path, const std::string& expected) {
    try {
      import(path, true);
      ADD_FAILURE() << path << ": expected an error saying " << expected;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused(write_model_with("Relu", {2, 4}, dir, 11), "uses ONNX opset 11; opsets 13 to 17");
  refused(write_model_with("Pow", {2, 4}, dir), "1 inputs, the operator takes at least 2");
  refused(write_model_with("Squeeze", {2, 4}, dir, 13, {1}), "squeezes axis 1 of size 4, not 1");
  refused(write_model_with("Unsqueeze", {2, 4}, dir), "Unsqueeze needs its axes");
  refused(write_model_with("Gather", {2, 4}, dir, 13, {5}), "index 5 of 2");
  // A squeeze of a size-1 axis, and one of every size-1 axis, are what ONNX defines.
  EXPECT_EQ(import(write_model_with("Squeeze", {2, 1, 4}, dir, 13, {1}), true).graph.info(1).shape,
            (Shape{2, 4}));
  fs::remove_all(dir);
}

// LogSoftmax over the last axis: x - max - log(sum exp(x - max)) of each row.
// LogSoftmax over the last axis: x - max - log(sum exp(x - max)) of each row when its values
// are scored (here by squared errors); as a classifier's output under cross entropy it is left
// out, since softmax cross entropy of the logits is the same loss (and the log of an
// underflowed probability would give NaN gradients).
TEST(OnnxImport, LogSoftmaxIsEachRowsLogProbabilities) {
  const fs::path dir = fs::temp_directory_path() / ("ipupod_onnx_ls_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = write_model_with("LogSoftmax", {2, 4}, dir);
  ModelOptions o;
  o.micro_batch = 2;
  o.training = false;
  o.loss = "mse";
  const Model scored = build_model(path, o);
  const Model classifier = import(path, false);
  fs::remove_all(dir);
  const std::vector<float> x = {1.f, -2.f, 0.5f, 3.f, -1.f, 0.f, 40.f, 2.f};
  const std::vector<float> got = outputs_on(scored, x);
  ASSERT_EQ(got.size(), 8u);
  for (std::size_t r = 0; r < 2; ++r) {
    const float* row = x.data() + 4 * r;
    const double top = *std::max_element(row, row + 4);
    double sum = 0;
    for (std::size_t i = 0; i < 4; ++i) sum += std::exp(row[i] - top);
    for (std::size_t i = 0; i < 4; ++i)
      EXPECT_NEAR(got[4 * r + i], row[i] - top - std::log(sum), 1e-5) << r << ", " << i;
  }
  EXPECT_EQ(classifier.graph.producer(classifier.logits).kind, OpKind::input);
  EXPECT_EQ(outputs_on(classifier, x), x);  // the logits, scored by softmax cross entropy
  EXPECT_EQ(classifier.graph.producer(classifier.loss).kind, OpKind::softmax_cross_entropy);
}

TEST(OnnxImport, AFileThatIsNotAnOnnxModelIsRefused) {
  const fs::path file =
      fs::temp_directory_path() / ("ipupod_not_" + std::to_string(getpid()) + ".onnx");
  std::ofstream(file) << "this is text, not a protobuf\n";
  EXPECT_THROW(import(file.string(), true), std::invalid_argument);
  fs::remove(file);
  EXPECT_THROW(import("/nonexistent/model.onnx", true), std::invalid_argument);
}

TEST(OnnxImport, AnotherMicroBatchThanTheExportIsTaken) {
  const Model m = import(kCnn, true, 5);
  EXPECT_EQ(m.graph.info(m.input).shape, (Shape{5, 1, 28, 28}));
  EXPECT_EQ(m.graph.info(m.logits).shape, (Shape{5, 10}));
}

}  // namespace
}  // namespace ipupod::models

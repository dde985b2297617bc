// Zoo classifiers: the MLP of the first end-to-end path, the small Fashion-MNIST CNN and
// ResNet-50 (v1.5: stride on the 3x3 conv of a bottleneck, like torchvision).
#include <stdexcept>

#include "models/zoo_models.hpp"

namespace ipupod::models::zoo_impl {
namespace {

// Linear layer y = x W + b with W [in, out] (the layout the pod's mlp path uses).
ValueId linear_in_out(Graph& g, ValueId x, std::size_t out, const std::string& name) {
  const std::size_t in = g.info(x).shape[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  ValueId w = g.parameter(name + ".weight", {DType::f32, {in, out}}, bound);
  ValueId b = g.parameter(name + ".bias", {DType::f32, {out}}, bound);
  return g.add_bias(g.matmul(x, w, false, false, name + ".matmul"), b, name);
}

void image_input(Model& m, Graph& g, const ModelOptions& o, const Shape& sample) {
  Shape shape = {o.micro_batch};
  shape.insert(shape.end(), sample.begin(), sample.end());
  m.input = g.input("input", {DType::f32, shape});
}

void expect_image(const std::string& model, const Shape& sample) {
  if (sample.size() != 3)
    throw std::invalid_argument(model + " takes [channels, height, width] samples, got " +
                                shape_str(sample));
}

}  // namespace

void build_mlp(Model& m, Builder&, const ModelOptions& o) {
  Graph& g = m.graph;
  std::vector<std::size_t> shape = {o.micro_batch};
  std::size_t features = 1;
  for (std::size_t d : sample_shape_or(o, {1, 28, 28})) shape.push_back(d), features *= d;
  m.input = g.input("input", {DType::f32, shape});
  m.labels = g.input("labels", {DType::i32, {o.micro_batch}});
  ValueId x = g.reshape(m.input, {o.micro_batch, features}, "flatten");
  // Pipeline split marks: the linear layers spread evenly over the stages.
  const std::size_t layers = o.hidden.size() + 1;
  for (std::size_t i = 0; i < o.hidden.size(); ++i) {
    g.set_stage(even_stage(i, layers, o.pipeline_stages));
    x = g.relu(linear_in_out(g, x, o.hidden[i], "fc" + std::to_string(i)),
               "relu" + std::to_string(i));
  }
  g.set_stage(even_stage(layers - 1, layers, o.pipeline_stages));
  m.logits = linear_in_out(g, x, o.classes, "head");
  m.loss = g.softmax_cross_entropy(m.logits, m.labels, "loss");
}

void build_cnn(Model& m, Builder& b, const ModelOptions& o) {
  Graph& g = m.graph;
  const Shape sample = sample_shape_or(o, {1, 28, 28});
  expect_image("cnn", sample);
  if (sample[1] % 4 != 0 || sample[2] % 4 != 0)
    throw std::invalid_argument("cnn needs height and width divisible by 4, got " +
                                shape_str(sample));
  image_input(m, g, o, sample);
  m.labels = g.input("labels", {DType::i32, {o.micro_batch}});
  const std::size_t c1 = scaled(32, o.width), c2 = scaled(64, o.width),
                    hidden = scaled(128, o.width);
  ValueId x = m.input;
  std::size_t channels[2] = {c1, c2};
  for (int i = 0; i < 2; ++i) {
    Scope s(b, "features" + std::to_string(i));
    g.set_stage(even_stage(static_cast<std::size_t>(i), 3, o.pipeline_stages));
    x = nn::conv2d(b, x, {.out_channels = channels[i], .kernel = 3, .padding = 1, .bias = false},
                   "conv");
    x = nn::relu(b, nn::batch_norm2d(b, x, 1e-5, 0.1, "bn"));
    x = nn::max_pool2d(b, x, 2, 2);
  }
  g.set_stage(even_stage(2, 3, o.pipeline_stages));
  const std::size_t features = g.info(x).elements() / o.micro_batch;
  x = g.reshape(x, {o.micro_batch, features}, "flatten");
  x = nn::relu(b, nn::linear(b, x, hidden, true, "fc1"));
  x = nn::dropout(b, x, 0.25);
  m.logits = nn::linear(b, x, o.classes, true, "fc2");
  m.loss = nn::cross_entropy(b, m.logits, m.labels);
}

namespace {
ValueId bottleneck(Builder& b, ValueId x, std::size_t width, std::size_t stride, bool downsample) {
  Graph& g = b.graph();
  const std::size_t out = width * 4;
  ValueId h = nn::conv2d(b, x, {.out_channels = width, .kernel = 1, .bias = false}, "conv1");
  h = nn::relu(b, nn::batch_norm2d(b, h, 1e-5, 0.1, "bn1"));
  h = nn::conv2d(
      b, h, {.out_channels = width, .kernel = 3, .stride = stride, .padding = 1, .bias = false},
      "conv2");
  h = nn::relu(b, nn::batch_norm2d(b, h, 1e-5, 0.1, "bn2"));
  h = nn::conv2d(b, h, {.out_channels = out, .kernel = 1, .bias = false}, "conv3");
  h = nn::batch_norm2d(b, h, 1e-5, 0.1, "bn3");
  ValueId shortcut = x;
  if (downsample) {
    shortcut = nn::conv2d(b, x, {.out_channels = out, .kernel = 1, .stride = stride, .bias = false},
                          "downsample.0");
    shortcut = nn::batch_norm2d(b, shortcut, 1e-5, 0.1, "downsample.1");
  }
  return nn::relu(b, g.binary(BinaryFn::add, h, shortcut, b.name("residual")));
}
}  // namespace

void build_resnet50(Model& m, Builder& b, const ModelOptions& o) {
  Graph& g = m.graph;
  const Shape sample = sample_shape_or(o, {3, 224, 224});
  expect_image("resnet50", sample);
  image_input(m, g, o, sample);
  m.labels = g.input("labels", {DType::i32, {o.micro_batch}});
  const std::size_t base = scaled(64, o.width);
  ValueId x = nn::conv2d(
      b, m.input, {.out_channels = base, .kernel = 7, .stride = 2, .padding = 3, .bias = false},
      "conv1");
  x = nn::relu(b, nn::batch_norm2d(b, x, 1e-5, 0.1, "bn1"));
  x = nn::max_pool2d(b, x, 3, 2, 1);
  const std::size_t blocks[4] = {repeats(3, o.depth), repeats(4, o.depth), repeats(6, o.depth),
                                 repeats(3, o.depth)};
  const std::size_t total = blocks[0] + blocks[1] + blocks[2] + blocks[3];
  std::size_t index = 0;
  for (std::size_t layer = 0; layer < 4; ++layer) {
    const std::size_t width = base << layer;
    for (std::size_t i = 0; i < blocks[layer]; ++i, ++index) {
      g.set_stage(even_stage(index, total, o.pipeline_stages));
      Scope s(b, "layer" + std::to_string(layer + 1) + "." + std::to_string(i));
      const std::size_t stride = i == 0 && layer > 0 ? 2 : 1;
      x = bottleneck(b, x, width, stride, i == 0);
    }
  }
  x = nn::adaptive_avg_pool2d(b, x, 1, 1);
  x = g.reshape(x, {o.micro_batch, g.info(x).shape[1]}, "flatten");
  m.logits = nn::linear(b, x, o.classes, true, "fc");
  m.loss = nn::cross_entropy(b, m.logits, m.labels);
}

}  // namespace ipupod::models::zoo_impl

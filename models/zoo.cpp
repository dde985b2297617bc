// The zoo's registry, build_model (forward, backward, optimizer) and the model summary.
#include "models/zoo.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "models/autodiff.hpp"
#include "models/onnx_import.hpp"
#include "models/zoo_models.hpp"

namespace ipupod::models {

std::string_view task_name(Task task) {
  switch (task) {
    case Task::classification:
      return "classification";
    case Task::reconstruction:
      return "reconstruction";
    case Task::regression:
      return "regression";
    case Task::image_to_image:
      return "image-to-image";
  }
  return "unknown";
}

std::size_t Model::parameter_count() const {
  std::size_t n = 0;
  for (ValueId p : graph.parameters()) n += graph.info(p).elements();
  return n;
}

std::string Model::summary() const {
  std::ostringstream os;
  os << "model " << name << "\n";
  os << "  input " << graph.info(input).str() << ", labels " << graph.info(labels).str()
     << ", output " << graph.info(logits).str() << " (" << task_name(task) << ")\n";
  // One line per parameterised layer (parameters grouped by their name prefix), by stage.
  std::vector<std::pair<std::string, std::size_t>> layers;
  std::vector<int> stage_of;
  std::map<int, std::size_t> per_stage;
  for (const Op& op : graph.ops()) {
    if (op.kind != OpKind::parameter) continue;
    const std::string& full = op.name;
    const auto dot = full.rfind('.');
    const std::string layer = dot == std::string::npos ? full : full.substr(0, dot);
    const std::size_t n = graph.info(*op.output).elements();
    per_stage[op.pipeline_stage] += n;
    if (!layers.empty() && layers.back().first == layer && stage_of.back() == op.pipeline_stage) {
      layers.back().second += n;
    } else {
      layers.emplace_back(layer, n);
      stage_of.push_back(op.pipeline_stage);
    }
  }
  int current = -1;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (stage_of[i] != current) {
      current = stage_of[i];
      os << "  -- pipeline stage " << current << " (" << per_stage[current] << " parameters)\n";
    }
    os << "    " << layers[i].first << "  " << layers[i].second << "\n";
  }
  std::size_t ops[3] = {0, 0, 0};
  for (const Op& op : graph.ops()) ++ops[static_cast<int>(op.phase)];
  os << "  parameters: " << parameter_count() << "  state values: " << graph.states().size()
     << "  stages: " << graph.max_stage() + 1 << "\n";
  os << "  ops: " << ops[0] << " forward, " << ops[1] << " backward, " << ops[2] << " optimizer\n";
  return os.str();
}

const std::vector<ZooEntry>& zoo() {
  static const std::vector<ZooEntry> entries = {
      {"mlp",
       "multi-layer perceptron classifier: flatten, Linear+ReLU per hidden width, Linear; "
       "softmax cross-entropy; SGD"},
      {"cnn",
       "small CNN for Fashion-MNIST: 2 x (3x3 conv, BatchNorm, ReLU, 2x2 max pool), "
       "Linear 128 + ReLU, dropout, Linear; cross-entropy"},
      {"resnet50",
       "ResNet-50 v1.5 classifier (bottlenecks 3-4-6-3); cross-entropy; "
       "split evenly over its 16 blocks"},
      {"efficientnetv2_s",
       "EfficientNetV2-S conductivity regressor (3x256x256 -> 1 float): "
       "Fused/MBConv stages, SE, stochastic depth, L1 loss; AdamW in the "
       "paper; split [6,2], [5,1,1,1], [1]*8"},
      {"hae",
       "hierarchical VQ autoencoder for 1x64x64 climate patches: GDN DownResBlocks, two "
       "EMA vector quantisers (256 codes), inverse-GDN decoder; 3 x masked MSE + VQ "
       "losses (labels = mask)"},
      {"transcyclegan",
       "transformer CycleGAN for x4 super-resolution on 3x64x64 (input: "
       "bicubic-upsampled LR, labels: HR): 2 generators, 2 multi-scale "
       "discriminators; LSGAN + 10 x cycle L1"},
  };
  return entries;
}

namespace zoo_impl {

Shape sample_shape_or(const ModelOptions& o, Shape fallback) {
  return o.sample_shape.empty() ? fallback : o.sample_shape;
}

int even_stage(std::size_t i, std::size_t units, std::size_t stages) {
  return static_cast<int>(i * std::max<std::size_t>(stages, 1) / std::max<std::size_t>(units, 1));
}

}  // namespace zoo_impl

Model build_model(const std::string& name, const ModelOptions& options) {
  if (options.micro_batch == 0) throw std::invalid_argument("micro-batch must be at least 1");
  if (options.pipeline_stages == 0)
    throw std::invalid_argument("pipeline stages must be at least 1");
  if (options.width <= 0 || options.depth <= 0)
    throw std::invalid_argument("width and depth multipliers must be positive");
  using Build = std::function<void(Model&, Builder&, const ModelOptions&)>;
  static const std::map<std::string, Build> builders = {
      {"mlp", zoo_impl::build_mlp},
      {"cnn", zoo_impl::build_cnn},
      {"resnet50", zoo_impl::build_resnet50},
      {"efficientnetv2_s", zoo_impl::build_efficientnetv2_s},
      {"hae", zoo_impl::build_hae},
      {"transcyclegan", zoo_impl::build_transcyclegan},
  };
  Build build;
  if (is_onnx_model(name)) {  // a model exported from PyTorch
    build = [&name](Model& m, Builder& b, const ModelOptions& o) { build_onnx(m, b, o, name); };
  } else if (const auto it = builders.find(name); it != builders.end()) {
    build = it->second;
  } else {
    std::string known;
    for (const auto& e : zoo()) known += (known.empty() ? "" : ", ") + e.name;
    throw std::invalid_argument("unknown model '" + name + "'; known models: " + known +
                                " (see `ipupod info --models`)");
  }
  Model m;
  m.name = name;
  Builder b(m.graph, options.training, options.seed);
  if (options.assign_stages) {
    ModelOptions unsplit = options;
    unsplit.pipeline_stages = 1;
    build(m, b, unsplit);
    options.assign_stages(m.graph);
  } else {
    build(m, b, options);
  }
  m.graph.set_stage(0);
  m.gradients = build_backward(m.graph, m.loss, options.optimizer.loss_scale);
  build_optimizer(m.graph, m.gradients, options.learning_rate, options.optimizer);
  return m;
}

}  // namespace ipupod::models

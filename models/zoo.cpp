// Zoo models. For now: the MLP classifier of the first end-to-end path.
#include "models/zoo.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "models/autodiff.hpp"

namespace ipupod::models {

std::size_t Model::parameter_count() const {
  std::size_t n = 0;
  for (ValueId p : graph.parameters()) n += graph.info(p).elements();
  return n;
}

std::string Model::summary() const {
  std::ostringstream os;
  os << "model " << name << "\n";
  for (const Op& op : graph.ops()) {
    if (op.phase != Phase::forward || op.kind == OpKind::constant) continue;
    os << "  stage " << op.pipeline_stage << "  " << op_name(op.kind) << " '" << op.name << "' -> "
       << graph.info(*op.output).str() << "\n";
  }
  os << "  parameters: " << parameter_count() << "\n";
  return os.str();
}

const std::vector<ZooEntry>& zoo() {
  static const std::vector<ZooEntry> entries = {
      {"mlp", "multi-layer perceptron classifier: flatten, Linear+ReLU per hidden width, Linear; "
              "softmax cross-entropy; SGD"},
  };
  return entries;
}

namespace {
// Linear layer y = x W + b with PyTorch's default init bound 1/sqrt(fan_in).
ValueId linear(Graph& g, ValueId x, std::size_t out, const std::string& name) {
  const std::size_t in = g.info(x).shape[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  ValueId w = g.parameter(name + ".weight", {DType::f32, {in, out}}, bound);
  ValueId b = g.parameter(name + ".bias", {DType::f32, {out}}, bound);
  return g.add_bias(g.matmul(x, w, false, false, name + ".matmul"), b, name);
}

Model build_mlp(const ModelOptions& o) {
  Model m;
  m.name = "mlp";
  Graph& g = m.graph;
  std::vector<std::size_t> shape = {o.micro_batch};
  std::size_t features = 1;
  for (std::size_t d : o.sample_shape) shape.push_back(d), features *= d;
  m.input = g.input("input", {DType::f32, shape});
  m.labels = g.input("labels", {DType::i32, {o.micro_batch}});
  ValueId x = g.reshape(m.input, {o.micro_batch, features}, "flatten");
  for (std::size_t i = 0; i < o.hidden.size(); ++i)
    x = g.relu(linear(g, x, o.hidden[i], "fc" + std::to_string(i)), "relu" + std::to_string(i));
  m.logits = linear(g, x, o.classes, "head");
  m.loss = g.softmax_cross_entropy(m.logits, m.labels, "loss");
  return m;
}
}  // namespace

Model build_model(const std::string& name, const ModelOptions& options) {
  if (options.micro_batch == 0) throw std::invalid_argument("micro-batch must be at least 1");
  Model m;
  if (name == "mlp") {
    m = build_mlp(options);
  } else {
    std::string known;
    for (const auto& e : zoo()) known += (known.empty() ? "" : ", ") + e.name;
    throw std::invalid_argument("unknown model '" + name + "'; known models: " + known +
                                " (see `ipupod info --models`)");
  }
  m.gradients = build_backward(m.graph, m.loss);
  m.graph.set_phase(Phase::optimizer);
  for (auto [param, grad] : m.gradients)
    m.graph.sgd_step(param, grad, options.learning_rate, m.graph.value(param).name + "/sgd");
  return m;
}

}  // namespace ipupod::models

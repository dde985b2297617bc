// ONNX import: reads a ModelProto with Debian's ONNX library (its generated protobuf classes)
// and maps each node onto IR ops, in the graph's (topological) order.
#include "models/onnx_import.hpp"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

namespace ipupod::models {
namespace {

// An initializer or Constant node's tensor: float values, or int64 ones (shapes, axes).
struct Constant {
  Shape shape;
  std::vector<float> floats;
  std::vector<std::int64_t> ints;
  bool is_float = true;
};

Constant read_tensor(const onnx::TensorProto& t, const std::string& where) {
  Constant c;
  for (std::int64_t d : t.dims()) {
    if (d < 0)
      throw std::invalid_argument(where + ": tensor '" + t.name() + "' has a negative dim");
    c.shape.push_back(static_cast<std::size_t>(d));
  }
  std::size_t count = 1;
  for (std::size_t d : c.shape) count *= d;
  const std::string& raw = t.raw_data();
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      if (!raw.empty()) {
        if (raw.size() != count * sizeof(float))
          throw std::invalid_argument(where + ": tensor '" + t.name() + "' holds " +
                                      std::to_string(raw.size()) + " bytes for " +
                                      std::to_string(count) + " floats");
        c.floats.resize(count);
        std::memcpy(c.floats.data(), raw.data(), raw.size());
      } else {
        c.floats.assign(t.float_data().begin(), t.float_data().end());
      }
      if (c.floats.size() != count)
        throw std::invalid_argument(where + ": tensor '" + t.name() + "' holds " +
                                    std::to_string(c.floats.size()) + " values for " +
                                    std::to_string(count));
      return c;
    case onnx::TensorProto::INT64:
      c.is_float = false;
      if (!raw.empty()) {
        if (raw.size() != count * sizeof(std::int64_t))
          throw std::invalid_argument(where + ": tensor '" + t.name() + "' is cut short");
        c.ints.resize(count);
        std::memcpy(c.ints.data(), raw.data(), raw.size());
      } else {
        c.ints.assign(t.int64_data().begin(), t.int64_data().end());
      }
      if (c.ints.size() != count)
        throw std::invalid_argument(where + ": tensor '" + t.name() + "' is cut short");
      return c;
    default:
      throw std::invalid_argument(where + ": tensor '" + t.name() + "' has ONNX data type " +
                                  std::to_string(t.data_type()) +
                                  "; float32 and int64 tensors are supported");
  }
}

class Importer {
 public:
  Importer(Model& m, Builder& b, const ModelOptions& o, const std::string& path)
      : m_(m), b_(b), g_(b.graph()), o_(o), path_(path) {}

  void run() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw std::invalid_argument("cannot read the ONNX model '" + path_ + "'");
    onnx::ModelProto model;
    if (!model.ParseFromIstream(&in))
      throw std::invalid_argument("'" + path_ +
                                  "' is not an ONNX model (its protobuf does not parse); export "
                                  "one with torch.onnx.export (scripts/export_pytorch_model.py)");
    // The operators are read as opsets 13 to 17 define them (axes as inputs of Squeeze,
    // Unsqueeze, ReduceSum and Split; as an attribute of ReduceMean; Softmax on one axis).
    for (const auto& set : model.opset_import())
      if ((set.domain().empty() || set.domain() == "ai.onnx") &&
          (set.version() < 13 || set.version() > 17))
        throw std::invalid_argument("'" + path_ + "' uses ONNX opset " +
                                    std::to_string(set.version()) +
                                    "; opsets 13 to 17 are read: export with opset_version=13 "
                                    "(scripts/export_pytorch_model.py does)");
    const onnx::GraphProto& graph = model.graph();
    for (const auto& t : graph.initializer())
      constants_.emplace(t.name(), read_tensor(t, "initializer"));
    find_parameters(graph);
    find_silus(graph);
    if (graph.output_size() == 1) output_name_ = graph.output(0).name();
    make_input(graph);
    for (const auto& node : graph.node()) lower(node);
    if (graph.output_size() != 1)
      throw std::invalid_argument("'" + path_ + "' has " + std::to_string(graph.output_size()) +
                                  " outputs; one output is supported: [N, classes] (a "
                                  "classifier), [N, values] (a regressor) or [N, C, ...] (an "
                                  "image or field, with --loss mse or l1)");
    m_.logits = value(graph.output(0).name(), "the graph's output");
    make_loss(graph.output(0).name());
  }

 private:
  // The loss (--loss), against labels shaped as the data's targets: a classifier's [N, classes]
  // softmax cross entropy against class labels; an [N, values] output's mean absolute or
  // squared error against target values (a regressor); an [N, C, ...] output's against target
  // images, or against a field where its mask is 1 when the data's targets are the field and
  // its mask ([2C, ...], as the climate data holds them). auto: cross entropy for [N, classes],
  // the mean absolute error for [N, 1].
  void make_loss(const std::string& output) {
    const Shape logits = g_.info(m_.logits).shape;
    const std::string loss = o_.loss.empty() ? "auto" : o_.loss;
    if (std::find(onnx_losses().begin(), onnx_losses().end(), loss) == onnx_losses().end())
      throw std::invalid_argument("loss '" + loss + "': auto, cross-entropy, mse or l1");
    const std::string n = std::to_string(o_.micro_batch);
    const std::string is =
        "'" + path_ + "': the output '" + output + "' is " + shape_str(logits) + "; ";
    if (logits.size() < 2 || logits[0] != o_.micro_batch || logits[1] == 0)
      throw std::invalid_argument(is + "[" + n + ", classes], [" + n + ", values] or [" + n +
                                  ", C, ...] is supported");
    const bool vector = logits.size() == 2;
    if (loss == "cross-entropy" || (loss == "auto" && vector && logits[1] > 1)) {
      if (!vector || logits[1] < 2)
        throw std::invalid_argument(is + "--loss " + loss + " takes a classifier's [" + n +
                                    ", classes] with two classes or more (for values, images "
                                    "or fields choose --loss mse or l1)");
      m_.labels = g_.input("labels", {DType::i32, {o_.micro_batch}});
      m_.loss = nn::cross_entropy(b_, m_.logits, m_.labels);
      return;
    }
    if (output_log_softmax_)  // scored on its values: made after all
      m_.logits = log_softmax(m_.logits, output + ".log_softmax");
    if (loss == "auto" && !vector)
      throw std::invalid_argument(is + "--loss auto reads a classifier's [" + n +
                                  ", classes] or a regressor's [" + n +
                                  ", 1]; choose --loss mse or l1 to train it against the data's "
                                  "target images or fields");
    const bool l1 = loss != "mse";
    const Shape sample(logits.begin() + 1, logits.end());
    const Shape& t = o_.target_shape;
    if (!vector && t.size() == sample.size() && t[0] == 2 * sample[0] &&
        std::equal(t.begin() + 1, t.end(), sample.begin() + 1)) {
      m_.task = Task::reconstruction;
      Shape labels = {o_.micro_batch};
      labels.insert(labels.end(), t.begin(), t.end());
      m_.labels = g_.input("targets", {DType::f32, labels});
      const ValueId field = g_.slice(m_.labels, 1, 0, sample[0], "target_field");
      const ValueId mask = g_.slice(m_.labels, 1, sample[0], 2 * sample[0], "target_mask");
      m_.loss =
          l1 ? nn::l1_loss(b_, m_.logits, field, mask) : nn::mse_loss(b_, m_.logits, field, mask);
      return;
    }
    m_.task = vector ? Task::regression : Task::image_to_image;
    m_.labels = g_.input(vector ? "labels" : "targets", {DType::f32, logits});
    m_.loss = l1 ? nn::l1_loss(b_, m_.logits, m_.labels) : nn::mse_loss(b_, m_.logits, m_.labels);
  }

 private:
  // Initializers that are weights: every float one (an exported module's parameters) but
  // BatchNormalization's running mean and variance, which are model state.
  void find_parameters(const onnx::GraphProto& graph) {
    std::set<std::string> statistics;
    for (const auto& node : graph.node())
      if (node.op_type() == "BatchNormalization")
        for (int i = 3; i <= 4 && i < node.input_size(); ++i) statistics.insert(node.input(i));
    for (const auto& [name, c] : constants_)
      if (c.is_float && !statistics.count(name)) trained_.insert(name);
  }

  // SiLU as PyTorch exports it, Mul(x, Sigmoid(x)) (or Mul(Sigmoid(x), x)) where nothing else
  // reads the Sigmoid: one SiLU op, as the zoo's models have it (one activation less to keep
  // for the backward pass, one compute set less).
  void find_silus(const onnx::GraphProto& graph) {
    std::map<std::string, int> readers;
    std::map<std::string, std::string> sigmoid_of;  // a Sigmoid's output -> its input
    for (const auto& node : graph.node()) {
      for (const auto& in : node.input()) ++readers[in];
      if (node.op_type() == "Sigmoid" && node.input_size() == 1 && node.output_size() == 1)
        sigmoid_of[node.output(0)] = node.input(0);
    }
    for (const auto& out : graph.output()) ++readers[out.name()];
    for (const auto& node : graph.node()) {
      if (node.op_type() != "Mul" || node.input_size() != 2) continue;
      for (int i = 0; i < 2; ++i) {
        const auto s = sigmoid_of.find(node.input(i));
        if (s != sigmoid_of.end() && s->second == node.input(1 - i) && readers[s->first] == 1) {
          fused_sigmoids_.insert(s->first);
          silu_of_[node.output(0)] = s->second;
          break;
        }
      }
    }
  }

  void make_input(const onnx::GraphProto& graph) {
    std::vector<const onnx::ValueInfoProto*> data;
    for (const auto& in : graph.input())
      if (!constants_.count(in.name())) data.push_back(&in);
    if (data.size() != 1)
      throw std::invalid_argument("'" + path_ + "' has " + std::to_string(data.size()) +
                                  " data inputs; a model with one input [N, ...] is supported");
    const auto& type = data[0]->type().tensor_type();
    if (type.elem_type() != onnx::TensorProto::FLOAT)
      throw std::invalid_argument("'" + path_ + "': the input '" + data[0]->name() +
                                  "' must be float32");
    Shape sample;
    for (int d = 1; d < type.shape().dim_size(); ++d) {
      const auto& dim = type.shape().dim(d);
      if (!dim.has_dim_value() || dim.dim_value() <= 0)
        throw std::invalid_argument("'" + path_ + "': the input '" + data[0]->name() +
                                    "' has no fixed size in dimension " + std::to_string(d) +
                                    "; export with a fixed input shape");
      sample.push_back(static_cast<std::size_t>(dim.dim_value()));
    }
    if (!o_.sample_shape.empty() && o_.sample_shape != sample)
      throw std::invalid_argument("the ONNX model '" + path_ + "' takes samples of " +
                                  shape_str(sample) + ", the data has " +
                                  shape_str(o_.sample_shape));
    Shape shape = {o_.micro_batch};
    shape.insert(shape.end(), sample.begin(), sample.end());
    m_.input = g_.input("input", {DType::f32, shape});
    values_[data[0]->name()] = m_.input;
  }

  // An input of a node: a value computed before, or an initializer as a parameter, state or
  // constant (made on first use).
  ValueId value(const std::string& name, const std::string& where) {
    if (const auto it = values_.find(name); it != values_.end()) return it->second;
    const auto c = constants_.find(name);
    if (c != constants_.end() && !c->second.is_float)
      throw std::invalid_argument(where + ": '" + name +
                                  "' is an int64 constant (shape arithmetic) this operator does "
                                  "not take; export with fixed shapes (torch.flatten, constants "
                                  "instead of x.size()) or with constant folding");
    if (c == constants_.end())
      throw std::invalid_argument(where + ": no float value '" + name + "' computed before");
    const TensorInfo info{DType::f32, c->second.shape};
    const ValueId v = trained_.count(name) ? g_.parameter(name, info, InitKind::fill, 0.0)
                                           : g_.state(name, info, InitKind::fill, 0.0);
    g_.set_initial_values(v, c->second.floats);
    return values_[name] = v;
  }

  const Constant& int_constant(const std::string& name, const std::string& where) {
    const auto c = constants_.find(name);
    if (c == constants_.end() || c->second.is_float)
      throw std::invalid_argument(where + ": '" + name +
                                  "' must be an int64 constant (shapes computed from other values "
                                  "are not supported: export with torch.flatten)");
    return c->second;
  }

  static std::optional<const onnx::AttributeProto*> attribute(const onnx::NodeProto& node,
                                                              const std::string& name) {
    for (const auto& a : node.attribute())
      if (a.name() == name) return &a;
    return std::nullopt;
  }
  static std::int64_t int_attr(const onnx::NodeProto& node, const std::string& name,
                               std::int64_t fallback) {
    const auto a = attribute(node, name);
    return a ? (*a)->i() : fallback;
  }
  static double float_attr(const onnx::NodeProto& node, const std::string& name, double fallback) {
    const auto a = attribute(node, name);
    return a ? (*a)->f() : fallback;
  }
  static std::vector<std::int64_t> ints_attr(const onnx::NodeProto& node, const std::string& name,
                                             std::vector<std::int64_t> fallback) {
    const auto a = attribute(node, name);
    if (!a) return fallback;
    return {(*a)->ints().begin(), (*a)->ints().end()};
  }

  // What a node is, for messages: "node 'conv1' (Conv) with inputs x [1,3,8,8], w [4,3,3,3]".
  std::string describe(const onnx::NodeProto& node) const {
    std::string out = "'" + path_ + "': node '" + node.name() + "' (" + node.op_type() + ")";
    std::string inputs;
    for (const auto& in : node.input()) {
      inputs += (inputs.empty() ? "" : ", ") + in;
      if (const auto it = values_.find(in); it != values_.end())
        inputs += " " + shape_str(g_.info(it->second).shape);
      else if (const auto c = constants_.find(in); c != constants_.end())
        inputs += " " + shape_str(c->second.shape) + " (constant)";
    }
    return out + " with inputs " + (inputs.empty() ? "none" : inputs);
  }

  std::size_t size(std::int64_t v, const onnx::NodeProto& node, const std::string& what) const {
    if (v < 0) throw std::invalid_argument(describe(node) + ": " + what + " is negative");
    return static_cast<std::size_t>(v);
  }

  void lower(const onnx::NodeProto& node) {
    const std::string& op = node.op_type();
    const std::string where = describe(node);
    if (node.output_size() < 1) throw std::invalid_argument(where + ": a node without outputs");
    if (const int needed = inputs_needed(op); node.input_size() < needed)
      throw std::invalid_argument(where + ": " + std::to_string(node.input_size()) +
                                  " inputs, the operator takes at least " + std::to_string(needed));
    const std::string name = node.name().empty() ? node.output(0) : node.name();
    const auto in = [&](int i) { return value(node.input(i), where); };
    const auto has = [&](int i) { return node.input_size() > i && !node.input(i).empty(); };
    ValueId y = -1;
    if (fold_shape_arithmetic(node, where)) return;
    if (op == "Constant") {
      const auto a = attribute(node, "value");
      if (!a) throw std::invalid_argument(where + ": a Constant without a tensor 'value'");
      constants_[node.output(0)] = read_tensor((*a)->t(), where);
      return;
    } else if (op == "Conv" || op == "ConvTranspose") {
      const ValueId x = in(0), w = in(1);
      const Shape& ws = g_.info(w).shape;
      if (ws.size() != 4) throw std::invalid_argument(where + ": 2-D convolutions are supported");
      const Conv2dGeometry geo = conv_geometry(node, where);
      if (op == "Conv") {
        y = g_.conv2d(x, w, geo, name);
      } else {
        if (attribute(node, "output_shape"))
          throw std::invalid_argument(where +
                                      ": output_shape is not supported; export with pads and "
                                      "output_padding (PyTorch's ConvTranspose2d does)");
        const auto extra = ints_attr(node, "output_padding", {0, 0});
        if (extra.size() != 2) throw std::invalid_argument(where + ": expected 2 output_padding");
        y = g_.conv_transpose2d(x, w, geo, size(extra[0], node, "an output_padding"),
                                size(extra[1], node, "an output_padding"), name);
      }
      if (has(2)) y = channel(BinaryFn::add, y, in(2), name + ".bias");
    } else if (op == "BatchNormalization") {
      const ValueId x = in(0), scale = in(1), bias = in(2), mean = in(3), var = in(4);
      for (ValueId s : {mean, var})
        if (g_.producer(s).kind != OpKind::state)
          throw std::invalid_argument(where +
                                      ": the running mean and variance must be "
                                      "initializers");
      const double eps = float_attr(node, "epsilon", 1e-5);
      ValueId xhat;
      if (b_.training()) {  // ONNX's momentum weighs the running value: PyTorch's is 1 - it
        g_.batch_norm_stats_update(x, mean, var, 1.0 - float_attr(node, "momentum", 0.9),
                                   name + ".stats_update");
        xhat = g_.normalize(x, NormKind::batch, eps, 1, name + ".normalize");
      } else {
        xhat = g_.batch_norm_inference(x, mean, var, eps, name + ".normalize");
      }
      y = channel(BinaryFn::add, channel(BinaryFn::mul, xhat, scale, name + ".scale"), bias,
                  name + ".shift");
    } else if (op == "Relu") {
      y = g_.relu(in(0), name);
    } else if (op == "HardSigmoid" || op == "HardSwish") {  // max(0, min(1, alpha x + beta))
      const ValueId x = in(0);
      const bool swish = op == "HardSwish";
      const double alpha = swish ? 1.0 / 6 : float_attr(node, "alpha", 0.2);
      const double beta = swish ? 0.5 : float_attr(node, "beta", 0.5);
      const ValueId t = g_.binary(
          BinaryFn::add, g_.binary(BinaryFn::mul, x, scalar(alpha, name + ".alpha"), name + ".ax"),
          scalar(beta, name + ".beta"), name + ".axb");
      y = clip(t, 0.0, 1.0, swish ? name + ".hard_sigmoid" : name);
      if (swish) y = g_.binary(BinaryFn::mul, x, y, name);
    } else if (op == "Clip") {  // opset 13: min and max as optional constant inputs (ReLU6)
      const auto bound = [&](int i) -> std::optional<double> {
        if (!has(i)) return std::nullopt;
        const auto c = constants_.find(node.input(i));
        if (c == constants_.end() || !c->second.is_float || c->second.floats.size() != 1)
          throw std::invalid_argument(where + ": Clip's bounds must be float constants");
        return c->second.floats[0];
      };
      y = clip(in(0), bound(1), bound(2), name);
    } else if (op == "Gather") {
      y = gather(node, name, where);
    } else if (op == "Sigmoid" && fused_sigmoids_.count(node.output(0))) {
      return;  // made with the Mul that reads it, as one SiLU
    } else if (op == "Mul" && silu_of_.count(node.output(0))) {
      y = g_.unary(UnaryFn::silu, value(silu_of_.at(node.output(0)), where), name);
    } else if (op == "Sigmoid" || op == "Tanh") {
      y = g_.unary(op == "Sigmoid" ? UnaryFn::sigmoid : UnaryFn::tanh, in(0), name);
    } else if (op == "MaxPool" || op == "AveragePool") {
      const auto kernel = ints_attr(node, "kernel_shape", {});
      const auto strides = ints_attr(node, "strides", {1, 1});
      const auto pads = ints_attr(node, "pads", {0, 0, 0, 0});
      if (kernel.size() != 2 || strides.size() != 2 || pads.size() != 4 || pads[0] != pads[2] ||
          pads[1] != pads[3] || int_attr(node, "ceil_mode", 0) != 0)
        throw std::invalid_argument(where +
                                    ": 2-D pooling with equal pads on opposite sides "
                                    "and floor rounding is supported");
      Pool2dGeometry p;
      p.kernel_h = size(kernel[0], node, "the kernel");
      p.kernel_w = size(kernel[1], node, "the kernel");
      p.stride_h = size(strides[0], node, "a stride");
      p.stride_w = size(strides[1], node, "a stride");
      p.pad_h = size(pads[0], node, "a pad");
      p.pad_w = size(pads[1], node, "a pad");
      p.count_include_pad = int_attr(node, "count_include_pad", 0) != 0;
      y = op == "MaxPool" ? g_.max_pool2d(in(0), p, name) : g_.avg_pool2d(in(0), p, name);
    } else if (op == "GlobalAveragePool") {
      Pool2dGeometry p;
      p.adaptive = true;
      p.out_h = p.out_w = 1;
      y = g_.avg_pool2d(in(0), p, name);
    } else if (op == "Flatten" || op == "Reshape") {
      const ValueId x = in(0);
      const Shape& s = g_.info(x).shape;
      Shape out;
      if (op == "Flatten") {
        const std::size_t axis = size(int_attr(node, "axis", 1), node, "axis");
        if (axis > s.size()) throw std::invalid_argument(where + ": axis beyond the input");
        std::size_t head = 1, tail = 1;
        for (std::size_t d = 0; d < s.size(); ++d) (d < axis ? head : tail) *= s[d];
        out = {head, tail};
      } else {
        const Constant& target = int_constant(node.input(1), where);
        std::size_t known = 1;
        std::optional<std::size_t> unknown;
        for (std::size_t d = 0; d < target.ints.size(); ++d) {
          const std::int64_t v = target.ints[d];
          if (v == -1 && !unknown) {
            unknown = d;
            out.push_back(1);
            continue;
          }
          const std::size_t dim = v == 0 && d < s.size() ? s[d] : size(v, node, "a shape entry");
          out.push_back(dim);
          known *= dim;
        }
        const std::size_t total = g_.info(x).elements();
        if (unknown) {
          if (known == 0 || total % known != 0)
            throw std::invalid_argument(where + ": the shape does not divide the input");
          out[*unknown] = total / known;
        }
      }
      y = g_.reshape(x, out, name);
    } else if (op == "Gemm") {
      if (int_attr(node, "transA", 0) != 0 || float_attr(node, "alpha", 1) != 1 ||
          float_attr(node, "beta", 1) != 1)
        throw std::invalid_argument(where +
                                    ": Gemm with transA = 0 and alpha = beta = 1 (a "
                                    "Linear layer) is supported");
      y = g_.matmul(in(0), in(1), false, int_attr(node, "transB", 0) != 0, name);
      if (has(2)) {
        const ValueId c = in(2);
        y = g_.info(c).shape.size() == 1 ? g_.add_bias(y, c, name + ".bias")
                                         : g_.binary(BinaryFn::add, y, c, name + ".bias");
      }
    } else if (op == "MatMul") {
      y = matmul(in(0), in(1), name, where);
    } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
      const BinaryFn fn = op == "Add"   ? BinaryFn::add
                          : op == "Sub" ? BinaryFn::sub
                          : op == "Mul" ? BinaryFn::mul
                                        : BinaryFn::div;
      y = g_.binary(fn, in(0), in(1), name);
    } else if (op == "Identity" || op == "Dropout") {  // inference-mode Dropout: identity
      y = in(0);
    } else if (op == "Sqrt" || op == "Exp" || op == "Log" || op == "Neg" || op == "Abs" ||
               op == "Erf") {
      const UnaryFn fn = op == "Sqrt"  ? UnaryFn::sqrt
                         : op == "Exp" ? UnaryFn::exp
                         : op == "Log" ? UnaryFn::log
                         : op == "Neg" ? UnaryFn::neg
                         : op == "Erf" ? UnaryFn::erf
                                       : UnaryFn::abs;
      y = g_.unary(fn, in(0), name);
    } else if (op == "Reciprocal") {
      y = g_.binary(BinaryFn::div, scalar(1.0, name + ".one"), in(0), name);
    } else if (op == "Pow") {
      const auto e = constants_.find(node.input(1));
      if (e == constants_.end() || !e->second.is_float || e->second.floats.size() != 1 ||
          (e->second.floats[0] != 2 && e->second.floats[0] != 0.5f && e->second.floats[0] != 1 &&
           e->second.floats[0] != 3))
        throw std::invalid_argument(where +
                                    ": Pow with a constant exponent 0.5, 1, 2 or 3 is "
                                    "supported");
      const float exponent = e->second.floats[0];
      const ValueId x = in(0);
      y = exponent == 1     ? x
          : exponent == 0.5 ? g_.unary(UnaryFn::sqrt, x, name)
          : exponent == 2
              ? g_.unary(UnaryFn::square, x, name)
              : g_.binary(BinaryFn::mul, g_.unary(UnaryFn::square, x, name + ".square"), x, name);
    } else if (op == "Softmax" || op == "LogSoftmax") {
      const ValueId x = in(0);
      const std::size_t rank = g_.info(x).shape.size();
      if (axis(int_attr(node, "axis", -1), rank, where) != rank - 1)
        throw std::invalid_argument(where + ": " + op + " over the last axis is supported");
      if (op == "Softmax") {
        y = g_.softmax(x, name);
      } else if (node.output(0) == output_name_ && rank == 2) {
        // A classifier's LogSoftmax output (for PyTorch's NLLLoss): softmax cross entropy of
        // the logits is the same loss, so it is left for make_loss to add only when another
        // loss scores its values.
        y = x;
        output_log_softmax_ = true;
      } else {
        y = log_softmax(x, name);
      }
    } else if (op == "Transpose") {
      const ValueId x = in(0);
      const std::size_t rank = g_.info(x).shape.size();
      std::vector<std::int64_t> reversed;
      for (std::size_t d = rank; d-- > 0;) reversed.push_back(static_cast<std::int64_t>(d));
      std::vector<std::size_t> perm;
      for (std::int64_t d : ints_attr(node, "perm", reversed)) perm.push_back(axis(d, rank, where));
      y = g_.permute(x, perm, name);
    } else if (op == "Concat") {
      std::vector<ValueId> parts;
      for (int i = 0; i < node.input_size(); ++i) parts.push_back(in(i));
      y = g_.concat(
          parts, axis(int_attr(node, "axis", 0), g_.info(parts.at(0)).shape.size(), where), name);
    } else if (op == "Squeeze" || op == "Unsqueeze") {
      const ValueId x = in(0);
      Shape shape = g_.info(x).shape;
      std::vector<std::int64_t> axes;
      if (has(1)) axes = int_constant(node.input(1), where).ints;
      if (op == "Unsqueeze" && axes.empty())
        throw std::invalid_argument(where + ": Unsqueeze needs its axes (input 1)");
      if (op == "Unsqueeze") {
        const std::size_t rank = shape.size() + axes.size();
        std::vector<std::size_t> at;
        for (std::int64_t a : axes) at.push_back(axis(a, rank, where));
        std::sort(at.begin(), at.end());
        for (std::size_t a : at) shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(a), 1);
      } else {
        std::vector<bool> drop(shape.size(), axes.empty());
        for (std::int64_t a : axes) drop[axis(a, shape.size(), where)] = true;
        Shape kept;
        for (std::size_t d = 0; d < shape.size(); ++d) {
          if (drop[d] && shape[d] != 1 && !axes.empty())
            throw std::invalid_argument(where + ": squeezes axis " + std::to_string(d) +
                                        " of size " + std::to_string(shape[d]) + ", not 1");
          if (!drop[d] || shape[d] != 1) kept.push_back(shape[d]);
        }
        shape = kept;
      }
      y = g_.reshape(x, shape, name);
    } else if (op == "LayerNormalization") {  // opset 17: over the axes from `axis` on
      for (int o = 1; o < node.output_size(); ++o)
        if (!node.output(o).empty())
          throw std::invalid_argument(where +
                                      ": its Mean and InvStdDev outputs are not read here; export "
                                      "the layer for inference (they are unused then)");
      const ValueId x = in(0);
      const Shape shape = g_.info(x).shape;
      const std::size_t a = axis(int_attr(node, "axis", -1), shape.size(), where);
      Shape rows(shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(a));
      std::size_t inner = 1;
      for (std::size_t d = a; d < shape.size(); ++d) inner *= shape[d];
      rows.push_back(inner);
      const bool last = a + 1 == shape.size();
      y = g_.normalize(last ? x : g_.reshape(x, rows, name + ".rows"), NormKind::layer,
                       float_attr(node, "epsilon", 1e-5f), 1, name + ".normalize");
      if (!last) y = g_.reshape(y, shape, name + ".shape");
      y = g_.binary(BinaryFn::mul, y, in(1), name + ".scale");
      if (has(2)) y = g_.binary(BinaryFn::add, y, in(2), name + ".shift");
    } else if (op == "ReduceMean" || op == "ReduceSum") {
      const ValueId x = in(0);
      const std::size_t rank = g_.info(x).shape.size();
      std::vector<std::int64_t> given =
          op == "ReduceMean"
              ? ints_attr(node, "axes", {})
              : (has(1) ? int_constant(node.input(1), where).ints : std::vector<std::int64_t>{});
      std::vector<std::size_t> axes;
      for (std::int64_t a : given) axes.push_back(axis(a, rank, where));
      std::sort(axes.begin(), axes.end());
      if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
        throw std::invalid_argument(where + ": an axis given twice");
      if (axes.empty() && op == "ReduceSum" && int_attr(node, "noop_with_empty_axes", 0) != 0) {
        values_[node.output(0)] = x;
        return;
      }
      if (axes.empty())
        for (std::size_t d = 0; d < rank; ++d) axes.push_back(d);
      const bool keep = int_attr(node, "keepdims", 1) != 0;
      y = op == "ReduceMean" ? g_.reduce_mean(x, axes, keep, name)
                             : g_.reduce_sum(x, axes, keep, 1.0, name);
    } else if (op == "Split") {  // several outputs: each a slice along the axis
      const ValueId x = in(0);
      const Shape shape = g_.info(x).shape;  // a copy: each slice adds a value to the graph
      const std::size_t a = axis(int_attr(node, "axis", 0), shape.size(), where);
      std::vector<std::int64_t> sizes;
      if (has(1)) sizes = int_constant(node.input(1), where).ints;
      const auto parts = static_cast<std::size_t>(node.output_size());
      if (sizes.empty()) {
        if (parts == 0 || shape[a] % parts != 0)
          throw std::invalid_argument(where + ": the axis does not split into equal parts");
        sizes.assign(parts, static_cast<std::int64_t>(shape[a] / parts));
      }
      if (sizes.size() != parts)
        throw std::invalid_argument(where + ": " + std::to_string(sizes.size()) + " sizes for " +
                                    std::to_string(parts) + " outputs");
      std::size_t at = 0;
      for (std::size_t i = 0; i < parts; ++i) {
        const std::size_t n = size(sizes[i], node, "a split size");
        if (n == 0 || at + n > shape[a])
          throw std::invalid_argument(where + ": the sizes do not split the axis");
        values_[node.output(static_cast<int>(i))] =
            g_.slice(x, a, at, at + n, name + "." + std::to_string(i));
        at += n;
      }
      if (at != shape[a]) throw std::invalid_argument(where + ": the sizes do not split the axis");
      return;
    } else if (op == "Slice") {
      y = in(0);
      const auto& starts = int_constant(node.input(1), where).ints;
      const auto& ends = int_constant(node.input(2), where).ints;
      const std::size_t rank = g_.info(y).shape.size();
      std::vector<std::int64_t> axes;
      if (has(3)) axes = int_constant(node.input(3), where).ints;
      for (std::size_t i = axes.size(); i < starts.size(); ++i)
        axes.push_back(static_cast<std::int64_t>(i));
      if (has(4))
        for (std::int64_t step : int_constant(node.input(4), where).ints)
          if (step != 1)
            throw std::invalid_argument(where + ": Slice with steps of 1 is supported");
      if (starts.size() != ends.size() || axes.size() != starts.size())
        throw std::invalid_argument(where + ": starts, ends and axes differ in length");
      for (std::size_t i = 0; i < starts.size(); ++i) {
        const std::size_t a = axis(axes[i], rank, where);
        const auto dim = static_cast<std::int64_t>(g_.info(y).shape[a]);
        const auto b = static_cast<std::size_t>(clamped(starts[i], dim)),
                   e = std::max(b, static_cast<std::size_t>(clamped(ends[i], dim)));
        if (b == e) throw std::invalid_argument(where + ": an empty slice");
        y = g_.slice(y, a, b, e, name + (i ? "." + std::to_string(i) : ""));
      }
    } else {
      throw std::invalid_argument(
          where + ": operator " + op +
          " is not supported (supported: Conv, ConvTranspose, BatchNormalization, "
          "Softmax, LogSoftmax, Transpose, Concat, Split, Squeeze, Unsqueeze, Slice, "
          "ReduceMean, ReduceSum, Sqrt, Exp, Log, Neg, Abs, Erf, Reciprocal, "
          "Pow, LayerNormalization, Gather (constant indices), Shape, "
          "Relu, Sigmoid, Tanh, HardSigmoid, HardSwish, Clip, MaxPool, AveragePool, "
          "GlobalAveragePool, "
          "Flatten, Reshape, Gemm, MatMul, Add, Sub, Mul, Div, Identity, "
          "Dropout, Constant)");
    }
    values_[node.output(0)] = y;
  }

  // Shape arithmetic that an export without constant folding holds (x.flatten(2) exports as
  // Shape, Slice, Concat, Reshape): shapes are fixed here, so Shape gives an int64 constant,
  // and Slice, Concat, Gather, Squeeze and Unsqueeze of int64 constants give constants too.
  // True when the node was folded.
  bool fold_shape_arithmetic(const onnx::NodeProto& node, const std::string& where) {
    const std::string& op = node.op_type();
    const auto ints = [&](int i) -> const Constant* {
      if (node.input_size() <= i || node.input(i).empty()) return nullptr;
      const auto c = constants_.find(node.input(i));
      return c == constants_.end() || c->second.is_float ? nullptr : &c->second;
    };
    Constant out;
    out.is_float = false;
    if (op == "Shape") {
      const Shape& shape = g_.info(value(node.input(0), where)).shape;
      const auto rank = static_cast<std::int64_t>(shape.size());
      const std::int64_t b = clamped(int_attr(node, "start", 0), rank),
                         e = clamped(int_attr(node, "end", rank), rank);
      for (std::int64_t d = b; d < e; ++d)
        out.ints.push_back(static_cast<std::int64_t>(shape[static_cast<std::size_t>(d)]));
    } else if (op == "Concat" || op == "Slice" || op == "Gather" || op == "Squeeze" ||
               op == "Unsqueeze") {
      const Constant* data = ints(0);
      if (!data || data->shape.size() > 1) return false;  // float values, or not a shape
      if (op == "Concat") {
        for (int i = 0; i < node.input_size(); ++i) {
          const Constant* part = ints(i);
          if (!part || part->shape.size() != 1) return false;
          out.ints.insert(out.ints.end(), part->ints.begin(), part->ints.end());
        }
      } else if (op == "Slice") {
        const Constant *starts = ints(1), *ends = ints(2), *axes = ints(3), *steps = ints(4);
        if (!starts || !ends || starts->ints.size() != 1 || ends->ints.size() != 1 ||
            (axes && (axes->ints.size() != 1 || (axes->ints[0] != 0 && axes->ints[0] != -1))) ||
            (steps && (steps->ints.size() != 1 || steps->ints[0] != 1)))
          throw std::invalid_argument(where +
                                      ": a Slice of a shape with one start, end and axis "
                                      "and step 1 is supported");
        const auto n = static_cast<std::int64_t>(data->ints.size());
        for (std::int64_t i = clamped(starts->ints[0], n); i < clamped(ends->ints[0], n); ++i)
          out.ints.push_back(data->ints[static_cast<std::size_t>(i)]);
      } else if (op == "Gather") {
        const Constant* at = ints(1);
        if (!at || at->shape.size() > 1)
          throw std::invalid_argument(where +
                                      ": a Gather of a shape by constant indices of "
                                      "rank 0 or 1 is supported");
        for (std::int64_t i : at->ints)
          out.ints.push_back(data->ints[index(i, data->ints.size(), "index", where)]);
        out.shape = at->shape;
      } else {  // Squeeze or Unsqueeze of a scalar or a vector of one: the values stay
        out.ints = data->ints;
        if (op == "Unsqueeze" && data->shape.empty()) {
          out.shape = {1};
        } else if (op == "Squeeze" && data->ints.size() == 1) {
          out.shape = {};
        } else {
          throw std::invalid_argument(where + ": " + op + " of a shape of " +
                                      std::to_string(data->ints.size()) + " values");
        }
      }
    } else {
      return false;
    }
    if (op == "Shape" || op == "Concat" || op == "Slice") out.shape = {out.ints.size()};
    constants_[node.output(0)] = out;
    return true;
  }

  // The fewest inputs an operator takes (opsets 13 to 17): its required ones.
  static int inputs_needed(const std::string& op) {
    if (op == "Constant") return 0;
    if (op == "BatchNormalization") return 5;
    if (op == "Slice") return 3;
    if (op == "Gather") return 2;
    if (op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul" || op == "Add" ||
        op == "Sub" || op == "Mul" || op == "Div" || op == "Pow" || op == "Reshape" ||
        op == "LayerNormalization")
      return 2;
    return 1;
  }

  // An ONNX index (negative from the end) into `size` entries: an `what` ("axis", "index")
  // outside them is an error.
  static std::size_t index(std::int64_t i, std::size_t size, const std::string& what,
                           const std::string& where) {
    const auto n = static_cast<std::int64_t>(size);
    if (i < -n || i >= n)
      throw std::invalid_argument(where + ": " + what + " " + std::to_string(i) + " of " +
                                  std::to_string(size));
    return static_cast<std::size_t>(i < 0 ? i + n : i);
  }
  // An ONNX axis of a rank-`rank` value.
  static std::size_t axis(std::int64_t a, std::size_t rank, const std::string& where) {
    return index(a, rank, "axis", where);
  }
  // A Slice or Shape bound (negative from the end) clamped into [0, size].
  static std::int64_t clamped(std::int64_t v, std::int64_t size) {
    return std::clamp<std::int64_t>(v < 0 ? v + size : v, 0, size);
  }

  // MatMul as NumPy's: [m, k] x [k, n]; [..., m, k] x [k, n] (a Linear layer on a sequence:
  // the leading dimensions folded into m); [..., m, k] x [..., k, n] with the same leading ones.
  ValueId matmul(ValueId a, ValueId b, const std::string& name, const std::string& where) {
    const Shape sa = g_.info(a).shape, sb = g_.info(b).shape;
    if (sa.size() == 2 && sb.size() == 2) return g_.matmul(a, b, false, false, name);
    if (sa.size() > 2 && sb.size() == 2) {
      const std::size_t k = sa.back(), m = g_.info(a).elements() / std::max<std::size_t>(k, 1);
      Shape out(sa.begin(), sa.end() - 1);
      out.push_back(sb[1]);
      return g_.reshape(g_.matmul(g_.reshape(a, {m, k}, name + ".rows"), b, false, false, name),
                        out, name + ".view");
    }
    if (sa.size() == sb.size() && sa.size() > 2) return g_.batch_matmul(a, b, false, false, name);
    throw std::invalid_argument(where + ": MatMul of " + shape_str(sa) + " and " + shape_str(sb) +
                                " is not supported (2-D, a sequence by a matrix, or batches of "
                                "one rank)");
  }

  // A Conv's or ConvTranspose's strides, dilations, explicit pads and groups.
  Conv2dGeometry conv_geometry(const onnx::NodeProto& node, const std::string& where) const {
    const auto strides = ints_attr(node, "strides", {1, 1});
    const auto dilations = ints_attr(node, "dilations", {1, 1});
    const auto pads = ints_attr(node, "pads", {0, 0, 0, 0});
    if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4)
      throw std::invalid_argument(where + ": expected 2 strides, 2 dilations and 4 pads");
    const auto auto_pad = attribute(node, "auto_pad");
    if (auto_pad && (*auto_pad)->s() != "NOTSET")
      throw std::invalid_argument(where + ": auto_pad " + (*auto_pad)->s() +
                                  " is not supported; export with explicit pads");
    Conv2dGeometry geo;
    geo.stride_h = size(strides[0], node, "a stride");
    geo.stride_w = size(strides[1], node, "a stride");
    geo.dilation_h = size(dilations[0], node, "a dilation");
    geo.dilation_w = size(dilations[1], node, "a dilation");
    geo.pad_top = size(pads[0], node, "a pad");
    geo.pad_left = size(pads[1], node, "a pad");
    geo.pad_bottom = size(pads[2], node, "a pad");
    geo.pad_right = size(pads[3], node, "a pad");
    geo.groups = size(int_attr(node, "group", 1), node, "group");
    return geo;
  }

  // LogSoftmax as the log of the (max-shifted) softmax: -inf where a probability underflows
  // float32 (a logit ~87 below the largest), and then a NaN gradient there.
  ValueId log_softmax(ValueId x, const std::string& name) {
    return g_.unary(UnaryFn::log, g_.softmax(x, name + ".softmax"), name);
  }

  ValueId scalar(double v, const std::string& name) {
    return g_.constant(name, {DType::f32, {1}}, v);
  }

  // min(max(x, lo), hi) from ReLUs, which give the gradients: lo + relu(x - lo), then
  // hi - relu(hi - that).
  ValueId clip(ValueId x, std::optional<double> lo, std::optional<double> hi,
               const std::string& name) {
    ValueId y = x;
    if (lo) {
      y = *lo == 0 ? g_.relu(y, name + ".lo")
                   : g_.binary(BinaryFn::add,
                               g_.relu(g_.binary(BinaryFn::sub, y, scalar(*lo, name + ".min"),
                                                 name + ".over_min"),
                                       name + ".lo_relu"),
                               scalar(*lo, name + ".min_back"), name + ".lo");
    }
    if (hi) {
      const ValueId top = scalar(*hi, name + ".max");
      y = g_.binary(
          BinaryFn::sub, top,
          g_.relu(g_.binary(BinaryFn::sub, top, y, name + ".under_max"), name + ".hi_relu"), name);
    }
    return y;
  }

  // Gather of constant indices (a class token x[:, 0], an embedding of fixed positions): runs
  // of consecutive indices as slices along the axis, joined, shaped as ONNX says:
  // data.shape[:axis] + indices.shape + data.shape[axis + 1:].
  ValueId gather(const onnx::NodeProto& node, const std::string& name, const std::string& where) {
    const auto c = constants_.find(node.input(1));
    if (c == constants_.end() || c->second.is_float)
      throw std::invalid_argument(where +
                                  ": Gather with indices computed by the graph or taken from "
                                  "the data (an embedding of token ids) is not supported; "
                                  "constant int64 indices are (x[:, 0], a fixed position table)");
    const Constant indices = c->second;  // a copy: value() below may add constants
    const ValueId x = value(node.input(0), where);
    const Shape shape = g_.info(x).shape;
    const std::size_t a = axis(int_attr(node, "axis", 0), shape.size(), where);
    std::vector<std::size_t> at;
    for (std::int64_t i : indices.ints) at.push_back(index(i, shape[a], "index", where));
    if (at.empty()) throw std::invalid_argument(where + ": no indices");
    std::vector<ValueId> parts;
    for (std::size_t b = 0; b < at.size();) {
      std::size_t e = b + 1;
      while (e < at.size() && at[e] == at[e - 1] + 1) ++e;
      parts.push_back(
          g_.slice(x, a, at[b], at[e - 1] + 1, name + ".run" + std::to_string(parts.size())));
      b = e;
    }
    const ValueId joined = parts.size() == 1 ? parts[0] : g_.concat(parts, a, name + ".join");
    Shape out(shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(a));
    out.insert(out.end(), indices.shape.begin(), indices.shape.end());
    out.insert(out.end(), shape.begin() + static_cast<std::ptrdiff_t>(a) + 1, shape.end());
    return g_.reshape(joined, out, name);
  }

  // x [n, c, ...] (op) v [c], as a per-channel scale or shift.
  ValueId channel(BinaryFn fn, ValueId x, ValueId v, const std::string& name) {
    Shape s(g_.info(x).shape.size(), 1);
    s[1] = g_.info(v).elements();
    return g_.binary(fn, x, g_.reshape(v, s, name + ".view"), name);
  }

  Model& m_;
  Builder& b_;
  Graph& g_;
  const ModelOptions& o_;
  const std::string path_;
  std::map<std::string, Constant> constants_;
  std::set<std::string> trained_;
  std::string output_name_;               // the graph's one output
  bool output_log_softmax_ = false;       // it is a LogSoftmax, not yet applied (see make_loss)
  std::set<std::string> fused_sigmoids_;  // Sigmoid outputs made as part of a SiLU
  std::map<std::string, std::string> silu_of_;  // a SiLU's Mul output -> its input
  std::map<std::string, ValueId> values_;
};

}  // namespace

const std::vector<std::string>& onnx_losses() {
  static const std::vector<std::string> kLosses = {"auto", "cross-entropy", "mse", "l1"};
  return kLosses;
}

bool is_onnx_model(const std::string& name) {
  return name.size() > 5 && name.compare(name.size() - 5, 5, ".onnx") == 0;
}

void build_onnx(Model& m, Builder& b, const ModelOptions& o, const std::string& path) {
  Importer(m, b, o, path).run();
}

}  // namespace ipupod::models

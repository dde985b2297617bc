// The model zoo: named models built from the IR, each with its loss, gradients and optimizer
// step, ready for the interpreter or the pod compiler.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "models/ir.hpp"
#include "models/optimizers.hpp"

namespace ipupod::models {

struct ModelOptions {
  std::size_t micro_batch = 1;
  // One input sample, e.g. {1, 28, 28}; empty: the model's own (e.g. {3, 256, 256} for
  // efficientnetv2_s). Models with a fixed geometry (hae) reject other shapes.
  std::vector<std::size_t> sample_shape;
  std::size_t classes = 10;
  // An ONNX model's loss: "auto" (from its output's shape), "cross-entropy", "mse" or "l1",
  // and one sample's targets as the data holds them (empty: unknown, e.g. in a compile).
  std::string loss = "auto";
  std::vector<std::size_t> target_shape;
  std::vector<std::size_t> hidden = {128};  // mlp: widths of the hidden layers
  double learning_rate = 0.05;
  OptimizerOptions optimizer;       // default: plain SGD at learning_rate
  bool training = true;             // false: eval-mode BatchNorm, no dropout, no EMA updates
  double width = 1.0;               // channel / embedding width multiplier (small test configs)
  double depth = 1.0;               // block repeat multiplier
  std::size_t pipeline_stages = 1;  // how many stages the model's split marks divide it into
  std::uint64_t seed = 0;           // dropout / stochastic-depth streams
  // When set, places the forward ops (built unsplit) on pipeline stages instead of the model's
  // split marks, before autodiff (see models/pipeline_split.hpp).
  std::function<void(Graph&)> assign_stages;
};

// What the model's outputs are scored by: class labels (accuracy), a field to reconstruct
// (PSNR over the valid cells, compression ratio), a target value (mean absolute error) or a
// target image (PSNR, next to the input's own).
enum class Task : std::uint8_t { classification, reconstruction, regression, image_to_image };
std::string_view task_name(Task task);

struct Model {
  std::string name;
  Task task = Task::classification;
  double compression_ratio = 0;  // reconstruction: input bits over the bits of the codes
  Graph graph;
  ValueId input = -1, labels = -1, logits = -1, loss = -1;
  std::map<ValueId, ValueId> gradients;    // parameter -> its gradient
  std::map<std::string, ValueId> metrics;  // extra scalars worth reporting (e.g. "vq_loss")
  std::size_t parameter_count() const;
  std::string summary() const;  // layer table, parameter count, split points
};

struct ZooEntry {
  std::string name;
  std::string description;
};
const std::vector<ZooEntry>& zoo();
// Builds forward, backward and optimizer ops; throws std::invalid_argument for an unknown name
// or a sample shape the model cannot take.
Model build_model(const std::string& name, const ModelOptions& options);

}  // namespace ipupod::models

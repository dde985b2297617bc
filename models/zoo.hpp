// The model zoo: named models built from the IR, each with its loss, gradients and optimizer
// step, ready for the interpreter or the pod compiler.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "models/ir.hpp"

namespace ipupod::models {

struct ModelOptions {
  std::size_t micro_batch = 1;
  std::vector<std::size_t> sample_shape;  // one input sample, e.g. {1, 28, 28}
  std::size_t classes = 10;
  std::vector<std::size_t> hidden = {128};  // mlp: widths of the hidden layers
  double learning_rate = 0.05;
};

struct Model {
  std::string name;
  Graph graph;
  ValueId input = -1, labels = -1, logits = -1, loss = -1;
  std::map<ValueId, ValueId> gradients;  // parameter -> its gradient
  std::size_t parameter_count() const;
  std::string summary() const;          // layer table, parameter count, split points
};

struct ZooEntry {
  std::string name;
  std::string description;
};
const std::vector<ZooEntry>& zoo();
// Builds forward, backward and SGD ops; throws std::invalid_argument for an unknown name.
Model build_model(const std::string& name, const ModelOptions& options);

}  // namespace ipupod::models

// Data checks of the host rank: the data set against the model, before anything compiles.
#include "pod/job/data_checks.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace ipupod::pod {
namespace {

std::vector<std::size_t> every_index(std::size_t n) {
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = i;
  return all;
}

// The split's description, after checking its inputs are float32 as every model takes them.
host::SplitInfo float_input_split(const host::DatasetFile& file, const char* split) {
  host::SplitInfo info = file.info(split);
  if (info.inputs.dtype != host::DType::f32)
    throw host::DatasetError(file.path() + ": /" + split + "/inputs is " +
                             std::string(host::dtype_name(info.inputs.dtype)) +
                             ", the model needs float32 inputs");
  return info;
}

// Checks the data set suits a classifier and returns the class count (max label + 1).
}  // namespace

std::size_t check_classification_data(const host::DatasetFile& file) {
  std::int32_t max_label = -1;
  for (const char* split : {"train", "test"}) {
    const host::SplitInfo info = float_input_split(file, split);
    if (info.targets.dtype != host::DType::i32 || !info.targets.sample_shape.empty())
      throw host::DatasetError(file.path() + ": /" + split +
                               "/targets must hold one int32 class "
                               "label per sample for a classifier, got " +
                               std::string(host::dtype_name(info.targets.dtype)) + " of shape " +
                               host::shape_string(info.targets.sample_shape));
    const host::HostArray labels = file.read_targets(split, every_index(info.samples));
    for (std::size_t i = 0; i < labels.elements(); ++i) {
      const std::int32_t y = labels.as<const std::int32_t>()[i];
      if (y < 0)
        throw host::DatasetError(file.path() + ": /" + split + "/targets[" + std::to_string(i) +
                                 "] is " + std::to_string(y) + "; class labels must be >= 0");
      max_label = std::max(max_label, y);
    }
  }
  return static_cast<std::size_t>(max_label) + 1;
}

// What the host scores a model's test outputs against, read from the data set once.
Scoring check_target_data(const host::DatasetFile& file, const models::Model& model) {
  const models::TensorInfo& labels = model.graph.info(model.labels);
  const std::vector<std::size_t> expected(labels.shape.begin() + 1, labels.shape.end());
  const bool field = model.task == models::Task::reconstruction;
  for (const char* split : {"train", "test"}) {
    const host::SplitInfo info = float_input_split(file, split);
    if (info.targets.dtype != host::DType::f32 || info.targets.sample_shape != expected)
      throw host::DatasetError(
          file.path() + ": /" + split + "/targets must be float32 of shape " +
          host::shape_string(expected) + " per sample for model " + model.name + " (" +
          std::string(models::task_name(model.task)) + (field ? ": the field, then its mask" : "") +
          "), got " + std::string(host::dtype_name(info.targets.dtype)) + " of shape " +
          host::shape_string(info.targets.sample_shape) +
          " (check --model and --data, or convert the data with `ipupod data`)");
  }
  Scoring scoring;
  scoring.task = model.task;
  scoring.compression_ratio = model.compression_ratio;
  const host::HostArray test = file.read_targets("test", every_index(file.info("test").samples));
  const auto t = test.as<const float>();
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  const std::size_t cells = expected.empty() ? 1 : host::shape_elements(expected) / (field ? 2 : 1);
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (field) {  // sample k's field occupies [2k cells, 2k cells + cells); its mask follows
      const std::size_t k = i / (2 * cells), c = i % (2 * cells);
      if (c >= cells || t[(2 * k + 1) * cells + c] == 0) continue;
    }
    lo = std::min<double>(lo, t[i]);
    hi = std::max<double>(hi, t[i]);
  }
  scoring.target_range = hi > lo ? hi - lo : 1;
  if (model.task == models::Task::regression) {
    const host::HostArray train =
        file.read_targets("train", every_index(file.info("train").samples));
    double sum = 0;
    for (float v : train.as<const float>()) sum += v;
    scoring.train_mean = train.elements() ? sum / static_cast<double>(train.elements()) : 0;
  }
  return scoring;
}

}  // namespace ipupod::pod

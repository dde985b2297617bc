// Data checks of the host rank: the data set against the model, before anything compiles.
#include "pod/job/data_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
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

// A class count read from an attribute: a whole number in [1, 2^31 - 1] (labels are int32).
std::size_t class_count(const host::DatasetFile& file, const std::string& where, double value) {
  if (!(value >= 1 && value <= std::numeric_limits<std::int32_t>::max()) ||
      value != std::floor(value))
    throw host::DatasetError(file.path() + ": the attribute 'classes' of " + where + " is " +
                             std::to_string(value) +
                             "; it must be the class count, a whole number of at least 1 "
                             "(rewrite it, or convert the data again with `ipupod data`)");
  return static_cast<std::size_t>(value);
}

}  // namespace

void check_input_shape(const host::DatasetFile& file, const models::Model& model) {
  const std::vector<std::size_t>& input = model.graph.info(model.input).shape;
  const std::vector<std::size_t> expected(input.begin() + 1, input.end());
  const host::SplitInfo info = file.info("train");
  const std::vector<std::size_t>& got = info.inputs.sample_shape;
  if (got == expected) return;
  std::vector<std::size_t> stored{info.samples}, wanted{info.samples};
  stored.insert(stored.end(), got.begin(), got.end());
  wanted.insert(wanted.end(), expected.begin(), expected.end());
  throw host::DatasetError(
      file.path() + ": /train/inputs is " + host::shape_string(stored) + ", samples of shape " +
      host::shape_string(got) + " (rank " + std::to_string(got.size()) + "), but model " +
      model.name + " takes samples of shape " + host::shape_string(expected) + " (rank " +
      std::to_string(expected.size()) + "); store the inputs as " + host::shape_string(wanted) +
      " (the sample dimension first), or choose the model that takes these samples with --model");
}

std::size_t declared_classes(const host::DatasetFile& file) {
  std::size_t classes = 0;
  for (const char* split : {"train", "test"}) {
    const std::map<std::string, double> attributes = file.split_attributes(split);
    const auto found = attributes.find("classes");
    if (found == attributes.end()) continue;
    const std::size_t count = class_count(file, std::string("/") + split, found->second);
    if (classes != 0 && count != classes)
      throw host::DatasetError(file.path() + ": /train declares " + std::to_string(classes) +
                               " classes but /test declares " + std::to_string(count) +
                               " (attribute 'classes'); both splits must have the same classes");
    classes = count;
  }
  if (classes != 0) return classes;
  const std::map<std::string, std::string> names = file.attributes();
  const auto found = names.find("classes");
  if (found == names.end() || found->second.empty()) return 0;
  return static_cast<std::size_t>(std::count(found->second.begin(), found->second.end(), ',')) + 1;
}

std::size_t check_classification_data(const host::DatasetFile& file, std::size_t model_classes,
                                      std::vector<std::string>& warnings) {
  const std::size_t declared = declared_classes(file);
  const std::size_t classes = declared != 0 ? declared : model_classes;
  std::vector<std::string> uniform;  // splits whose labels are all one value
  std::int32_t uniform_label = 0;
  for (const char* split : {"train", "test"}) {
    const host::SplitInfo info = float_input_split(file, split);
    if (info.targets.dtype != host::DType::i32 || !info.targets.sample_shape.empty())
      throw host::DatasetError(file.path() + ": /" + split +
                               "/targets must hold one int32 class "
                               "label per sample for a classifier, got " +
                               std::string(host::dtype_name(info.targets.dtype)) + " of shape " +
                               host::shape_string(info.targets.sample_shape));
    const host::HostArray labels = file.read_targets(split, every_index(info.samples));
    const auto y = labels.as<const std::int32_t>();
    for (std::size_t i = 0; i < y.size(); ++i) {
      if (y[i] >= 0 && static_cast<std::size_t>(y[i]) < classes) continue;
      throw host::DatasetError(
          file.path() + ": split '" + split + "', sample " + std::to_string(i) + ": the label " +
          std::to_string(y[i]) + " is outside the data set's " + std::to_string(classes) +
          " classes [0, " + std::to_string(classes) + ") (" +
          (declared != 0
               ? "declared by its attribute 'classes'"
               : "it declares none, so the model's " + std::to_string(classes) + " apply") +
          "); correct the labels, or declare the class count as the numeric attribute 'classes' "
          "of /train and /test (`ipupod data` converters write it)");
    }
    if (std::all_of(y.begin(), y.end(), [&](std::int32_t v) { return v == y[0]; }) &&
        (uniform.empty() || y[0] == uniform_label)) {
      uniform.push_back(std::string("/") + split);
      uniform_label = y[0];
    }
  }
  if (!uniform.empty() && uniform[0] == "/train")
    warnings.push_back("every label of " + (uniform.size() == 2 ? "/train and /test" : uniform[0]) +
                       " in " + file.path() + " is " + std::to_string(uniform_label) +
                       ": the classifier can learn nothing but to answer " +
                       std::to_string(uniform_label) +
                       " (check how the labels were converted; a classifier needs at least two "
                       "classes)");
  return classes;
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

// The host's checks that a data set suits the model before any IPU compiles: float32 inputs of
// the model's sample shape, class labels within the declared classes for a classifier, targets
// of the model's label shape otherwise, and what the test scores are measured against.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "host/dataset.hpp"
#include "models/zoo.hpp"
#include "pod/job/scoring.hpp"

namespace ipupod::pod {

// The samples of /train/inputs have the shape the model takes (a model built from an empty
// sample shape takes its own default); host::DatasetError names both shapes otherwise.
void check_input_shape(const host::DatasetFile& file, const models::Model& model);

// The class count a classifier's data set declares: the numeric attribute "classes" of /train
// (and of /test, which must agree), else the number of comma-separated names in the root string
// attribute "classes", else 0 (none declared). DatasetError if an attribute is not a count.
std::size_t declared_classes(const host::DatasetFile& file);

// Checks the data set suits a classifier and returns the class count to train: the declared
// one, else `model_classes`. DatasetError names split, sample and value of the first label
// outside [0, classes). Labels that are all one class (a "classifier" that can learn nothing)
// add a warning to `warnings`.
std::size_t check_classification_data(const host::DatasetFile& file, std::size_t model_classes,
                                      std::vector<std::string>& warnings);

// What the host scores a model's test outputs against, read from the data set once.
struct Scoring {
  models::Task task = models::Task::classification;
  double target_range = 1, train_mean = 0, compression_ratio = 0;
  TestScores scores() const { return {task, target_range, train_mean, compression_ratio}; }
};

// Checks the data set suits a model that is not a classifier: float32 inputs, and float32
// targets of the shape the model's labels take per sample. Returns what the scores need: the
// range of the test targets (of a field, over its valid cells) and the mean training target.
Scoring check_target_data(const host::DatasetFile& file, const models::Model& model);

}  // namespace ipupod::pod

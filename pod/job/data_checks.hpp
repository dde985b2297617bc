// The host's checks that a data set suits the model before any IPU compiles: float32 inputs,
// class labels for a classifier (and the class count), targets of the model's label shape
// otherwise, and what the test scores are measured against.
#pragma once

#include <cstddef>

#include "host/dataset.hpp"
#include "models/zoo.hpp"
#include "pod/job/scoring.hpp"

namespace ipupod::pod {

// Checks the data set suits a classifier and returns the class count (max label + 1).
// host::DatasetError names the file, the array and what was found.
std::size_t check_classification_data(const host::DatasetFile& file);

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

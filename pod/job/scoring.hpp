// The host's evaluation of a model's test outputs, by the model's task: accuracy for classes,
// PSNR over the valid cells and the compression ratio for a reconstructed field, mean absolute
// error next to that of predicting the training mean for a value, PSNR next to the input's own
// for an image.
#pragma once

#include <map>
#include <span>
#include <string>

#include "host/host_array.hpp"
#include "models/zoo.hpp"

namespace ipupod::pod {

class TestScores {
 public:
  // `target_range`: max - min of the test targets (the valid cells of a field); the PSNR's peak.
  // `train_mean`: mean training target (regression's baseline predictor).
  TestScores(models::Task task, double target_range, double train_mean,
             double compression_ratio = 0);

  // One evaluation micro-batch: the model's outputs ([micro-batch, ...] float32), its inputs and
  // targets as the data set holds them.
  void add(std::span<const float> outputs, const host::HostArray& inputs,
           const host::HostArray& targets);

  // Scores of everything added, by name (e.g. "test_accuracy", "test_psnr_db").
  std::map<std::string, double> finish() const;
  // One line for the epoch's progress report, e.g. "test PSNR 31.2 dB (compression 205x)".
  static std::string describe(models::Task task, const std::map<std::string, double>& scores);

 private:
  models::Task task_;
  double range_, train_mean_, compression_ratio_;
  std::size_t samples_ = 0, correct_ = 0, cells_ = 0;
  double squared_ = 0, input_squared_ = 0, absolute_ = 0, mean_absolute_ = 0;
};

// PSNR in dB of a mean squared error against the peak-to-peak range of the data:
// 20 log10(range) - 10 log10(mse).
double psnr_db(double range, double mse);

}  // namespace ipupod::pod

// Test scores of a model's outputs, by task (see scoring.hpp).
#include "pod/job/scoring.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace ipupod::pod {

double psnr_db(double range, double mse) {
  if (mse <= 0) return std::numeric_limits<double>::infinity();
  return 20 * std::log10(range) - 10 * std::log10(mse);
}

TestScores::TestScores(models::Task task, double target_range, double train_mean,
                       double compression_ratio)
    : task_(task),
      range_(target_range),
      train_mean_(train_mean),
      compression_ratio_(compression_ratio) {}

void TestScores::add(std::span<const float> outputs, const host::HostArray& inputs,
                     const host::HostArray& targets) {
  const std::size_t n = targets.shape.at(0);
  if (n == 0) return;
  const auto mismatch = [&](const std::string& what) {
    return std::invalid_argument("evaluation outputs of " + std::to_string(outputs.size()) +
                                 " values do not match " + what + " " +
                                 host::shape_string(targets.shape));
  };
  samples_ += n;
  switch (task_) {
    case models::Task::classification: {
      const auto labels = targets.as<const std::int32_t>();
      const std::size_t classes = outputs.size() / n;
      if (classes == 0 || classes * n != outputs.size()) throw mismatch("class labels");
      for (std::size_t i = 0; i < n; ++i) {
        const float* row = outputs.data() + i * classes;
        const auto best = std::max_element(row, row + classes) - row;
        correct_ += best == labels[i];
      }
      break;
    }
    case models::Task::reconstruction: {  // targets [n, 2, ...]: the field, then its mask
      const auto t = targets.as<const float>();
      const std::size_t cells = outputs.size() / n;
      if (t.size() != 2 * outputs.size()) throw mismatch("fields and masks");
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < cells; ++c) {
          if (t[(2 * i + 1) * cells + c] == 0) continue;
          const double d = double{outputs[i * cells + c]} - t[2 * i * cells + c];
          squared_ += d * d;
          ++cells_;
        }
      break;
    }
    case models::Task::regression: {
      const auto t = targets.as<const float>();
      if (t.size() != outputs.size()) throw mismatch("targets");
      for (std::size_t i = 0; i < t.size(); ++i) {
        absolute_ += std::abs(double{outputs[i]} - t[i]);
        mean_absolute_ += std::abs(train_mean_ - t[i]);
      }
      cells_ += t.size();
      break;
    }
    case models::Task::image_to_image: {
      const auto t = targets.as<const float>();
      if (t.size() != outputs.size()) throw mismatch("target images");
      // The input is the baseline when it has the target's geometry (bicubic-upsampled).
      const bool baseline = inputs.dtype == host::DType::f32 && inputs.shape == targets.shape;
      const auto x = baseline ? inputs.as<const float>() : std::span<const float>();
      for (std::size_t i = 0; i < t.size(); ++i) {
        const double d = double{outputs[i]} - t[i];
        squared_ += d * d;
        if (baseline) input_squared_ += (double{x[i]} - t[i]) * (double{x[i]} - t[i]);
      }
      cells_ += t.size();
      break;
    }
  }
}

std::map<std::string, double> TestScores::finish() const {
  const auto per = [](double sum, std::size_t count) {
    return count ? sum / static_cast<double>(count) : 0.0;
  };
  switch (task_) {
    case models::Task::classification:
      return {{"test_accuracy", per(static_cast<double>(correct_), samples_)}};
    case models::Task::reconstruction: {
      std::map<std::string, double> s = {{"test_mse", per(squared_, cells_)},
                                         {"test_psnr_db", psnr_db(range_, per(squared_, cells_))}};
      // An imported autoencoder's codes are not known here: no ratio.
      if (compression_ratio_ > 0) s["compression_ratio"] = compression_ratio_;
      return s;
    }
    case models::Task::regression:
      return {{"test_mae", per(absolute_, cells_)},
              {"mean_predictor_mae", per(mean_absolute_, cells_)}};
    case models::Task::image_to_image: {
      std::map<std::string, double> s = {{"test_mse", per(squared_, cells_)},
                                         {"test_psnr_db", psnr_db(range_, per(squared_, cells_))}};
      if (input_squared_ > 0) s["input_psnr_db"] = psnr_db(range_, per(input_squared_, cells_));
      return s;
    }
  }
  return {};
}

std::string TestScores::describe(models::Task task, const std::map<std::string, double>& s) {
  std::ostringstream os;
  os << std::fixed;
  const auto get = [&](const char* key) {
    const auto it = s.find(key);
    return it == s.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
  };
  switch (task) {
    case models::Task::classification:
      os << "test accuracy " << std::setprecision(2) << 100 * get("test_accuracy") << "%";
      break;
    case models::Task::reconstruction:
      os << "test PSNR " << std::setprecision(2) << get("test_psnr_db") << " dB (MSE "
         << std::setprecision(4) << get("test_mse");
      if (s.count("compression_ratio"))
        os << ", compression " << std::setprecision(1) << get("compression_ratio") << "x";
      os << ")";
      break;
    case models::Task::regression:
      os << "test MAE " << std::setprecision(4) << get("test_mae")
         << " (predicting the mean: " << get("mean_predictor_mae") << ")";
      break;
    case models::Task::image_to_image:
      os << "test PSNR " << std::setprecision(2) << get("test_psnr_db") << " dB";
      if (s.count("input_psnr_db")) os << " (the input's: " << get("input_psnr_db") << " dB)";
      break;
  }
  return os.str();
}

}  // namespace ipupod::pod

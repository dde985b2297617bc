// The host's test scores by task, on outputs whose scores are known by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "pod/job/scoring.hpp"

namespace {

using ipupod::host::DType;
using ipupod::host::HostArray;
using ipupod::models::Task;
using ipupod::pod::psnr_db;
using ipupod::pod::TestScores;

HostArray floats(std::vector<std::size_t> shape, const std::vector<float>& values) {
  HostArray a = HostArray::zeros(DType::f32, std::move(shape));
  std::copy(values.begin(), values.end(), a.as<float>().begin());
  return a;
}

TEST(Scoring, PsnrIsTwentyLogRangeMinusTenLogMse) {
  EXPECT_DOUBLE_EQ(psnr_db(1.0, 0.01), 20.0);
  EXPECT_NEAR(psnr_db(10.0, 1.0), 20.0, 1e-12);
  EXPECT_TRUE(std::isinf(psnr_db(1.0, 0.0)));
}

TEST(Scoring, ClassificationCountsArgmaxHits) {
  TestScores s(Task::classification, 1, 0);
  HostArray labels = HostArray::zeros(DType::i32, {3});
  labels.as<std::int32_t>()[0] = 1;
  labels.as<std::int32_t>()[1] = 0;
  labels.as<std::int32_t>()[2] = 2;
  const std::vector<float> logits = {0, 5, 1, /**/ 3, 1, 0, /**/ 9, 0, 1};  // right, right, wrong
  s.add(logits, HostArray{}, labels);
  EXPECT_NEAR(s.finish().at("test_accuracy"), 2.0 / 3, 1e-12);
}

TEST(Scoring, ReconstructionScoresOnlyTheValidCells) {
  // Two samples of 2 cells: targets [field..., mask...] per sample; one masked cell is way off
  // and must not count.
  const HostArray targets = floats({2, 2, 1, 2}, {1, 2, 1, 1, /**/ 3, 4, 1, 0});
  const std::vector<float> outputs = {1.5f, 2, 3, 100};
  TestScores s(Task::reconstruction, 2.0, 0, 204.8);
  s.add(outputs, HostArray{}, targets);
  const auto scores = s.finish();
  EXPECT_NEAR(scores.at("test_mse"), 0.25 / 3, 1e-7);
  EXPECT_NEAR(scores.at("test_psnr_db"), 20 * std::log10(2.0) - 10 * std::log10(0.25 / 3), 1e-5);
  EXPECT_DOUBLE_EQ(scores.at("compression_ratio"), 204.8);
  EXPECT_NE(TestScores::describe(Task::reconstruction, scores).find("204.8x"), std::string::npos);
}

TEST(Scoring, RegressionComparesWithThePredictorOfTheTrainingMean) {
  const HostArray targets = floats({2, 1}, {1, 3});
  TestScores s(Task::regression, 1, 2.5);
  s.add(std::vector<float>{1.5f, 3}, HostArray{}, targets);
  const auto scores = s.finish();
  EXPECT_NEAR(scores.at("test_mae"), 0.25, 1e-7);
  EXPECT_NEAR(scores.at("mean_predictor_mae"), (1.5 + 0.5) / 2, 1e-12);
}

TEST(Scoring, ImageToImageReportsTheInputsPsnrBeside) {
  const HostArray targets = floats({1, 1, 2, 2}, {0, 1, 0, 1});
  const HostArray inputs = floats({1, 1, 2, 2}, {0.5f, 0.5f, 0.5f, 0.5f});  // MSE 0.25
  TestScores s(Task::image_to_image, 1, 0);
  s.add(std::vector<float>{0, 0.9f, 0.1f, 1}, inputs, targets);  // MSE 0.005
  const auto scores = s.finish();
  EXPECT_NEAR(scores.at("test_psnr_db"), -10 * std::log10(0.005), 1e-4);
  EXPECT_NEAR(scores.at("input_psnr_db"), -10 * std::log10(0.25), 1e-9);
}

TEST(Scoring, OutputsOfTheWrongSizeAreRejected) {
  TestScores s(Task::regression, 1, 0);
  EXPECT_THROW(s.add(std::vector<float>{1, 2, 3}, HostArray{}, floats({2, 1}, {1, 3})),
               std::invalid_argument);
}

}  // namespace

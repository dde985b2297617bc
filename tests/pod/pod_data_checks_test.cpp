// The host's start-up checks of a data set against the model: sample shapes, class labels
// against the declared classes, labels that are all one class, and NaN or infinity found before
// the first step; in process, then as `ipupod train` runs them under mpirun (exit 2, one
// message from the host, before any IPU compiles).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "host/dataset.hpp"
#include "models/zoo.hpp"
#include "pod/job/data_checks.hpp"
#include "tests/pod/run_command.hpp"

namespace ipupod::pod {
namespace {

namespace fs = std::filesystem;
using host::DatasetError;
using host::DatasetFile;
using host::DType;
using host::HostArray;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("ipupod_data_checks_" + std::to_string(getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A classification set: `count` samples per split of float32 inputs of `sample_shape` and
// int32 labels i % 3, then `edit(split, inputs, labels)`; "classes" declared when > 0.
template <class Edit>
std::string write_set(const std::string& path, std::vector<std::size_t> sample_shape,
                      double classes, Edit edit, std::size_t count = 40) {
  host::DatasetWriter writer(path, {.overwrite = true});
  for (const char* split : {"train", "test"}) {
    std::vector<std::size_t> shape{count};
    shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
    HostArray inputs = HostArray::zeros(DType::f32, shape);
    HostArray labels = HostArray::zeros(DType::i32, {count});
    for (std::size_t i = 0; i < count; ++i)
      labels.as<std::int32_t>()[i] = static_cast<std::int32_t>(i % 3);
    edit(std::string(split), inputs.as<float>(), labels.as<std::int32_t>());
    writer.write_split(split, inputs, labels);
    if (classes > 0) writer.set_attribute(split, "classes", classes);
  }
  writer.finish();
  return path;
}

const auto kNoEdit = [](auto&&...) {};

std::string error_of(const std::function<void()>& check) {
  try {
    check();
  } catch (const DatasetError& e) {
    return e.what();
  }
  return "no error";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in:\n" << text;
}

models::Model mlp(std::vector<std::size_t> sample_shape) {
  models::ModelOptions options;
  options.sample_shape = std::move(sample_shape);
  return models::build_model("mlp", options);
}

// Inputs of rank 0 per sample made the model fall back to its own [1, 28, 28]: the job then
// failed after compiling, "host stream out of step".
TEST(DataChecks, InputsOfAnotherShapeThanTheModelTakesAreNamed) {
  TempDir dir;
  const DatasetFile flat(write_set(dir.file("flat.h5"), {}, 10, kNoEdit));
  const std::string message = error_of([&] { check_input_shape(flat, mlp({})); });
  expect_contains(message, "flat.h5: /train/inputs is [40], samples of shape [] (rank 0)");
  expect_contains(message, "model mlp takes samples of shape [1,28,28] (rank 3)");
  expect_contains(message, "store the inputs as [40,1,28,28]");
  const DatasetFile images(write_set(dir.file("images.h5"), {1, 4, 4}, 10, kNoEdit));
  EXPECT_NO_THROW(check_input_shape(images, mlp({1, 4, 4})));
}

TEST(DataChecks, LabelsOutsideTheDeclaredClassesNameSplitSampleAndValue) {
  TempDir dir;
  std::vector<std::string> warnings;
  // No attribute: the model's class count. A 99 used to grow the classifier to 100 classes.
  const auto label_at = [](const char* where, std::size_t sample, std::int32_t value) {
    return [=](const std::string& split, auto, auto labels) {
      if (split == where) labels[sample] = value;
    };
  };
  const DatasetFile undeclared(write_set(dir.file("a.h5"), {4}, 0, label_at("train", 17, 99)));
  std::string message = error_of([&] { check_classification_data(undeclared, 10, warnings); });
  expect_contains(message,
                  "a.h5: split 'train', sample 17: the label 99 is outside the data "
                  "set's 10 classes [0, 10) (it declares none, so the model's 10 apply)");
  expect_contains(message, "declare the class count as the numeric attribute 'classes'");
  // Declared: 100000 in the test split of a 10-class set, and a negative label.
  const DatasetFile large(write_set(dir.file("b.h5"), {4}, 10, label_at("test", 39, 100000)));
  message = error_of([&] { check_classification_data(large, 10, warnings); });
  expect_contains(message,
                  "split 'test', sample 39: the label 100000 is outside the data set's "
                  "10 classes [0, 10) (declared by its attribute 'classes')");
  const DatasetFile negative(write_set(dir.file("c.h5"), {4}, 10, label_at("train", 0, -1)));
  expect_contains(error_of([&] { check_classification_data(negative, 10, warnings); }),
                  "split 'train', sample 0: the label -1 is outside");
  // The declared count, not the largest label, sets the classes.
  const DatasetFile many(write_set(dir.file("d.h5"), {4}, 100, label_at("train", 17, 99)));
  EXPECT_EQ(check_classification_data(many, 10, warnings), 100u);
  const DatasetFile three(write_set(dir.file("e.h5"), {4}, 0, kNoEdit));
  EXPECT_EQ(check_classification_data(three, 10, warnings), 10u);
  EXPECT_TRUE(warnings.empty());
}

// A small set whose attributes `attributes(writer)` sets.
template <class Attributes>
std::string write_attributes(const std::string& path, Attributes attributes) {
  host::DatasetWriter writer(path, {.overwrite = true});
  const HostArray inputs = HostArray::zeros(DType::f32, {4, 2});
  const HostArray labels = HostArray::zeros(DType::i32, {4});
  for (const char* split : {"train", "test"}) writer.write_split(split, inputs, labels);
  attributes(writer);
  writer.finish();
  return path;
}

TEST(DataChecks, TheClassCountAttributeMustBeACount) {
  TempDir dir;
  for (double bad : {0.0, 2.5, -3.0, 1e12, std::numeric_limits<double>::quiet_NaN()}) {
    const std::string path = write_attributes(dir.file("bad.h5"), [&](host::DatasetWriter& w) {
      w.set_attribute("train", "classes", bad);
    });
    expect_contains(error_of([&] { declared_classes(DatasetFile(path)); }),
                    "the attribute 'classes' of /train is ");
  }
  // The two splits must agree; the root's list of names counts when no number is given.
  const std::string split = write_attributes(dir.file("split.h5"), [](host::DatasetWriter& w) {
    w.set_attribute("train", "classes", 10);
    w.set_attribute("test", "classes", 12);
  });
  expect_contains(error_of([&] { declared_classes(DatasetFile(split)); }),
                  "/train declares 10 classes but /test declares 12");
  const std::string names = write_attributes(dir.file("names.h5"), [](host::DatasetWriter& w) {
    w.set_attribute("classes", "cat,dog,bird");
  });
  EXPECT_EQ(declared_classes(DatasetFile(names)), 3u);
  EXPECT_EQ(declared_classes(DatasetFile(write_attributes(dir.file("none.h5"), [](auto&) {}))), 0u);
}

TEST(DataChecks, LabelsThatAreAllOneClassGiveAWarning) {
  TempDir dir;
  std::vector<std::string> warnings;
  const auto all_zero = [](const std::string&, auto, auto labels) {
    for (auto& y : labels) y = 0;
  };
  const DatasetFile zeros(write_set(dir.file("zeros.h5"), {4}, 10, all_zero));
  EXPECT_EQ(check_classification_data(zeros, 10, warnings), 10u);
  ASSERT_EQ(warnings.size(), 1u);
  expect_contains(warnings[0], "every label of /train and /test in ");
  expect_contains(warnings[0], "is 0: the classifier can learn nothing but to answer 0");
}

// ------------------------------------------------------------ the same under `ipupod train`

std::string mpirun(const TempDir& dir) {
  // A cache of clean scans of the test's own, not the user's.
  return "env IPUPOD_CACHE_DIR=" + dir.file("cache") + " " + IPUPOD_MPIEXEC +
         " -n 2 --oversubscribe --allow-run-as-root " + IPUPOD_BINARY +
         " train --model mlp --hidden 8 --micro-batch 4 --epochs 1 --arch tiny --run-dir " +
         dir.file("run") + " --data ";
}

void expect_bad_data(const testing_support::Result& r, const std::vector<std::string>& parts) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const std::string& part : parts) expect_contains(r.output, part);
  // One message, from the host, before anything compiled or streamed.
  EXPECT_EQ(r.output.find(parts[0]), r.output.rfind(parts[0])) << r.output;
  EXPECT_EQ(r.output.find("out of step"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("samples/s"), std::string::npos) << r.output;
}

TEST(DataChecksUnderMpirun, BadDataEndsTheJobAtStartUpWithExitTwo) {
  TempDir dir;
  using testing_support::run;
  // Inputs of rank 0 per sample (before: compiled, then "host stream out of step", exit 1).
  expect_bad_data(run(mpirun(dir) + write_set(dir.file("flat.h5"), {}, 0, kNoEdit), 120),
                  {"ipupod train: " + dir.file("flat.h5") + ": /train/inputs is [40]",
                   "takes samples of shape [1,28,28]"});
  // A label of 99 in a 10-class set (before: trained 100 classes).
  expect_bad_data(run(mpirun(dir) + write_set(dir.file("label.h5"), {4}, 10,
                                              [](const std::string& split, auto, auto labels) {
                                                if (split == "test") labels[21] = 99;
                                              }),
                      120),
                  {"split 'test', sample 21: the label 99 is outside the data set's 10 classes"});
  // NaN in the last test sample (before: found when that batch streamed, exit 1).
  expect_bad_data(run(mpirun(dir) + write_set(dir.file("nan.h5"), {4}, 10,
                                              [](const std::string& split, auto inputs, auto) {
                                                if (split == "test")
                                                  inputs[39 * 4 + 2] =
                                                      std::numeric_limits<float>::quiet_NaN();
                                              }),
                      120),
                  {"split 'test', inputs of sample 39, element 2", "is NaN"});
}

}  // namespace
}  // namespace ipupod::pod

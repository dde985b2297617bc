// Tests of the scan for NaN and infinity before training: the first bad element in file order
// with split, sample and element named (mapped, compressed, float16, several threads), progress,
// and clean verdicts remembered only for a file that has not changed since.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <vector>

#include "host/data_scan.hpp"
#include "tests/host/temp_dir.hpp"

namespace ipupod::host {
namespace {

using ipupod::testing::TempDir;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Both splits of `count` samples of [2, 3] float32 inputs (0, 1, 2, ... in order) and
// one float32 target each; `edit` may spoil them before they are written.
template <class Edit>
std::string write_floats(const TempDir& dir, std::size_t count, Edit edit,
                         DatasetWriterOptions options = {.chunk_samples = 8}) {
  const std::string path = dir.file("data.h5");
  options.overwrite = true;
  DatasetWriter writer(path, options);
  for (const char* split : {"train", "test"}) {
    HostArray inputs = HostArray::zeros(DType::f32, {count, 2, 3});
    std::iota(inputs.as<float>().begin(), inputs.as<float>().end(), 0.0f);
    HostArray targets = HostArray::zeros(DType::f32, {count, 1});
    edit(std::string(split), inputs.as<float>(), targets.as<float>());
    writer.write_split(split, inputs, targets);
  }
  writer.finish();
  return path;
}

std::string scan_error(const std::string& path, const FiniteScanOptions& options = {}) {
  try {
    scan_finite(DatasetFile(path), options);
  } catch (const DatasetError& error) {
    return error.what();
  }
  return "no error";
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(DataScan, CleanDataPasses) {
  TempDir dir;
  const std::string path = write_floats(dir, 50, [](auto&&...) {});
  const FiniteScanResult result = scan_finite(DatasetFile(path), {});
  EXPECT_FALSE(result.remembered);
  EXPECT_EQ(result.bytes, 2u * 50 * (6 + 1) * 4);
}

TEST(DataScan, NamesSplitArraySampleAndElementOfTheFirstBadValue) {
  TempDir dir;
  // Infinity in a test target and NaN later in the test inputs: inputs come first.
  std::string path = write_floats(dir, 50, [](const std::string& split, auto inputs, auto targets) {
    if (split != "test") return;
    targets[3] = kInf;
    inputs[41 * 6 + 4] = kNaN;
  });
  std::string message = scan_error(path);
  expect_contains(message, "split 'test', inputs of sample 41, element 4 (position [1,1]");
  expect_contains(message, "is NaN");
  // The same values read through HDF5 (compressed), and a bad target alone.
  path = write_floats(dir, 50,
                      [](const std::string& split, auto, auto targets) {
                        if (split == "train") targets[17] = -kInf;
                      },
                      {.chunk_samples = 8, .deflate_level = 1});
  ASSERT_FALSE(DatasetFile(path).reads_directly("train", Field::targets));
  message = scan_error(path);
  expect_contains(message, "split 'train', targets of sample 17, element 0");
  expect_contains(message, "is infinite");
}

TEST(DataScan, Float16ArraysAreScannedAndIntegerArraysPass) {
  TempDir dir;
  const std::string path = dir.file("half.h5");
  DatasetWriter writer(path);
  for (const char* split : {"train", "test"}) {
    HostArray inputs = HostArray::zeros(DType::f16, {10, 4});
    HostArray targets = HostArray::zeros(DType::i32, {10});
    targets.as<std::int32_t>()[2] = -1;  // any integer is finite
    if (std::string(split) == "test") {
      const std::uint16_t infinity = 0x7C00;  // float16
      std::memcpy(inputs.bytes.data() + (7 * 4 + 2) * 2, &infinity, 2);
    }
    writer.write_split(split, inputs, targets);
  }
  writer.finish();
  const std::string message = scan_error(path);
  expect_contains(message, "split 'test', inputs of sample 7, element 2");
  expect_contains(message, "is infinite");
}

// Several threads each take chunks; the error is still the first bad value in file order.
TEST(DataScan, SeveralThreadsReportTheFirstBadValueAndProgress) {
  TempDir dir;
  const std::size_t count = 400'000;  // 9.6 MiB of inputs per split: scanned in parallel
  const std::string path = write_floats(dir, count,
                                        [&](const std::string& split, auto inputs, auto) {
                                          if (split != "train") return;
                                          inputs[(count - 5) * 6] = kNaN;
                                          inputs[300'001 * 6 + 5] = kInf;
                                        },
                                        {.chunk_samples = 4096});
  std::vector<std::pair<std::uint64_t, std::uint64_t>> calls;
  FiniteScanOptions options;
  options.threads = 4;
  options.progress_min_bytes = 0;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    calls.emplace_back(done, total);
  };
  for (int repeat = 0; repeat < 3; ++repeat) {
    const std::string message = scan_error(path, options);
    expect_contains(message, "split 'train', inputs of sample 300001, element 5");
  }
  // A clean file reports 0 first and everything last.
  const std::string clean = write_floats(dir, count, [](auto&&...) {}, {.chunk_samples = 4096});
  calls.clear();
  EXPECT_EQ(scan_finite(DatasetFile(clean), options).bytes, 2u * count * 7 * 4);
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls.front().first, 0u);
  EXPECT_EQ(calls.back().first, calls.back().second);
  EXPECT_EQ(calls.back().second, 2u * count * 7 * 4);
}

// Overwrites the first float equal to `from` in the file's bytes with `to`, in place, and sets
// the modification time back to what it was: the edit that a size and mtime key would miss.
void edit_in_place(const std::string& path, float from, float to) {
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), {});
  char pattern[4];
  std::memcpy(pattern, &from, 4);
  const std::size_t at = bytes.find(std::string(pattern, 4));
  ASSERT_NE(at, std::string::npos);
  file.seekp(static_cast<std::streamoff>(at));
  file.write(reinterpret_cast<const char*>(&to), 4);
  file.close();
  const timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

TEST(DataScan, ACleanVerdictIsRememberedUntilTheFileChanges) {
  TempDir dir;
  const std::string path = write_floats(dir, 50, [](auto&&...) {});
  FiniteScanOptions options;
  options.cache_dir = dir.file("cache");
  // Written just now: it could change again within its timestamps' tick, so not remembered.
  FiniteScanResult result = scan_finite(DatasetFile(path), options);
  EXPECT_FALSE(result.saved);
  EXPECT_FALSE(scan_finite(DatasetFile(path), options).remembered);
  options.settled_for = std::chrono::nanoseconds(0);
  result = scan_finite(DatasetFile(path), options);
  EXPECT_TRUE(result.saved);
  EXPECT_FALSE(result.remembered);
  result = scan_finite(DatasetFile(path), options);
  EXPECT_TRUE(result.remembered);
  EXPECT_EQ(result.bytes, 0u);
  // A NaN written into the data in place, the modification time set back: found.
  edit_in_place(path, 250.0f, kNaN);  // train inputs, sample 41, element 4
  expect_contains(scan_error(path, options), "split 'train', inputs of sample 41, element 4");
  // A file rewritten under the same name: scanned again.
  write_floats(dir, 50, [](const std::string& split, auto, auto targets) {
    if (split == "test") targets[9] = kNaN;
  });
  expect_contains(scan_error(path, options), "split 'test', targets of sample 9, element 0");
  // No cache directory: never remembered.
  options.cache_dir.clear();
  const std::string clean = write_floats(dir, 50, [](auto&&...) {});
  EXPECT_FALSE(scan_finite(DatasetFile(clean), options).saved);
  EXPECT_FALSE(scan_finite(DatasetFile(clean), options).remembered);
}

TEST(DataScan, TheMarkerNamesTheFileAndChangesWithIt) {
  TempDir dir;
  const std::string path = write_floats(dir, 20, [](auto&&...) {});
  const std::string marker = scan_marker(path);
  expect_contains(marker, "path: " + std::filesystem::canonical(path).string() + "\n");
  EXPECT_EQ(scan_marker(path), marker);
  edit_in_place(path, 7.0f, 8.0f);
  EXPECT_NE(scan_marker(path), marker);
  EXPECT_EQ(scan_marker(dir.file("absent.h5")), "");
}

}  // namespace
}  // namespace ipupod::host

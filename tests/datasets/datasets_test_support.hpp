// Helpers shared by the converter tests: reading a whole split, extra datasets by name, and
// skipping a test with the Debian package to install when its data are absent.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "host/dataset.hpp"
#include "host/hdf5.hpp"

namespace ipupod::datasets::testing {

inline std::vector<std::size_t> all_indices(std::size_t n) {
  std::vector<std::size_t> indices(n);
  std::iota(indices.begin(), indices.end(), std::size_t{0});
  return indices;
}

inline host::HostArray read_inputs(const host::DatasetFile& file, const std::string& split) {
  return file.read_inputs(split, all_indices(file.info(split).samples));
}

inline host::HostArray read_targets(const host::DatasetFile& file, const std::string& split) {
  return file.read_targets(split, all_indices(file.info(split).samples));
}

// An extra dataset /<split>/<name> read whole with the HDF5 layer.
inline host::HostArray read_extra(const std::string& path, const std::string& split,
                                  const std::string& name, host::DType dtype) {
  const host::h5::File file = host::h5::File::open(path);
  const host::h5::Dataset dataset = file.open_group(split).open_dataset(name);
  host::HostArray array = host::HostArray::zeros(dtype, dataset.dims());
  dataset.read_rows(0, array.shape[0], dtype, array.bytes.data());
  return array;
}

inline bool all_exist(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    if (!std::filesystem::exists(path)) return false;
  }
  return true;
}

}  // namespace ipupod::datasets::testing

// Skips the test when a file of a Debian data package is missing, naming the package.
#define SKIP_WITHOUT(paths, package)                       \
  if (!::ipupod::datasets::testing::all_exist(paths))      \
  GTEST_SKIP() << "data of the Debian package " << package \
               << " not found; install it (scripts/install-deps.sh) to run this test"

// Converter from the Fashion-MNIST IDX files (Debian package dataset-fashion-mnist) to the
// training-data schema of host/dataset.hpp: inputs float32 [N,1,28,28] in [0,1], targets int32 [N].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ipupod::datasets {

struct FashionMnistOptions {
  std::string source_dir = "/usr/share/datasets/fashion-mnist";
  std::string out;                              // output .h5 path (required)
  bool overwrite = false;                       // replace an existing output (the CLI's --force)
  std::size_t limit_train = 0, limit_test = 0;  // first N samples of each split; 0 = all
};

struct ConvertReport {
  std::string out;
  std::size_t train_samples = 0, test_samples = 0;
  std::uint64_t bytes = 0;  // size of the written file
  // One line per split (samples, shapes, dtypes, bytes) and the output path.
  std::string summary() const;
};

// Reads the four gzip IDX files with zlib, checks magic numbers (2051 images, 2049 labels),
// dimensions, counts and label range, and writes the HDF5 file atomically via DatasetWriter.
// Throws host::DatasetError with the offending file named for any bad or missing input.
ConvertReport convert_fashion_mnist(const FashionMnistOptions& options);

// File names inside source_dir, and the image geometry the format fixes.
inline constexpr const char* kFashionMnistTrainImages = "train-images-idx3-ubyte.gz";
inline constexpr const char* kFashionMnistTrainLabels = "train-labels-idx1-ubyte.gz";
inline constexpr const char* kFashionMnistTestImages = "t10k-images-idx3-ubyte.gz";
inline constexpr const char* kFashionMnistTestLabels = "t10k-labels-idx1-ubyte.gz";
inline constexpr std::size_t kFashionMnistRows = 28, kFashionMnistCols = 28;
inline constexpr std::size_t kFashionMnistClasses = 10;

}  // namespace ipupod::datasets

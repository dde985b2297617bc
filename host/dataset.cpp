// DatasetFile (validating reader) and DatasetWriter (atomic writer) for the training-data
// schema described in dataset.hpp, on top of the HDF5 layer in hdf5.hpp.
#include "host/dataset.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <set>

#include "host/hdf5.hpp"

namespace ipupod::host {
namespace {

constexpr std::array<const char*, 2> kSplits = {"train", "test"};
constexpr const char* kSchemaHint =
    "a dataset file needs groups /train and /test, each holding datasets 'inputs' and 'targets' "
    "with the sample dimension first";
// HDF5 refuses chunks of 4 GiB or more; at most 1 MiB keeps a chunk inside HDF5's default
// per-dataset chunk cache, so sequential reads of neighbouring samples hit the cache.
constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 20;

void check_split_name(const std::string& split, const std::string& where) {
  if (std::find(kSplits.begin(), kSplits.end(), split) == kSplits.end()) {
    throw DatasetError(where + ": unknown split '" + split + "'; expected 'train' or 'test'");
  }
}

std::string supported_dtypes() {
  return "float32, float16, int32, uint32, uint8";
}

struct ArrayIn {
  h5::Dataset dataset;
  ArraySpec spec;
};

struct SplitIn {
  h5::Group group;
  ArrayIn inputs;
  ArrayIn targets;
  std::size_t samples = 0;
};

}  // namespace

// ---------------------------------------------------------------- DatasetFile

struct DatasetFile::Impl {
  std::string path;
  h5::File file;
  std::map<std::string, SplitIn> splits;

  const SplitIn& split(const std::string& name) const {
    check_split_name(name, "dataset '" + path + "'");
    return splits.at(name);
  }

  ArrayIn open_array(const h5::Group& group, const std::string& split, const std::string& name) {
    const std::string object = "/" + split + "/" + name;
    if (!group.has_dataset(name)) {
      throw DatasetError("dataset file '" + path + "' has no dataset '" + object + "'; " +
                         kSchemaHint);
    }
    ArrayIn array{group.open_dataset(name), {}};
    if (!array.dataset.stored_dtype(array.spec.dtype)) {
      throw DatasetError("'" + object + "' in '" + path + "' is stored as " +
                         array.dataset.type_description() + ", which ipupod does not read; " +
                         "supported: " + supported_dtypes() +
                         " (convert the data to one of these)");
    }
    const std::vector<std::size_t> dims = array.dataset.dims();
    if (dims.empty()) {
      throw DatasetError("'" + object + "' in '" + path +
                         "' is a scalar; expected an array with the sample dimension first");
    }
    array.spec.sample_shape.assign(dims.begin() + 1, dims.end());
    return array;
  }

  void open_split(const std::string& name) {
    if (!file.has_group(name)) {
      throw DatasetError("dataset file '" + path + "' has no group '/" + name + "'; " +
                         kSchemaHint);
    }
    SplitIn split{file.open_group(name), {}, {}, 0};
    split.inputs = open_array(split.group, name, "inputs");
    split.targets = open_array(split.group, name, "targets");
    const std::size_t input_samples = split.inputs.dataset.dims()[0];
    const std::size_t target_samples = split.targets.dataset.dims()[0];
    if (input_samples != target_samples) {
      throw DatasetError("split '/" + name + "' in '" + path + "' has " +
                         std::to_string(input_samples) + " input samples but " +
                         std::to_string(target_samples) +
                         " target samples; inputs and targets must have the same first dimension");
    }
    if (input_samples == 0) {
      throw DatasetError("split '/" + name + "' in '" + path +
                         "' is empty (0 samples); each split needs at least one sample");
    }
    split.samples = input_samples;
    splits.emplace(name, std::move(split));
  }

  HostArray read(const std::string& split_name, bool inputs,
                 std::span<const std::size_t> indices) const {
    const SplitIn& in = split(split_name);
    const ArrayIn& array = inputs ? in.inputs : in.targets;
    for (std::size_t index : indices) {
      if (index >= in.samples) {
        throw std::out_of_range("dataset '" + path + "': sample index " + std::to_string(index) +
                                " is out of range for split '" + split_name + "' with " +
                                std::to_string(in.samples) + " samples");
      }
    }
    std::vector<std::size_t> shape{indices.size()};
    shape.insert(shape.end(), array.spec.sample_shape.begin(), array.spec.sample_shape.end());
    HostArray out = HostArray::zeros(array.spec.dtype, std::move(shape));
    if (indices.empty()) return out;
    const std::size_t row_bytes =
        shape_elements(array.spec.sample_shape) * dtype_size(array.spec.dtype);

    // Read each run of consecutive (sorted, distinct) indices with one hyperslab, then scatter.
    std::vector<std::size_t> sorted(indices.begin(), indices.end());
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    const bool direct = std::equal(sorted.begin(), sorted.end(), indices.begin(), indices.end());
    std::vector<std::byte> staging;
    std::byte* rows = out.bytes.data();
    if (!direct) {
      staging.resize(sorted.size() * row_bytes);
      rows = staging.data();
    }
    std::vector<std::pair<std::size_t, std::size_t>> runs;  // {first index, count}
    for (std::size_t first = 0; first < sorted.size();) {
      std::size_t last = first;
      while (last + 1 < sorted.size() && sorted[last + 1] == sorted[last] + 1) ++last;
      runs.emplace_back(sorted[first], last - first + 1);
      first = last + 1;
    }
    array.dataset.read_row_runs(runs, array.spec.dtype, rows);
    if (!direct) {
      for (std::size_t k = 0; k < indices.size(); ++k) {
        const auto at = std::lower_bound(sorted.begin(), sorted.end(), indices[k]) - sorted.begin();
        std::memcpy(out.bytes.data() + k * row_bytes, staging.data() + at * row_bytes, row_bytes);
      }
    }
    return out;
  }
};

DatasetFile::DatasetFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw DatasetError("dataset file '" + path +
                       "' does not exist; check the path or create it with a dataset converter");
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw DatasetError("dataset path '" + path + "' is a directory; expected an HDF5 file");
  }
  if (!h5::is_hdf5_file(path)) {
    throw DatasetError("'" + path + "' is not an HDF5 file (no HDF5 signature); expected a " +
                       "dataset file in ipupod's schema: " + kSchemaHint);
  }
  try {
    impl_->file = h5::File::open(path, true);
    for (const char* split : kSplits) impl_->open_split(split);
  } catch (const Hdf5Error& error) {
    throw DatasetError(std::string("cannot read dataset file: ") + error.what());
  }
}

DatasetFile::~DatasetFile() = default;
DatasetFile::DatasetFile(DatasetFile&&) noexcept = default;
DatasetFile& DatasetFile::operator=(DatasetFile&&) noexcept = default;

const std::string& DatasetFile::path() const {
  return impl_->path;
}

SplitInfo DatasetFile::info(const std::string& split) const {
  const SplitIn& in = impl_->split(split);
  return SplitInfo{in.samples, in.inputs.spec, in.targets.spec};
}

HostArray DatasetFile::read_inputs(const std::string& split,
                                   std::span<const std::size_t> indices) const {
  return impl_->read(split, true, indices);
}

HostArray DatasetFile::read_targets(const std::string& split,
                                    std::span<const std::size_t> indices) const {
  return impl_->read(split, false, indices);
}

std::map<std::string, std::string> DatasetFile::attributes() const {
  return impl_->file.string_attributes();
}

std::map<std::string, double> DatasetFile::split_attributes(const std::string& split) const {
  return impl_->split(split).group.numeric_attributes();
}

// ---------------------------------------------------------------- DatasetWriter

struct DatasetWriter::Impl {
  std::string path;
  std::string temporary;
  DatasetWriterOptions options;
  h5::File file;
  std::map<std::string, h5::Group> groups;
  std::set<std::string> written;
  bool finished = false;

  h5::Group& group(const std::string& split) {
    check_split_name(split, "writing '" + path + "'");
    auto found = groups.find(split);
    if (found == groups.end()) found = groups.emplace(split, file.create_group(split)).first;
    return found->second;
  }

  void discard() noexcept {
    groups.clear();
    file = h5::File();
    std::error_code ec;
    std::filesystem::remove(temporary, ec);
  }
};

DatasetWriter::DatasetWriter(const std::string& path, DatasetWriterOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->temporary = path + ".tmp";
  impl_->options = options;
  if (options.chunk_samples == 0) {
    throw DatasetError("writing '" + path + "': chunk_samples must be at least 1");
  }
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !options.overwrite) {
    throw DatasetError("output '" + path +
                       "' already exists; pass --force to overwrite it, or choose another path");
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    throw DatasetError("cannot write '" + path + "': directory '" + parent.string() +
                       "' does not exist; create it first");
  }
  try {
    impl_->file = h5::File::create(impl_->temporary);
  } catch (const Hdf5Error& error) {
    throw DatasetError(std::string("cannot create the dataset file: ") + error.what() +
                       " (check that the directory is writable)");
  }
}

DatasetWriter::~DatasetWriter() {
  if (impl_ && !impl_->finished) impl_->discard();
}

void DatasetWriter::write_split(const std::string& split, const HostArray& inputs,
                                const HostArray& targets) {
  const std::string where = "writing split '" + split + "' of '" + impl_->path + "'";
  check_split_name(split, where);
  if (impl_->written.count(split) != 0) {
    throw DatasetError(where + ": the split was already written");
  }
  for (const HostArray* array : {&inputs, &targets}) {
    const char* name = array == &inputs ? "inputs" : "targets";
    if (array->shape.empty()) {
      throw DatasetError(where + ": " + name + " is a scalar; expected the sample dimension first");
    }
    if (array->bytes.size() != array->elements() * dtype_size(array->dtype)) {
      throw std::invalid_argument(where + ": " + name + " " + array->describe() + " holds " +
                                  std::to_string(array->bytes.size()) + " bytes, expected " +
                                  std::to_string(array->elements() * dtype_size(array->dtype)));
    }
  }
  if (inputs.shape[0] != targets.shape[0]) {
    throw DatasetError(where + ": inputs have " + std::to_string(inputs.shape[0]) +
                       " samples but targets have " + std::to_string(targets.shape[0]));
  }
  if (inputs.shape[0] == 0) throw DatasetError(where + ": the split is empty (0 samples)");

  h5::Group& group = impl_->group(split);
  for (const HostArray* array : {&inputs, &targets}) {
    const char* name = array == &inputs ? "inputs" : "targets";
    const std::size_t row_bytes =
        std::max<std::size_t>(1, array->elements() / array->shape[0] * dtype_size(array->dtype));
    std::vector<std::size_t> chunk = array->shape;
    chunk[0] = std::max<std::size_t>(
        1, std::min({impl_->options.chunk_samples, array->shape[0], kMaxChunkBytes / row_bytes}));
    h5::Dataset dataset =
        group.create_dataset(name, array->dtype, array->shape, chunk, impl_->options.deflate_level);
    dataset.write(*array);
  }
  impl_->written.insert(split);
}

void DatasetWriter::set_attribute(const std::string& name, const std::string& value) {
  impl_->file.set_string_attribute(name, value);
}

void DatasetWriter::set_attribute(const std::string& split, const std::string& name, double value) {
  impl_->group(split).set_double_attribute(name, value);
}

void DatasetWriter::finish() {
  if (impl_->finished) return;
  for (const char* split : kSplits) {
    if (impl_->written.count(split) == 0) {
      throw DatasetError("finishing '" + impl_->path + "': split '" + split +
                         "' was not written; " + kSchemaHint);
    }
  }
  impl_->file.flush();
  impl_->groups.clear();
  impl_->file.close();
  std::error_code ec;
  std::filesystem::rename(impl_->temporary, impl_->path, ec);
  if (ec) {
    throw std::runtime_error("cannot move '" + impl_->temporary + "' to '" + impl_->path +
                             "': " + ec.message());
  }
  impl_->finished = true;
}

}  // namespace ipupod::host

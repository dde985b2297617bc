// DatasetFile (validating reader) and DatasetWriter (atomic writer) for the training-data
// schema described in dataset.hpp, on top of the HDF5 layer in hdf5.hpp.
#include "host/dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <set>

#include "host/hdf5.hpp"
#include "host/stream_protocol.hpp"

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

// The advice preload() gives: read the pages in and map them (Linux 5.14), else start the reads.
#ifdef MADV_POPULATE_READ
constexpr int kPreloadAdvice = MADV_POPULATE_READ;
#else
constexpr int kPreloadAdvice = MADV_WILLNEED;
#endif
// Rows per HDF5 read on the fallback path (bounds the staging buffer).
constexpr std::size_t kMaxStagingBytes = 4 * 1024 * 1024;
struct ArrayIn {
  h5::Dataset dataset;
  ArraySpec spec;
  bool direct = false;  // rows are copied from the file's mapping at the offsets in `layout`
  h5::RowLayout layout;
  std::uint64_t end_offset = 0;  // just past the last byte of the last row in the file
};

struct SplitIn {
  h5::Group group;
  ArrayIn inputs;
  ArrayIn targets;
  std::size_t samples = 0;
  bool preloaded = false;  // its direct arrays' pages were read in (see preload)
};

}  // namespace

// ---------------------------------------------------------------- DatasetFile

std::string_view field_name(Field field) {
  return field == Field::inputs ? "inputs" : "targets";
}

struct DatasetFile::Impl {
  std::string path;
  h5::File file;
  std::map<std::string, SplitIn> splits;
  // Direct reads copy rows out of a read-only mapping of the whole file: no system call per
  // sample. -1 / nullptr if every array goes through HDF5.
  int fd = -1;
  const std::byte* map = nullptr;
  std::size_t map_bytes = 0;

  ~Impl() {
    if (map) ::munmap(const_cast<std::byte*>(map), map_bytes);
    if (fd >= 0) ::close(fd);
  }

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
    ArrayIn array;
    array.dataset = group.open_dataset(name);
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
    if (dims.size() > kMaxFrameRank) {
      throw DatasetError("'" + object + "' in '" + path + "' has rank " +
                         std::to_string(dims.size()) + " (shape " + shape_string(dims) +
                         "); the host streams at most " + std::to_string(kMaxFrameRank) +
                         " dimensions including the sample dimension: reshape the samples");
    }
    array.spec.sample_shape.assign(dims.begin() + 1, dims.end());
    return array;
  }

  // Same dtype and sample shape in both splits: the model is built from one of them.
  void check_splits_agree() const {
    for (Field field : {Field::inputs, Field::targets}) {
      const std::string name(field_name(field));
      const ArraySpec& train = array(splits.at("train"), field).spec;
      const ArraySpec& test = array(splits.at("test"), field).spec;
      if (train.dtype != test.dtype || train.sample_shape != test.sample_shape) {
        throw DatasetError("'/test/" + name + "' in '" + path + "' holds samples of " +
                           std::string(dtype_name(test.dtype)) + shape_string(test.sample_shape) +
                           " but '/train/" + name + "' holds " +
                           std::string(dtype_name(train.dtype)) + shape_string(train.sample_shape) +
                           "; both splits must hold samples of the same dtype and shape");
      }
    }
  }

  static const ArrayIn& array(const SplitIn& split, Field field) {
    return field == Field::inputs ? split.inputs : split.targets;
  }

  // Turns on direct reads where the storage allows it and a first row reads back the same both
  // ways (a cheap guard against storage this code does not understand).
  void enable_direct_reads() {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // HDF5 could open it, so reads through HDF5 still work
    struct stat status {};
    if (::fstat(fd, &status) != 0 || status.st_size <= 0) return;
    // No MAP_POPULATE: on a file that is not in the page cache it would read the whole file
    // (the other split and any other arrays included) before the first sample, and a file larger
    // than memory in vain. preload() populates a split's arrays instead.
    void* mapped =
        ::mmap(nullptr, static_cast<std::size_t>(status.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) return;
    map = static_cast<const std::byte*>(mapped);
    map_bytes = static_cast<std::size_t>(status.st_size);
    for (auto& [name, split] : splits) {
      for (ArrayIn* array : {&split.inputs, &split.targets}) {
        if (!array->dataset.direct_row_layout(array->spec.dtype, array->layout)) continue;
        const h5::RowLayout& layout = array->layout;
        if (layout.row_bytes == 0 || layout.rows_per_block == 0) continue;
        std::uint64_t end = 0;
        for (std::size_t block = 0; block < layout.block_offsets.size(); ++block) {
          const std::size_t rows =
              std::min(layout.rows_per_block, split.samples - block * layout.rows_per_block);
          end = std::max<std::uint64_t>(end, layout.block_offsets[block] + rows * layout.row_bytes);
        }
        if (end > map_bytes) continue;
        array->end_offset = end;
        std::vector<std::byte> through_hdf5(layout.row_bytes);
        array->dataset.read_rows(0, 1, array->spec.dtype, through_hdf5.data());
        array->direct =
            std::memcmp(through_hdf5.data(), map + layout.block_offsets[0], layout.row_bytes) == 0;
      }
    }
  }

  void check_index(const SplitIn& in, const std::string& split_name, std::size_t index) const {
    if (index >= in.samples) {
      throw std::out_of_range("dataset '" + path + "': sample index " + std::to_string(index) +
                              " is out of range for split '" + split_name + "' with " +
                              std::to_string(in.samples) + " samples");
    }
  }

  // "'/train/inputs' of 'FILE'", for messages.
  std::string array_name(const std::string& split_name, Field field) const {
    return "'/" + split_name + "/" + std::string(field_name(field)) + "' of '" + path + "'";
  }

  // [begin, end) widened to whole pages, the end kept inside the mapping.
  std::pair<std::uint64_t, std::uint64_t> whole_pages(std::uint64_t begin,
                                                      std::uint64_t end) const {
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    return {begin / page * page,
            std::min<std::uint64_t>((end + page - 1) / page * page, map_bytes)};
  }

  void read_samples(const std::string& split_name, Field field,
                    std::span<const SampleRead> reads) const {
    const SplitIn& in = split(split_name);
    for (const SampleRead& read : reads) check_index(in, split_name, read.index);
    if (reads.empty()) return;
    const ArrayIn& array = Impl::array(in, field);
    if (array.direct) {
      read_mapped(array, array_name(split_name, field), reads);
      return;
    }
    std::vector<SampleRead> sorted(reads.begin(), reads.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const SampleRead& a, const SampleRead& b) { return a.index < b.index; });
    const std::size_t row_bytes =
        shape_elements(array.spec.sample_shape) * dtype_size(array.spec.dtype);
    if (row_bytes == 0) return;
    read_through_hdf5(array, sorted, row_bytes);
  }

  // Adds the file ranges holding the rows of a direct array: its blocks (whole chunks) widened
  // to whole pages, [begin, end).
  void add_page_ranges(const ArrayIn& array, std::size_t samples,
                       std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) const {
    const h5::RowLayout& layout = array.layout;
    for (std::size_t block = 0; block < layout.block_offsets.size(); ++block) {
      const std::size_t rows =
          std::min(layout.rows_per_block, samples - block * layout.rows_per_block);
      const std::uint64_t begin = layout.block_offsets[block];
      const std::uint64_t end = begin + rows * layout.row_bytes;
      ranges.push_back(whole_pages(begin, end));
    }
  }

  bool preload(const std::string& split_name, std::size_t max_bytes) {
    check_split_name(split_name, "dataset '" + path + "'");
    SplitIn& in = splits.at(split_name);
    if (in.preloaded) return true;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> blocks;
    for (const ArrayIn* array : {&in.inputs, &in.targets})
      if (array->direct) add_page_ranges(*array, in.samples, blocks);
    // In file order, merged where they touch.
    std::sort(blocks.begin(), blocks.end());
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const auto& [begin, end] : blocks) {
      if (!ranges.empty() && begin <= ranges.back().second) {
        ranges.back().second = std::max(ranges.back().second, end);
      } else {
        ranges.emplace_back(begin, end);
      }
    }
    if (ranges.empty()) return false;  // nothing is read from the mapping
    std::uint64_t bytes = 0;
    for (const auto& [begin, end] : ranges) bytes += end - begin;
    if (bytes > max_bytes) return false;
    for (const auto& [begin, end] : ranges) {
      void* start = const_cast<std::byte*>(map + begin);
      // A kernel older than the C library refuses MADV_POPULATE_READ: WILLNEED starts the reads.
      if (::madvise(start, end - begin, kPreloadAdvice) != 0) {
        ::madvise(start, end - begin, MADV_WILLNEED);
      }
    }
    in.preloaded = true;
    return true;
  }

  // Touching a mapped page past the end of a file that shrank would kill the process with
  // SIGBUS; a file changed under a running job is reported instead.
  void check_not_truncated(const ArrayIn& array, const std::string& what) const {
    struct stat status {};
    if (::fstat(fd, &status) != 0 ||
        static_cast<std::uint64_t>(status.st_size) < array.end_offset) {
      throw DatasetError("cannot read " + what + ": the file is now " +
                         std::to_string(status.st_size) + " bytes, it needs " +
                         std::to_string(array.end_offset) +
                         " (was it truncated or rewritten while the job ran?)");
    }
  }

  // Row `index` of a direct array in the mapping.
  std::span<const std::byte> mapped_row(const ArrayIn& array, std::size_t index) const {
    const h5::RowLayout& layout = array.layout;
    const std::size_t block = index / layout.rows_per_block;
    const std::uint64_t offset =
        layout.block_offsets[block] + (index - block * layout.rows_per_block) * layout.row_bytes;
    return {map + offset, layout.row_bytes};
  }

  // One copy per row out of the mapping, in the order asked (repeats included).
  void read_mapped(const ArrayIn& array, const std::string& what,
                   std::span<const SampleRead> reads) const {
    check_not_truncated(array, what);
    for (const SampleRead& read : reads) {
      const std::span<const std::byte> row = mapped_row(array, read.index);
      std::memcpy(read.out, row.data(), row.size());
    }
  }

  // Runs of consecutive rows, one HDF5 read each into a staging buffer, then scattered.
  void read_through_hdf5(const ArrayIn& array, const std::vector<SampleRead>& sorted,
                         std::size_t row_bytes) const {
    const std::size_t max_run = std::max<std::size_t>(1, kMaxStagingBytes / row_bytes);
    std::vector<std::byte> staging;
    for (std::size_t k = 0; k < sorted.size();) {
      // Rows first .. first+count-1; sorted[k..j) are the reads that fall in them.
      const std::size_t first = sorted[k].index;
      std::size_t count = 1;
      std::size_t j = k + 1;
      while (j < sorted.size()) {
        const std::size_t index = sorted[j].index;
        if (index < first + count) {  // the same sample again
          ++j;
          continue;
        }
        if (index != first + count || count == max_run) break;
        ++count;
        ++j;
      }
      staging.resize(count * row_bytes);
      array.dataset.read_rows(first, count, array.spec.dtype, staging.data());
      for (std::size_t r = k; r < j; ++r) {
        std::memcpy(sorted[r].out, staging.data() + (sorted[r].index - first) * row_bytes,
                    row_bytes);
      }
      k = j;
    }
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

  HostArray read(const std::string& split_name, Field field,
                 std::span<const std::size_t> indices) const {
    const ArrayIn& array = Impl::array(split(split_name), field);
    std::vector<std::size_t> shape{indices.size()};
    shape.insert(shape.end(), array.spec.sample_shape.begin(), array.spec.sample_shape.end());
    HostArray out = HostArray::zeros(array.spec.dtype, std::move(shape));
    const std::size_t row_bytes =
        shape_elements(array.spec.sample_shape) * dtype_size(array.spec.dtype);
    std::vector<SampleRead> reads(indices.size());
    for (std::size_t k = 0; k < indices.size(); ++k) {
      reads[k] = {indices[k], out.bytes.data() + k * row_bytes};
    }
    read_samples(split_name, field, reads);
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
    impl_->check_splits_agree();
    impl_->enable_direct_reads();
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
  return impl_->read(split, Field::inputs, indices);
}

HostArray DatasetFile::read_targets(const std::string& split,
                                    std::span<const std::size_t> indices) const {
  return impl_->read(split, Field::targets, indices);
}

void DatasetFile::read_samples(const std::string& split, Field field,
                               std::span<const SampleRead> reads) const {
  impl_->read_samples(split, field, reads);
}

void DatasetFile::read_ahead(const std::string& split, std::size_t first, std::size_t count) const {
  const SplitIn& in = impl_->split(split);
  if (count == 0 || first >= in.samples) return;
  count = std::min(count, in.samples - first);
  for (const ArrayIn* array : {&in.inputs, &in.targets}) {
    if (!array->direct) continue;
    // Rows of one block lie together; a run of rows may cross into the next block.
    for (std::size_t row = first; row < first + count;) {
      const std::size_t block = row / array->layout.rows_per_block;
      const std::size_t end_row =
          std::min(first + count, (block + 1) * array->layout.rows_per_block);
      const std::uint64_t begin = impl_->mapped_row(*array, row).data() - impl_->map;
      const std::uint64_t end = begin + (end_row - row) * array->layout.row_bytes;
      const auto [from, to] = impl_->whole_pages(begin, end);
      ::madvise(const_cast<std::byte*>(impl_->map + from), to - from, MADV_WILLNEED);
      row = end_row;
    }
  }
}

void DatasetFile::check_not_truncated(const std::string& split) const {
  const SplitIn& in = impl_->split(split);
  for (const Field field : {Field::inputs, Field::targets}) {
    const ArrayIn& array = Impl::array(in, field);
    if (array.direct) impl_->check_not_truncated(array, impl_->array_name(split, field));
  }
}

bool DatasetFile::mapped_samples(const std::string& split, Field field,
                                 std::span<const std::size_t> indices,
                                 std::vector<std::span<const std::byte>>& out) const {
  const SplitIn& in = impl_->split(split);
  const ArrayIn& array = Impl::array(in, field);
  if (!array.direct) return false;
  for (const std::size_t index : indices) impl_->check_index(in, split, index);
  impl_->check_not_truncated(array, impl_->array_name(split, field));
  out.clear();
  out.reserve(indices.size());
  for (const std::size_t index : indices) out.push_back(impl_->mapped_row(array, index));
  return true;
}

bool DatasetFile::reads_directly(const std::string& split, Field field) const {
  return Impl::array(impl_->split(split), field).direct;
}

bool DatasetFile::preload(const std::string& split, std::size_t max_bytes) {
  return impl_->preload(split, max_bytes);
}

bool DatasetFile::preloaded(const std::string& split) const {
  return impl_->split(split).preloaded;
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

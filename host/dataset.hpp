// The training-data schema on disk and its reader/writer: an HDF5 file with /train and /test,
// each holding "inputs" and "targets" with the sample dimension first, chunked by samples.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "host/host_array.hpp"

namespace ipupod::host {

// Schema (version 1):
//   /                     string attributes: source, license, description (others allowed)
//   /train, /test         groups; optional numeric attributes (e.g. normalisation figures)
//   /<split>/inputs       [samples, sample_shape...]  float32|float16|int32|uint32|uint8
//   /<split>/targets      [samples, sample_shape...]  same dtypes; same sample count as inputs
// Datasets are chunked in blocks of whole samples so that reading a batch touches few chunks.

// Bad input: the file is missing or does not follow the schema (the CLI maps it to exit code 2).
class DatasetError : public std::runtime_error {
  using runtime_error::runtime_error;
};

struct ArraySpec {
  DType dtype = DType::f32;
  std::vector<std::size_t> sample_shape;  // shape of one sample (without the sample dimension)
};

struct SplitInfo {
  std::size_t samples = 0;
  ArraySpec inputs;
  ArraySpec targets;
};

// Which array of a split.
enum class Field { inputs, targets };
std::string_view field_name(Field field);  // "inputs", "targets"

// One sample to read: sample `index` of a split lands at `out`, which has room for one sample.
struct SampleRead {
  std::size_t index = 0;
  std::byte* out = nullptr;
};

// Read-only access to a dataset file. The file stays open for the object's lifetime.
// Both splits must hold the same dtypes and sample shapes (the model is built from /train).
class DatasetFile {
 public:
  // Validates the whole schema; throws DatasetError naming the problem.
  explicit DatasetFile(const std::string& path);
  ~DatasetFile();
  DatasetFile(DatasetFile&&) noexcept;
  DatasetFile& operator=(DatasetFile&&) noexcept;

  const std::string& path() const;
  SplitInfo info(const std::string& split) const;  // "train" or "test"

  // [indices.size(), sample_shape...] in the order of `indices` (any order, repeats allowed).
  // Consecutive runs of sorted indices are read as one hyperslab each.
  HostArray read_inputs(const std::string& split, std::span<const std::size_t> indices) const;
  HostArray read_targets(const std::string& split, std::span<const std::size_t> indices) const;

  // Reads samples of /<split>/<field> into the caller's memory, in any order, repeats allowed;
  // safe to call from several threads. Uncompressed data is copied row by row out of a read-only
  // mapping of the file (no system call per sample); compressed data goes through HDF5 in runs
  // of consecutive rows.
  void read_samples(const std::string& split, Field field, std::span<const SampleRead> reads) const;
  // Where samples of /<split>/<field> lie in the read-only mapping of the file: one span per
  // index, in the order given, valid while this object lives (e.g. to send them to a socket with
  // a gather write instead of copying them into a batch first). False, `out` untouched, if the
  // array is read through HDF5 (compressed). Checks, as read_samples does, that the indices are
  // in range and that the file has not shrunk.
  bool mapped_samples(const std::string& split, Field field, std::span<const std::size_t> indices,
                      std::vector<std::span<const std::byte>>& out) const;
  // DatasetError if the file has become shorter than the split's rows in the mapping need (it
  // was truncated or rewritten in place): reading such a page would kill the process with
  // SIGBUS. Spans from mapped_samples are safe to read while the file keeps its length: check
  // again just before reading them if time has passed.
  void check_not_truncated(const std::string& split) const;
  // True if read_samples bypasses the HDF5 library for that array (for tests and benchmarks).
  bool reads_directly(const std::string& split, Field field) const;

  // Before epochs of shuffled reads: brings the file pages of the rows that read_samples copies
  // from the mapping into memory and maps them, range after range in file order (whole chunks:
  // the reads a sequential pass makes), if they take at most `max_bytes`; returns whether the
  // split is preloaded. A shuffled order needs samples from all over the file from its first
  // step on, and on a file that is not in the page cache its random page faults cost many times
  // a sequential read. Arrays read through HDF5 are left alone. Not safe while other threads
  // read from this file.
  bool preload(const std::string& split, std::size_t max_bytes);
  bool preloaded(const std::string& split) const;
  // Asks the system to start reading the file pages of rows [first, first + count) of both
  // arrays of the split (those read from the mapping) and returns at once: a reader that
  // reaches them later finds them in memory or on their way. Safe from several threads.
  void read_ahead(const std::string& split, std::size_t first, std::size_t count) const;

  std::map<std::string, std::string> attributes() const;  // root string attributes
  std::map<std::string, double> split_attributes(const std::string& split) const;  // numeric

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct DatasetWriterOptions {
  bool overwrite = false;
  std::size_t chunk_samples = 256;
  int deflate_level = 0;  // 0 = uncompressed (fastest to read)
};

// Writes a dataset file atomically: everything goes to PATH.tmp, finish() renames it into place.
// Destroying a writer without finish() removes the temporary file.
class DatasetWriter {
 public:
  // Throws DatasetError if `path` exists and !options.overwrite (the message says to pass --force).
  explicit DatasetWriter(const std::string& path, DatasetWriterOptions options = {});
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // split is "train" or "test"; inputs and targets have the same (non-zero) sample count.
  void write_split(const std::string& split, const HostArray& inputs, const HostArray& targets);
  void set_attribute(const std::string& name, const std::string& value);  // root, string
  void set_attribute(const std::string& split, const std::string& name, double value);
  // Flushes, closes and renames into place; both splits must have been written.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ipupod::host

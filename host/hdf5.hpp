// A small RAII layer over the HDF5 C API: move-only handles for files, groups, datasets,
// dataspaces, datatypes and attributes; every return code checked and turned into Hdf5Error.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "host/host_array.hpp"

namespace ipupod::host {

// An HDF5 call failed. The message names the action, the file and the object, and carries the
// innermost messages of HDF5's own error stack (which is never printed to stderr).
class Hdf5Error : public std::runtime_error {
 public:
  Hdf5Error(const std::string& action, const std::string& file, const std::string& object,
            const std::string& detail);
  const std::string& file() const { return file_; }
  const std::string& object() const { return object_; }

 private:
  std::string file_;
  std::string object_;
};

namespace h5 {

// The serial HDF5 library is not thread-safe: every call in this layer holds this lock.
std::unique_lock<std::recursive_mutex> lock();

// Turns off HDF5's automatic error printing for the process (idempotent; called by every
// function that opens something, so users need not call it).
void silence_error_printing();

// True if `path` exists and carries the HDF5 signature.
bool is_hdf5_file(const std::string& path);

// Owns one hid_t and closes it with the matching H5*close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer, std::string file, std::string object);
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other) noexcept;
  ~Handle();

  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  const std::string& file() const { return file_; }
  const std::string& object() const { return object_; }
  // Closes now and throws Hdf5Error if HDF5 reports a failure (the destructor only logs nothing).
  void close();

 private:
  void release() noexcept;
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
  std::string file_;
  std::string object_;
};

class Datatype : public Handle {
 public:
  using Handle::Handle;
  // The in-memory type for `dtype` (float16 is a custom IEEE binary16 type).
  static Datatype memory_type(DType dtype);
};

class Dataspace : public Handle {
 public:
  using Handle::Handle;
  static Dataspace simple(std::span<const std::size_t> dims, const std::string& file = "",
                          const std::string& object = "");
  std::vector<std::size_t> dims() const;
  // Selects rows [first, first+count) along dimension 0 (all of the other dimensions).
  void select_rows(std::size_t first, std::size_t count);
};

// Where the rows (samples) of an uncompressed dataset lie in its file, so that reads can bypass the
// HDF5 library (copied straight from a mapping of the file into the caller's buffers). Rows are
// stored in blocks of `rows_per_block` consecutive rows -- the chunks, or one block for a
// contiguous dataset -- and the bytes of a row never straddle two blocks.
struct RowLayout {
  std::size_t row_bytes = 0;
  std::size_t rows_per_block = 0;
  std::vector<std::uint64_t> block_offsets;  // file offset of each block, in row order
};

class Dataset : public Handle {
 public:
  using Handle::Handle;
  std::vector<std::size_t> dims() const;
  // The DType stored in the file; false if the file type has no DType (see type_description).
  bool stored_dtype(DType& dtype) const;
  // Human-readable file type, e.g. "64-bit float" or "8-bit signed integer".
  std::string type_description() const;
  // Reads rows [first, first+count) into `out` (count * row bytes of `dtype`).
  void read_rows(std::size_t first, std::size_t count, DType dtype, void* out) const;
  // Reads several runs of rows, {first, count} each; rows land in `out` back to back in run
  // order. One H5Dread per run: in HDF5 1.10 a union-of-hyperslabs selection costs more CPU
  // than the calls it saves.
  void read_row_runs(std::span<const std::pair<std::size_t, std::size_t>> runs, DType dtype,
                     void* out) const;
  // Reads the whole dataset (any rank, also a scalar) into `out`.
  void read_all(DType dtype, void* out) const;
  // Writes the whole dataset from `array` (same number of elements).
  void write(const HostArray& array);
  // Fills `layout` and returns true if the rows can be read straight from the file as `dtype`:
  // no filters (compression), no external storage or user block, every block allocated, the
  // stored type identical to the in-memory type, and chunks that hold whole rows. Otherwise
  // returns false and reads must go through read_rows.
  bool direct_row_layout(DType dtype, RowLayout& layout) const;
};

class Group : public Handle {
 public:
  using Handle::Handle;
  bool has_link(const std::string& name) const;
  bool has_group(const std::string& name) const;
  bool has_dataset(const std::string& name) const;
  Group open_group(const std::string& name) const;
  // Names of the links (groups, datasets) in this group, in name order.
  std::vector<std::string> link_names() const;
  Group create_group(const std::string& name);
  // chunk_cache_bytes: HDF5's per-dataset chunk cache; 0 reads uncompressed rows straight from
  // the file (best for random sample access), SIZE_MAX keeps HDF5's default.
  Dataset open_dataset(const std::string& name, std::size_t chunk_cache_bytes = SIZE_MAX) const;
  // A chunked dataset; `chunk` has the rank of `dims` (deflate_level 0 = no compression). An
  // empty `chunk` makes a contiguous dataset (no compression), e.g. for checkpoint tensors.
  Dataset create_dataset(const std::string& name, DType dtype, std::span<const std::size_t> dims,
                         std::span<const std::size_t> chunk, int deflate_level = 0);

  void set_string_attribute(const std::string& name, const std::string& value);
  void set_double_attribute(const std::string& name, double value);
  void set_uint64_attribute(const std::string& name, std::uint64_t value);
  // A scalar integer attribute; Hdf5Error if it is missing or not a non-negative integer.
  std::uint64_t uint64_attribute(const std::string& name) const;
  // All string attributes (fixed or variable length); other attribute types are skipped.
  std::map<std::string, std::string> string_attributes() const;
  // All scalar numeric attributes, converted to double; other attribute types are skipped.
  std::map<std::string, double> numeric_attributes() const;

 protected:
  std::string child_path(const std::string& name) const;
};

class File : public Group {
 public:
  using Group::Group;
  static File open(const std::string& path, bool read_only = true);
  // Truncates an existing file. `checksummed_metadata`: the HDF5 1.10 format, whose metadata
  // (superblock, object headers, group indexes) carries checksums that HDF5 checks on every
  // read, so that damage is an error instead of a crash in the library; readable by HDF5 1.10
  // and later only.
  static File create(const std::string& path, bool checksummed_metadata = false);
  void flush();
};

}  // namespace h5
}  // namespace ipupod::host

// The output side shared by the converters: the host's training-data schema plus per-split extra
// datasets (masks, provenance), written atomically, and a printable summary of what was written.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "host/host_array.hpp"

namespace ipupod::datasets {

// What a converter wrote: one line per split and array (dtype, shape, bytes), the file size and
// the conversion time, and free-form notes (skipped inputs, statistics).
struct ConversionSummary {
  struct ArrayLine {
    std::string split, name;
    std::string description;  // e.g. "float32[96,1,64,64]"
    std::uint64_t bytes = 0;
  };
  std::string out;
  std::map<std::string, std::size_t> samples;  // per split
  std::vector<ArrayLine> arrays;
  std::vector<std::string> notes;
  std::uint64_t file_bytes = 0;
  double seconds = 0;

  std::string summary() const;
};

// Collects both splits and writes them in finish(). Beyond host::DatasetWriter it stores extra
// datasets next to inputs and targets (/<split>/<name>, sample dimension first); the host's reader
// ignores them. The file appears under its final name only when everything is written.
class DatasetOutput {
 public:
  // Throws host::DatasetError before any work if `out` exists and !overwrite, or if its
  // directory is missing: a refused conversion costs nothing.
  DatasetOutput(std::string out, bool overwrite);

  void set_split(const std::string& split, host::HostArray inputs, host::HostArray targets);
  void add_extra(const std::string& split, const std::string& name, host::HostArray array);
  void set_attribute(const std::string& name, const std::string& value);  // root, string
  void set_attribute(const std::string& split, const std::string& name, double value);
  void add_note(std::string note) { notes_.push_back(std::move(note)); }

  ConversionSummary finish();

 private:
  struct Split {
    host::HostArray inputs, targets;
    std::vector<std::pair<std::string, host::HostArray>> extras;
    std::vector<std::pair<std::string, double>> attributes;
  };
  std::string out_;
  std::map<std::string, Split> splits_;
  std::vector<std::pair<std::string, std::string>> attributes_;
  std::vector<std::string> notes_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// A number as people write it: "0.25", "1e-07", "18.2447" (not std::to_string's "0.250000").
std::string to_text(double value);

// "a, b, c" -- for attributes that list names.
std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");

}  // namespace ipupod::datasets

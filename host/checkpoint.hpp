// Training checkpoints in HDF5: weights, optimizer state, step, RNG states and the run's config,
// written atomically (temporary file, fsync, rename) and validated by name and shape on load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/host_array.hpp"

namespace ipupod::host {

// Layout (format "ipupod-checkpoint", version 2):
//   /                  attributes: format (string), version, step (uint64), checksum (uint64:
//                      the CRC32C of /checksums)
//   /checksums         uint8[n]  text, one line per part: "step <step>", "config_json <crc>",
//                      "state_json <crc>", "rng <crc> <name>", "tensor <crc> <name>" (a tensor's
//                      CRC32C covers its dtype and shape, then its bytes)
//   /config_json       uint8[n]  the run's configuration as JSON text
//   /state_json        uint8[n]  the trainer's position and running figures as JSON text
//   /tensors/<name>    one dataset per tensor, its dtype and shape (weights, optimizer state)
//   /rng/<name>        uint8[n]  one serialised RNG state per name
// Names are not empty and not "."; in the file '%' is stored as "%25" and '/' as "%2F", so that
// names like "fc0.weight/momentum" stay one HDF5 link.
struct Checkpoint {
  std::uint64_t step = 0;
  std::string config_json;
  std::string state_json;
  std::map<std::string, HostArray> tensors;
  std::map<std::string, std::string> rng_states;
};

// The checkpoint file is missing, unreadable or corrupt, or does not fit the model.
class CheckpointError : public std::runtime_error {
  using runtime_error::runtime_error;
};

// Called after each tensor is written with (tensors written, total); for progress reports. An
// exception it throws abandons the save like any other failure.
using CheckpointProgress = std::function<void(std::size_t written, std::size_t total)>;

// Writes PATH.tmp, flushes it to disk (fsync), renames it over `path` and syncs the directory:
// a crash at any point leaves either the previous checkpoint or the new one, never a torn file.
// On failure the temporary file is removed and CheckpointError says what went wrong.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     const CheckpointProgress& progress = {});

// Reads a whole checkpoint; CheckpointError if it is missing, not a checkpoint, or damaged: a
// part whose CRC32C differs from the record's (named), a step that differs from the record's,
// or a float tensor holding NaN or infinity (named, with the element).
Checkpoint load_checkpoint(const std::string& path);

// Throws CheckpointError listing every difference: tensors the model expects that the checkpoint
// lacks, tensors the checkpoint has that the model does not, and shapes that differ.
void check_compatible(const Checkpoint& checkpoint,
                      const std::map<std::string, std::vector<std::size_t>>& expected_shapes);
// The same from the checkpoint's tensor shapes alone (e.g. on a rank that has not read the file).
void check_compatible(const std::map<std::string, std::vector<std::size_t>>& saved_shapes,
                      std::uint64_t step,
                      const std::map<std::string, std::vector<std::size_t>>& expected_shapes);

}  // namespace ipupod::host

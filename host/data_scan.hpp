// The host's scan of a data set for NaN and infinity before training: every float array of both
// splits, in chunks on several threads, with a clean verdict remembered per unchanged file.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "host/dataset.hpp"

namespace ipupod::host {

// DatasetError naming the file, split, array, sample (index in the file) and element if
// `sample` (the bytes of one sample of `spec`) holds NaN or infinity; integer arrays pass.
void check_finite_sample(std::span<const std::byte> sample, const ArraySpec& spec,
                         const std::string& path, const std::string& split, Field field,
                         std::size_t index);

struct FiniteScanOptions {
  std::size_t threads = 0;  // 0: the machine's hardware threads, at most 8
  // Where clean verdicts are remembered (created if missing); empty: nowhere, every call scans.
  std::string cache_dir;
  // Called on the calling thread with the bytes scanned so far and in all, at the start, about
  // every `progress_every` and at the end, if the float arrays hold at least progress_min_bytes.
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
  std::uint64_t progress_min_bytes = std::uint64_t{64} << 20;
  std::chrono::milliseconds progress_every{1000};
  // A clean verdict is remembered only if the file had last changed at least this long before
  // the scan began: a file changed again within the same timestamp tick would keep its times
  // (nanoseconds on ext4, xfs, btrfs and tmpfs; 2 s on FAT, the coarsest).
  std::chrono::nanoseconds settled_for = std::chrono::seconds(2);
};

struct FiniteScanResult {
  bool remembered = false;  // a clean verdict for this very file was found: nothing was read
  bool saved = false;       // this scan's clean verdict was written to the cache
  std::uint64_t bytes = 0;  // bytes of float data scanned
};

// Scans /train and /test inputs and targets (float32 and float16) for NaN and infinity; throws
// the DatasetError of check_finite_sample for the first bad sample in file order (train before
// test, inputs before targets). A clean verdict is remembered in options.cache_dir under the
// file's identity (see scan_marker), which changes whenever the file's contents could have.
FiniteScanResult scan_finite(const DatasetFile& file, const FiniteScanOptions& options);

// The text a clean verdict is remembered by: the file's canonical path, device, inode, size,
// modification and status-change times (nanoseconds) and a CRC-32C of its first and last 64 KiB.
// Any write to the file changes its status-change time, which no user call can set back, and a
// replaced file has a new inode; the checksums also catch a copy that kept the times. Empty if
// the file cannot be examined.
std::string scan_marker(const std::string& path);

// Where the host remembers clean scans: $IPUPOD_CACHE_DIR, else $XDG_CACHE_HOME/ipupod, else
// $HOME/.cache/ipupod; empty if none of them is set.
std::string default_scan_cache_dir();

}  // namespace ipupod::host

// The scan for NaN and infinity (check_finite_sample, scan_finite) and the cache of clean
// verdicts, keyed by the data file's identity (scan_marker).
#include "host/data_scan.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>
#include <vector>

#include "host/stream_protocol.hpp"

namespace ipupod::host {
namespace {

// IEEE exponent fields: all ones means infinity or NaN.
constexpr std::uint32_t kF32Exponent = 0x7F800000U;
constexpr std::uint16_t kF16Exponent = 0x7C00U;
// Rows are scanned in chunks of about this many bytes, one chunk per task of a thread.
constexpr std::size_t kChunkBytes = std::size_t{1} << 20;
// Below this much float data one thread is as fast as several.
constexpr std::uint64_t kParallelBytes = std::uint64_t{8} << 20;
constexpr std::size_t kMaxThreads = 8;
// The bytes at each end of the file whose checksum is part of its identity.
constexpr std::size_t kMarkerEndBytes = 64 * 1024;

// Element `i` of a sample's bytes as its bit pattern. The bytes may lie anywhere in a mapped
// file, not aligned for the element type: read by memcpy (one load once compiled).
template <class Bits>
Bits element_bits(std::span<const std::byte> sample, std::size_t i) {
  Bits bits;
  std::memcpy(&bits, sample.data() + i * sizeof(Bits), sizeof(Bits));
  return bits;
}

// Index of the first element whose exponent field is all ones, or the element count.
template <class Bits>
std::size_t first_non_finite(std::span<const std::byte> sample, Bits exponent) {
  const std::size_t count = sample.size() / sizeof(Bits);
  // A branch-free scan first (vectorised by the compiler); most samples are clean.
  bool any = false;
  for (std::size_t i = 0; i < count; ++i)
    any |= (element_bits<Bits>(sample, i) & exponent) == exponent;
  if (!any) return count;
  for (std::size_t i = 0; i < count; ++i) {
    if ((element_bits<Bits>(sample, i) & exponent) == exponent) return i;
  }
  return count;
}

bool is_float(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16;
}

// Rows [first, first + count) of one float array: one task of the scan.
struct Chunk {
  const char* split;
  Field field;
  std::size_t first, count;
};

std::string hex(std::uint64_t value) {
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << value;
  return out.str();
}

std::int64_t nanoseconds(const timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

std::uint32_t crc_of_range(int fd, std::uint64_t offset, std::size_t bytes) {
  std::vector<std::byte> buffer(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n =
        ::pread(fd, buffer.data() + got, bytes - got, static_cast<off_t>(offset + got));
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return crc32c(std::span(buffer.data(), got));
}

// The cache file of one data file's verdict (a hash of its canonical path: one per path).
std::filesystem::path marker_path(const std::string& cache_dir, const std::string& data_path) {
  std::error_code ec;
  const std::string canonical = std::filesystem::weakly_canonical(data_path, ec).string();
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : ec ? data_path : canonical)
    h = (h ^ static_cast<std::uint8_t>(c)) * 1099511628211ull;
  return std::filesystem::path(cache_dir) / ("finite-scan-" + hex(h) + ".txt");
}

constexpr const char* kVerdict = "verdict: no NaN or infinity in any float array\n";

bool remembered_clean(const std::string& cache_dir, const std::string& path,
                      const std::string& marker) {
  if (cache_dir.empty() || marker.empty()) return false;
  std::ifstream in(marker_path(cache_dir, path), std::ios::binary);
  if (!in) return false;
  const std::string stored((std::istreambuf_iterator<char>(in)), {});
  return stored == marker + kVerdict;
}

// Writes the clean verdict atomically (a unique temporary file renamed into place); a cache
// that cannot be written is no error, the next run scans again.
bool remember_clean(const std::string& cache_dir, const std::string& path,
                    const std::string& marker) {
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  const std::filesystem::path final_path = marker_path(cache_dir, path);
  const std::filesystem::path temporary =
      final_path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << marker << kVerdict;
    if (!out.flush()) {
      std::filesystem::remove(temporary, ec);
      return false;
    }
  }
  std::filesystem::rename(temporary, final_path, ec);
  if (ec) std::filesystem::remove(temporary, ec);
  return !ec;
}

// The file's modification and status-change times, the later of the two (ns since the epoch).
std::int64_t last_change_ns(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return std::numeric_limits<std::int64_t>::max();
  return std::max(nanoseconds(status.st_mtim), nanoseconds(status.st_ctim));
}

std::int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return nanoseconds(t);
}

}  // namespace

void check_finite_sample(std::span<const std::byte> sample, const ArraySpec& spec,
                         const std::string& path, const std::string& split, Field field,
                         std::size_t index) {
  if (!is_float(spec.dtype)) return;
  const std::vector<std::size_t>& sample_shape = spec.sample_shape;
  std::size_t element = 0;
  bool nan = false;  // else infinite: NaN has a non-zero fraction
  if (spec.dtype == DType::f32) {
    element = first_non_finite(sample, kF32Exponent);
    if (element == sample.size() / 4) return;
    nan = (element_bits<std::uint32_t>(sample, element) & 0x007FFFFFU) != 0;
  } else {
    element = first_non_finite(sample, kF16Exponent);
    if (element == sample.size() / 2) return;
    nan = (element_bits<std::uint16_t>(sample, element) & 0x03FFU) != 0;
  }
  std::vector<std::size_t> position(sample_shape.size());
  for (std::size_t d = sample_shape.size(), rest = element; d-- > 0;) {
    position[d] = rest % sample_shape[d];
    rest /= sample_shape[d];
  }
  throw DatasetError("dataset '" + path + "': split '" + split + "', " +
                     std::string(field_name(field)) + " of sample " + std::to_string(index) +
                     ", element " + std::to_string(element) + " (position " +
                     shape_string(position) + " in a sample of shape " +
                     shape_string(sample_shape) + ") is " + (nan ? "NaN" : "infinite") +
                     "; training needs finite values: fill or mask missing values when "
                     "converting the data");
}

std::string scan_marker(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::canonical(path, ec);
  if (ec) return {};
  const int fd = ::open(canonical.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    ::close(fd);
    return {};
  }
  const auto size = static_cast<std::uint64_t>(status.st_size);
  const std::size_t end_bytes =
      static_cast<std::size_t>(std::min<std::uint64_t>(kMarkerEndBytes, size));
  const std::uint32_t head = crc_of_range(fd, 0, end_bytes);
  const std::uint32_t tail = crc_of_range(fd, size - end_bytes, end_bytes);
  ::close(fd);
  std::ostringstream out;
  out << "ipupod finite scan 1\npath: " << canonical.string() << "\ndevice: " << status.st_dev
      << "\ninode: " << status.st_ino << "\nsize: " << size
      << "\nmtime_ns: " << nanoseconds(status.st_mtim)
      << "\nctime_ns: " << nanoseconds(status.st_ctim) << "\nhead_crc32c: " << head
      << "\ntail_crc32c: " << tail << "\n";
  return out.str();
}

std::string default_scan_cache_dir() {
  if (const char* dir = std::getenv("IPUPOD_CACHE_DIR"); dir && *dir) return dir;
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir && *dir)
    return (std::filesystem::path(dir) / "ipupod").string();
  if (const char* dir = std::getenv("HOME"); dir && *dir)
    return (std::filesystem::path(dir) / ".cache" / "ipupod").string();
  return {};
}

FiniteScanResult scan_finite(const DatasetFile& file, const FiniteScanOptions& options) {
  FiniteScanResult result;
  const std::int64_t started_ns = now_ns();
  const std::string marker = scan_marker(file.path());
  if (remembered_clean(options.cache_dir, file.path(), marker)) {
    result.remembered = true;
    return result;
  }

  std::vector<Chunk> chunks;
  std::vector<std::uint64_t> chunk_bytes;
  for (const char* split : {"train", "test"}) {
    const SplitInfo info = file.info(split);
    for (const Field field : {Field::inputs, Field::targets}) {
      const ArraySpec& spec = field == Field::inputs ? info.inputs : info.targets;
      const std::size_t row_bytes = shape_elements(spec.sample_shape) * dtype_size(spec.dtype);
      if (!is_float(spec.dtype) || row_bytes == 0) continue;
      const std::size_t rows = std::max<std::size_t>(1, kChunkBytes / row_bytes);
      for (std::size_t first = 0; first < info.samples; first += rows) {
        chunks.push_back({split, field, first, std::min(rows, info.samples - first)});
        chunk_bytes.push_back(chunks.back().count * row_bytes);
      }
    }
  }
  const std::uint64_t total =
      std::accumulate(chunk_bytes.begin(), chunk_bytes.end(), std::uint64_t{0});

  // Threads take the next chunk in file order; after a failure none starts a later chunk, and
  // every earlier one is finished, so the error reported is the first in file order.
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> first_bad{chunks.size()};
  std::atomic<std::uint64_t> done{0};
  std::exception_ptr error;
  std::mutex mutex;
  std::condition_variable finished;
  std::size_t running = 0;
  const auto work = [&] {
    std::vector<std::size_t> indices;
    std::vector<std::span<const std::byte>> rows;
    std::vector<std::byte> buffer;
    std::vector<SampleRead> reads;
    for (std::size_t c = next++; c < chunks.size() && c < first_bad.load(); c = next++) {
      const Chunk& chunk = chunks[c];
      const SplitInfo info = file.info(chunk.split);
      const ArraySpec& spec = chunk.field == Field::inputs ? info.inputs : info.targets;
      const std::size_t row_bytes = chunk_bytes[c] / chunk.count;
      try {
        indices.resize(chunk.count);
        std::iota(indices.begin(), indices.end(), chunk.first);
        if (!file.mapped_samples(chunk.split, chunk.field, indices, rows)) {
          buffer.resize(chunk_bytes[c]);
          reads.resize(chunk.count);
          rows.resize(chunk.count);
          for (std::size_t k = 0; k < chunk.count; ++k) {
            reads[k] = {indices[k], buffer.data() + k * row_bytes};
            rows[k] = std::span<const std::byte>(buffer.data() + k * row_bytes, row_bytes);
          }
          file.read_samples(chunk.split, chunk.field, reads);
        }
        for (std::size_t k = 0; k < chunk.count; ++k)
          check_finite_sample(rows[k], spec, file.path(), chunk.split, chunk.field, indices[k]);
      } catch (const std::exception&) {
        std::lock_guard<std::mutex> guard(mutex);
        if (c < first_bad.load()) {
          first_bad.store(c);
          error = std::current_exception();
        }
      }
      done += chunk_bytes[c];
    }
    std::lock_guard<std::mutex> guard(mutex);
    --running;
    finished.notify_all();
  };

  const bool report = options.progress && total >= options.progress_min_bytes;
  if (report) options.progress(0, total);
  std::size_t threads = options.threads
                            ? options.threads
                            : std::max<std::size_t>(1, std::thread::hardware_concurrency());
  threads = std::min({threads, kMaxThreads, chunks.size()});
  if (total < kParallelBytes) threads = std::min<std::size_t>(threads, 1);
  std::vector<std::thread> pool;
  running = threads;
  for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(work);
  {
    std::unique_lock<std::mutex> lock(mutex);
    while (!finished.wait_for(lock, options.progress_every, [&] { return running == 0; })) {
      if (report) {
        lock.unlock();
        options.progress(done.load(), total);
        lock.lock();
      }
    }
  }
  for (std::thread& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
  if (report) options.progress(total, total);
  result.bytes = total;
  // Remembered only if the file did not change while it was scanned, and had not changed just
  // before (a change within the same timestamp tick would leave its times as they are).
  if (!options.cache_dir.empty() && !marker.empty() && scan_marker(file.path()) == marker &&
      last_change_ns(file.path()) + options.settled_for.count() <= started_ns)
    result.saved = remember_clean(options.cache_dir, file.path(), marker);
  return result;
}

}  // namespace ipupod::host

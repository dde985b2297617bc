// `ipupod bench host`: streams a converted data set to N IPU clients over real TCP (StreamServer,
// StreamClient, the Loader's shuffled shards) and compares with a plain sequential HDF5 read loop.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <iomanip>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "host/dataset.hpp"
#include "host/hdf5.hpp"
#include "host/loader.hpp"
#include "host/stream_client.hpp"
#include "host/stream_server.hpp"
#include "pod/cli/bench.hpp"

namespace ipupod::pod {
namespace {

using Clock = std::chrono::steady_clock;

struct HostBenchOptions {
  std::string data;
  std::string split = "train";
  std::size_t clients = 4;
  std::size_t samples_per_step = 256;
  std::size_t prefetch_steps = 4;
  std::size_t reader_threads = 1;
  std::size_t credits = 8;
  std::size_t runs = 5;
  std::size_t warm_up_epochs = 1;
  double device_ms_per_step = 0;
  bool shuffle = true;
  std::size_t shuffle_window = 0;
  bool cold_cache = false;
  bool copy_batches = false;  // send copied batches even where the loader serves views
  std::uint64_t seed = 0;
  std::optional<std::size_t> max_memory_mb{};  // the loader's default when unset
};

// Bytes per row block of the raw loop: large sequential reads, as a plain reader would do.
constexpr std::size_t kRawBlockBytes = std::size_t{4} << 20;
constexpr std::uint16_t kInputStream = 0, kTargetStream = 1;

// CPU seconds used by the whole process so far (all threads, user and system): a figure the
// other processes on a busy machine disturb much less than wall time.
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Evicts the data file's pages from the operating system's page cache (clean pages of a file
// nobody maps), so the next pass reads from the storage device as a data set larger than memory
// would. No privileges needed; a no-op the kernel may refuse is reported.
void evict_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path + " to evict it from the page cache");
  const int status = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (status != 0) {
    throw std::runtime_error("posix_fadvise(DONTNEED) on " + path + " failed (" +
                             std::strerror(status) + "); run without --cold-cache");
  }
}

// The peer: every row of inputs and targets, in file order, in blocks, into one reused buffer.
// With warm-up passes, only the last pass is timed (the file stays open, the buffer allocated).
double raw_read_bytes_per_s(const HostBenchOptions& o, std::size_t& bytes, double& cpu_seconds) {
  auto start = Clock::now();
  double cpu_start = process_cpu_seconds();
  const host::h5::File file = host::h5::File::open(o.data, true);
  const host::h5::Group group = file.open_group(o.split);
  std::vector<std::byte> buffer;
  for (std::size_t pass = 0; pass <= o.warm_up_epochs; ++pass) {
    if (pass == o.warm_up_epochs && (pass > 0 || o.cold_cache)) {
      if (o.cold_cache) evict_from_page_cache(o.data);
      start = Clock::now();
      cpu_start = process_cpu_seconds();
    }
    bytes = 0;
    for (const char* name : {"inputs", "targets"}) {
      const host::h5::Dataset dataset = group.open_dataset(name);
      host::DType dtype = host::DType::f32;
      if (!dataset.stored_dtype(dtype))
        throw host::DatasetError(std::string("bad dtype of ") + name);
      const std::vector<std::size_t> shape = dataset.dims();
      const std::size_t row_bytes =
          host::shape_elements(shape) / shape[0] * host::dtype_size(dtype);
      const std::size_t block = std::max<std::size_t>(1, kRawBlockBytes / row_bytes);
      buffer.resize(block * row_bytes);
      for (std::size_t first = 0; first < shape[0]; first += block) {
        const std::size_t count = std::min(block, shape[0] - first);
        dataset.read_rows(first, count, dtype, buffer.data());
        bytes += count * row_bytes;
      }
    }
  }
  cpu_seconds = process_cpu_seconds() - cpu_start;
  return static_cast<double>(bytes) / seconds_since(start);
}

std::size_t max_memory_bytes(const HostBenchOptions& o) {
  return o.max_memory_mb ? *o.max_memory_mb << 20 : host::default_max_memory_bytes();
}

struct StreamResult {
  double bytes_per_s = 0;
  double setup_seconds = 0;  // the loader's construction (the split's preload included)
  bool preloaded = false;
  bool views = false;  // batches sent from the file's mapping (Loader::batch_view)
  double wait_fraction = 0;
  double cpu_seconds = 0;
  std::size_t bytes = 0;
  std::size_t prefetched = 0, synchronous = 0;
};

// Epochs of the split to `clients` IPU clients in this process, one feeder thread per replica as
// in `ipupod train`; the last one is measured (with no warm-up, from the loader's creation to
// the last client's last frame).
StreamResult stream_epoch(const HostBenchOptions& o) {
  const std::string secret = host::make_secret();
  host::StreamServer server({.bind_address = "127.0.0.1",
                             .port = 0,
                             .secret = secret,
                             .clients = o.clients,
                             .timeout = std::chrono::seconds(60),
                             .hello_timeout = std::chrono::seconds(60),
                             .log = {}});
  std::vector<std::future<std::unique_ptr<host::StreamClient>>> connecting;
  for (std::size_t c = 0; c < o.clients; ++c) {
    connecting.push_back(std::async(std::launch::async, [&, c] {
      return std::make_unique<host::StreamClient>(
          host::ClientConfig{.address = "127.0.0.1",
                             .port = server.port(),
                             .secret = secret,
                             .client_id = c,
                             .credits = o.credits,
                             .timeout = std::chrono::seconds(60)});
    }));
  }
  server.accept_clients();
  std::vector<std::unique_ptr<host::StreamClient>> clients;
  for (auto& pending : connecting) clients.push_back(pending.get());

  if (o.cold_cache) evict_from_page_cache(o.data);
  const auto start = Clock::now();
  const double cpu_start = process_cpu_seconds();
  host::Loader loader({.path = o.data,
                       .split = o.split,
                       .replicas = o.clients,
                       .samples_per_step = o.samples_per_step,
                       .shuffle = o.shuffle,
                       .shuffle_window = o.shuffle_window,
                       .seed = o.seed,
                       .prefetch_steps = o.prefetch_steps,
                       .reader_threads = o.reader_threads,
                       .max_memory_bytes = max_memory_bytes(o)});
  const double setup_seconds = seconds_since(start);
  const std::size_t steps = loader.steps_per_epoch();
  const bool views = !o.copy_batches && loader.serves_views();
  std::vector<std::thread> feeders;
  std::vector<std::exception_ptr> failures(2 * o.clients);
  for (std::size_t r = 0; r < o.clients; ++r) {
    feeders.emplace_back([&, r] {
      try {
        for (std::size_t e = 0; e <= o.warm_up_epochs; ++e) {
          for (std::size_t s = 0; s < steps; ++s) {
            if (views) {
              const host::BatchView batch = loader.batch_view(e, s, r);
              for (const auto& [id, array] :
                   {std::pair{kInputStream, &batch.inputs}, {kTargetStream, &batch.targets}})
                server.send(r, {id, e * steps + s, array->dtype, array->shape, array->samples},
                            [&] { loader.check_views(); });
              continue;
            }
            host::Batch batch = loader.batch(e, s, r);
            server.send(r, {kInputStream, e * steps + s, batch.inputs});
            server.send(r, {kTargetStream, e * steps + s, batch.targets});
            loader.recycle(std::move(batch));
          }
        }
      } catch (...) {
        failures[r] = std::current_exception();
        server.close();
      }
    });
  }
  // Each client takes its frames (checked by CRC into its receive buffer, as the raw loop reads
  // into its buffer) and optionally spends an emulated compute time per step; it measures how
  // long it waited.
  // Only the last epoch is measured: from the first client's end of the warm-up epochs (a
  // conservative start: the others may still be finishing theirs) to the last client's end.
  std::vector<double> waited(o.clients), busy(o.clients);
  std::vector<std::size_t> received(o.clients);
  std::mutex mark_mutex;
  std::optional<Clock::time_point> measured_from;
  double cpu_from = 0;
  std::vector<std::thread> devices;
  for (std::size_t c = 0; c < o.clients; ++c) {
    devices.emplace_back([&, c] {
      try {
        host::Frame frame;
        Clock::time_point client_from = start;
        for (std::size_t position = 0; position < (o.warm_up_epochs + 1) * steps; ++position) {
          if (position == o.warm_up_epochs * steps && position > 0) {
            client_from = Clock::now();
            std::lock_guard<std::mutex> guard(mark_mutex);
            if (!measured_from) {
              measured_from = client_from;
              cpu_from = process_cpu_seconds();
            }
          }
          const bool measured = position >= o.warm_up_epochs * steps;
          for (std::uint16_t stream : {kInputStream, kTargetStream}) {
            const auto asked = Clock::now();
            clients[c]->receive(frame);
            if (measured) waited[c] += seconds_since(asked);
            if (frame.stream != stream || frame.step != position) {
              throw std::runtime_error("client " + std::to_string(c) + " got stream " +
                                       std::to_string(frame.stream) + " step " +
                                       std::to_string(frame.step) + " out of order");
            }
            if (measured) received[c] += frame.array.bytes.size();
          }
          if (o.device_ms_per_step > 0) {
            std::this_thread::sleep_for(
                std::chrono::duration<double, std::milli>(o.device_ms_per_step));
          }
        }
        busy[c] = seconds_since(client_from);
      } catch (...) {
        failures[o.clients + c] = std::current_exception();
      }
    });
  }
  for (auto& device : devices) device.join();
  const double elapsed = seconds_since(measured_from.value_or(start));
  const double cpu_seconds = process_cpu_seconds() - (measured_from ? cpu_from : cpu_start);
  for (auto& feeder : feeders) feeder.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  server.close();

  StreamResult result;
  result.cpu_seconds = cpu_seconds;
  result.setup_seconds = setup_seconds;
  result.preloaded = loader.preloaded();
  result.views = views;
  for (std::size_t c = 0; c < o.clients; ++c) {
    result.bytes += received[c];
    result.wait_fraction += waited[c] / busy[c] / static_cast<double>(o.clients);
  }
  result.bytes_per_s = static_cast<double>(result.bytes) / elapsed;
  result.prefetched = loader.stats().prefetched;
  result.synchronous = loader.stats().synchronous;
  return result;
}

// The network's ceiling on this machine: the same bytes per client in frames of the same size,
// written from one ready buffer and read into one reused buffer over plain blocking loopback
// sockets (no file, no framing, no checksum, no flow control): what any TCP streaming could reach.
double plain_tcp_bytes_per_s(const HostBenchOptions& o, std::size_t bytes_per_client,
                             std::size_t frame_bytes, double& cpu_seconds) {
  namespace ip = boost::asio::ip;
  boost::asio::io_context io;
  ip::tcp::acceptor acceptor(io, ip::tcp::endpoint(ip::make_address("127.0.0.1"), 0));
  std::vector<ip::tcp::socket> senders, receivers;
  for (std::size_t c = 0; c < o.clients; ++c) {
    receivers.emplace_back(io);
    receivers.back().connect(acceptor.local_endpoint());
    senders.push_back(acceptor.accept());
    senders.back().set_option(ip::tcp::no_delay(true));
  }
  const std::vector<std::byte> source(frame_bytes, std::byte{1});
  // Each receiver's buffer, made before the timed pass (the streamed path reuses its buffers).
  std::vector<std::vector<std::byte>> sinks(o.clients, std::vector<std::byte>(frame_bytes));
  double elapsed = 0;
  for (std::size_t pass = 0; pass <= o.warm_up_epochs; ++pass) {
    const auto start = Clock::now();
    const double cpu_start = process_cpu_seconds();
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> failures(2 * o.clients);
    for (std::size_t c = 0; c < o.clients; ++c) {
      threads.emplace_back([&, c] {
        try {
          for (std::size_t sent = 0; sent < bytes_per_client; sent += frame_bytes) {
            const std::size_t n = std::min(frame_bytes, bytes_per_client - sent);
            boost::asio::write(senders[c], boost::asio::buffer(source.data(), n));
          }
        } catch (...) {
          failures[c] = std::current_exception();
        }
      });
      threads.emplace_back([&, c] {
        try {
          for (std::size_t got = 0; got < bytes_per_client; got += frame_bytes) {
            const std::size_t n = std::min(frame_bytes, bytes_per_client - got);
            boost::asio::read(receivers[c], boost::asio::buffer(sinks[c].data(), n));
          }
        } catch (...) {
          failures[o.clients + c] = std::current_exception();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (const auto& failure : failures) {
      if (failure) std::rethrow_exception(failure);
    }
    elapsed = seconds_since(start);
    cpu_seconds = process_cpu_seconds() - cpu_start;
  }
  return static_cast<double>(bytes_per_client * o.clients) / elapsed;
}

std::string rate(double bytes_per_s) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(1) << bytes_per_s / 1e6 << " MB/s";
  return text.str();
}

int run_host_bench(const HostBenchOptions& o) {
  if (o.clients == 0 || o.samples_per_step == 0 || o.runs == 0 || o.credits == 0) {
    std::cerr << "ipupod bench host: --clients, --samples-per-step, --runs and --credits must be "
                 "at least 1\n";
    return 2;
  }
  if (o.shuffle_window > 0 && !o.shuffle) {
    std::cerr << "ipupod bench host: --shuffle-window shuffles in windows, --no-shuffle streams "
                 "in file order; drop one of them\n";
    return 2;
  }
  std::size_t frame_bytes = 0;  // one replica's inputs per host step, the largest frame
  try {
    const host::DatasetFile file(o.data);
    const host::SplitInfo info = file.info(o.split);
    frame_bytes = o.samples_per_step * host::shape_elements(info.inputs.sample_shape) *
                  host::dtype_size(info.inputs.dtype);
    const std::size_t split_bytes =
        info.samples *
        (host::shape_elements(info.inputs.sample_shape) * host::dtype_size(info.inputs.dtype) +
         host::shape_elements(info.targets.sample_shape) * host::dtype_size(info.targets.dtype));
    std::cout << "ipupod bench host: " << o.data << " /" << o.split << ": " << info.samples
              << " samples of " << host::dtype_name(info.inputs.dtype)
              << host::shape_string(info.inputs.sample_shape) << "; " << o.clients
              << " clients over loopback TCP, " << o.samples_per_step
              << " samples per replica step, "
              << (!o.shuffle ? std::string("in file order")
                  : o.shuffle_window == 0
                      ? std::string("whole split shuffled")
                      : "shuffled in windows of " + std::to_string(o.shuffle_window) + " samples")
              << ", prefetch " << o.prefetch_steps << " steps by " << o.reader_threads
              << " threads, " << o.credits << " credits; " << o.warm_up_epochs
              << " warm-up epoch(s) per run"
              << (o.cold_cache ? ", page cache emptied before each"
                                 " timed pass"
                               : "")
              << "; reads "
              << (file.reads_directly(o.split, host::Field::inputs) ? "directly (mapped file)"
                                                                    : "through HDF5")
              << (!file.reads_directly(o.split, host::Field::inputs) ? std::string()
                  : o.shuffle && o.shuffle_window > 0
                      ? std::string(", each window's blocks read ahead")
                  : o.shuffle && split_bytes <= max_memory_bytes(o)
                      ? ", the split's " + std::to_string(split_bytes >> 20) +
                            " MiB preloaded at the loader's start"
                      : std::string(", pages faulted in as read"))
              << "; " << o.runs << " runs" << std::endl;
  } catch (const host::DatasetError& e) {
    std::cerr << "ipupod bench host: " << e.what() << "\n";
    return 2;
  }
  try {
    std::vector<double> raw_rates, stream_rates, tcp_rates, ratios, tcp_ratios, waits, cpu_ratios;
    std::cout << std::fixed;
    for (std::size_t run = 0; run < o.runs; ++run) {
      std::size_t raw_bytes = 0;
      double raw_cpu = 0;
      // Which goes first alternates from run to run, so that a drift of the machine (another
      // job starting, a virtual disk slowing down after a burst) weighs on both alike.
      double raw = 0;
      StreamResult streamed;
      if (run % 2 == 0) raw = raw_read_bytes_per_s(o, raw_bytes, raw_cpu);
      streamed = stream_epoch(o);
      if (run % 2 == 1) raw = raw_read_bytes_per_s(o, raw_bytes, raw_cpu);
      double tcp_cpu = 0;
      const double tcp = plain_tcp_bytes_per_s(o, streamed.bytes / o.clients, frame_bytes, tcp_cpu);
      raw_rates.push_back(raw);
      tcp_rates.push_back(tcp);
      tcp_ratios.push_back(streamed.bytes_per_s / tcp);
      stream_rates.push_back(streamed.bytes_per_s);
      ratios.push_back(streamed.bytes_per_s / raw);
      waits.push_back(streamed.wait_fraction);
      // CPU cost per byte of the raw read over that of streaming: the wall-time ratio this
      // machine would reach if each path had a core to itself.
      const double cpu_ratio = (raw_cpu / static_cast<double>(raw_bytes)) /
                               (streamed.cpu_seconds / static_cast<double>(streamed.bytes));
      cpu_ratios.push_back(cpu_ratio);
      std::cout << "  run " << run + 1 << ": raw HDF5 read " << rate(raw) << " (" << raw_bytes
                << " bytes, " << std::setprecision(3) << raw_cpu << " CPU s), streamed "
                << rate(streamed.bytes_per_s) << " (" << streamed.bytes << " bytes, "
                << streamed.cpu_seconds << " CPU s, loader set-up " << streamed.setup_seconds
                << " s" << (streamed.preloaded ? " (split preloaded)" : "") << "; "
                << (streamed.views
                        ? std::string("batches sent from the file's mapping")
                        : std::to_string(streamed.prefetched) + " batches prefetched, " +
                              std::to_string(streamed.synchronous) + " read synchronously")
                << "), ratio " << streamed.bytes_per_s / raw << ", CPU-cost ratio " << cpu_ratio
                << ", clients waited " << std::setprecision(1) << 100 * streamed.wait_fraction
                << "% of the time; plain TCP " << rate(tcp) << " (" << std::setprecision(3)
                << tcp_cpu << " CPU s)"
                << ", streamed/plain TCP " << std::setprecision(3) << streamed.bytes_per_s / tcp
                << std::endl;
    }
    const double ratio = median(ratios);
    std::cout << "median of " << o.runs << ": raw sequential HDF5 read " << rate(median(raw_rates))
              << ", streamed to " << o.clients << " clients " << rate(median(stream_rates))
              << ", ratio " << std::setprecision(3) << ratio
              << " (target >= 0.9: " << (ratio >= 0.9 ? "met" : "not met") << "), CPU-cost ratio "
              << median(cpu_ratios) << ", clients waited " << std::setprecision(1)
              << 100 * median(waits) << "% of the time" << std::endl;
    std::cout << "network ceiling: plain loopback TCP (" << o.clients
              << " sockets, same bytes and frame size, no file or checks) "
              << rate(median(tcp_rates)) << ", i.e. " << std::setprecision(3)
              << median(tcp_rates) / median(raw_rates) << "x the raw read; streamed/plain TCP "
              << median(tcp_ratios) << std::endl;
    return 0;
  } catch (const host::DatasetError& e) {
    std::cerr << "ipupod bench host: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ipupod bench host: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

void add_host_bench(CLI::App& bench, int& exit_code) {
  auto options = std::make_shared<HostBenchOptions>();
  CLI::App* host = bench.add_subcommand(
      "host", "Host streaming of a data set to N IPU clients vs a sequential HDF5 read loop");
  host->add_option("--data", options->data, "HDF5 data set made by `ipupod data`")->required();
  host->add_option("--split", options->split, "Split to stream: train or test")
      ->capture_default_str();
  host->add_option("--clients", options->clients, "IPU clients (replicas), one TCP stream each")
      ->check(whole_number(1, kMaxBenchThreads))
      ->capture_default_str();
  host->add_option("--samples-per-step", options->samples_per_step,
                   "Samples per replica per host step (micro-batch x accumulation x iterations)")
      ->check(whole_number(1, kMaxBenchCount))
      ->capture_default_str();
  host->add_option("--prefetch-steps", options->prefetch_steps,
                   "Host steps the loader reads ahead (0: synchronous reads)")
      ->check(whole_number(0, kMaxBenchRounds))
      ->capture_default_str();
  host->add_option("--reader-threads", options->reader_threads,
                   "Loader threads reading steps ahead (with --prefetch-steps > 0)")
      ->check(whole_number(1, kMaxBenchThreads))
      ->capture_default_str();
  host->add_option("--max-memory-mb", options->max_memory_mb,
                   "Preload the split's pages in file order at the loader's start if they take at "
                   "most this many MiB (default: half of physical memory; 0: fault them in as "
                   "read)")
      ->check(whole_number(0, std::uint64_t{1} << 40));
  host->add_option("--credits", options->credits, "Frames each client lets the host send ahead")
      ->check(whole_number(1, kMaxBenchRounds))
      ->capture_default_str();
  host->add_option("--device-ms-per-step", options->device_ms_per_step,
                   "Emulated device time per host step on each client (0: take data only)")
      ->check(finite_number({.min = 0, .max = 3.6e6}))
      ->capture_default_str();
  host->add_option("--runs", options->runs, "Repetitions; medians are reported")
      ->check(whole_number(1, kMaxBenchRounds))
      ->capture_default_str();
  host->add_option("--warm-up-epochs", options->warm_up_epochs,
                   "Epochs streamed (and passes read) before the measured one, with the same "
                   "connections, loader and buffers (0: measure the first, set-up included)")
      ->check(whole_number(0, kMaxBenchRounds))
      ->capture_default_str();
  host->add_option("--seed", options->seed, "Shuffle seed")
      ->check(whole_number(0))
      ->capture_default_str();
  host->add_flag("!--no-shuffle", options->shuffle, "Stream each epoch in file order");
  host->add_option("--shuffle-window", options->shuffle_window,
                   "Shuffle in windows of N samples (as `ipupod train --shuffle-window`; 0: the "
                   "whole split)")
      ->check(whole_number(0, kMaxBenchCount))
      ->capture_default_str();
  host->add_flag("--copy-batches", options->copy_batches,
                 "Copy each batch out of the file before sending it, as for compressed or "
                 "not preloaded data (default: uncompressed preloaded samples are sent from the "
                 "file's mapping by gather writes)");
  CLI::Option* cold = host->add_flag(
      "--cold-cache", options->cold_cache,
      "Evict the file from the page cache before each timed pass (raw read and streamed epoch), "
      "as for a data set larger than memory; measures the first pass (--warm-up-epochs 0)");
  host->footer(
      "Make the data first, e.g.\n"
      "  ipupod data fashion-mnist --out fashion-mnist.h5\n"
      "  ipupod bench host --data fashion-mnist.h5 --clients 4");
  host->callback([options, host, cold, &exit_code] {
    if (*cold) {
      if (host->count("--warm-up-epochs") > 0 && options->warm_up_epochs > 0) {
        std::cerr << "ipupod bench host: --cold-cache measures the first pass of each run; "
                     "drop --warm-up-epochs or set it to 0\n";
        exit_code = 2;
        return;
      }
      options->warm_up_epochs = 0;
    }
    exit_code = run_host_bench(*options);
  });
}

}  // namespace ipupod::pod

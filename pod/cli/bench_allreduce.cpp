// `ipupod bench allreduce` (under mpirun): the fabric's all-reduce against Open MPI's
// MPI_Allreduce on the same ranks, in the same run, for message sizes 4 KiB .. 256 MiB;
// plus the predicted time of the same all-reduce on the IPU-Links of an M2000 and a POD16.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/mpi_transport.hpp"
#include "fabric/topology.hpp"
#include "pod/cli/bench.hpp"

namespace ipupod::pod {
namespace {

struct AllreduceBenchOptions {
  std::size_t min_bytes = std::size_t{4} << 10;
  std::size_t max_bytes = std::size_t{256} << 20;
  int iterations = 7;
  int large_iterations = 5;  // from 64 MiB up, where one iteration takes around a second
  std::string algorithm = "automatic";
  std::size_t segment_kib = fabric::kDefaultSegmentBytes >> 10;
  bool check = true;
};

// Small integers: every sum is exact in float32, so the fabric's result must equal MPI's bit
// for bit whatever the order of additions.
void fill(std::vector<float>& data, int rank) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<float>(
        static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13) % 17) - 8);
  }
}

// Wall time of fn on the slowest rank (what a collective costs the job).
template <typename Fn>
double timed(MPI_Comm comm, Fn&& fn) {
  MPI_Barrier(comm);
  const double start = MPI_Wtime();
  fn();
  double elapsed = MPI_Wtime() - start;
  double slowest = 0.0;
  MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

// Short names for the table: "ring", "bidir", "hier".
const char* short_name(fabric::Algorithm algorithm) {
  switch (algorithm) {
    case fabric::Algorithm::bidirectional_ring:
      return "bidir";
    case fabric::Algorithm::hierarchical:
      return "hier";
    default:
      return fabric::to_string(algorithm);
  }
}

std::string human_bytes(std::size_t bytes) {
  char text[32];
  if (bytes >= (std::size_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%zu MiB", bytes >> 20);
  } else {
    std::snprintf(text, sizeof text, "%zu KiB", bytes >> 10);
  }
  return text;
}

int run_allreduce_bench(const AllreduceBenchOptions& options) {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  fabric::MpiTransport transport(comm);
  fabric::CollectiveOptions collective;
  collective.algorithm = fabric::algorithm_from_string(options.algorithm);
  collective.segment_bytes = options.segment_kib << 10;

  const fabric::Topology m2000 = fabric::Topology::preset("m2000");
  const fabric::Topology pod16 = fabric::Topology::preset("pod16");
  const auto predicted = [](const fabric::Topology& topo, std::size_t elements) {
    fabric::CollectiveOptions on_topology;
    on_topology.topology = &topo;
    return fabric::predict(fabric::Collective::all_reduce, fabric::DataType::float32, elements,
                           topo.ipus(), on_topology);
  };

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string library(version, static_cast<std::size_t>(length));
    library = library.substr(0, library.find_first_of(",\n"));
    std::printf(
        "all-reduce (sum, float32) on %d ranks: fabric (algorithm %s, segments of %zu KiB) vs "
        "MPI_Allreduce (%s)\n"
        "medians over %d iterations (%d from 64 MiB up); time = slowest rank; "
        "busbw = 2(n-1)/n x size / time\n"
        "predicted: the same all-reduce over all IPUs of an M2000 (4) and a POD16 (16), "
        "automatic algorithm, on their IPU-Links\n\n",
        size, options.algorithm.c_str(), options.segment_kib, library.c_str(), options.iterations,
        options.large_iterations);
    std::printf("%9s  %-6s %10s %10s %10s %10s %10s %7s  %16s  %16s\n", "size", "alg.", "fabric ms",
                "MPI ms", "algbw GB/s", "busbw GB/s", "MPI busbw", "ratio", "M2000 pred. us",
                "POD16 pred. us");
  }

  int mismatches = 0;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
    const std::size_t elements = bytes / sizeof(float);
    std::vector<float> data(elements);
    std::vector<float> reference(elements);
    const int iterations =
        bytes >= (std::size_t{64} << 20) ? options.large_iterations : options.iterations;
    std::vector<double> fabric_seconds;
    std::vector<double> mpi_seconds;
    fabric::CollectiveReport report;
    // One warm-up of each (page faults, connection set-up), then alternate which goes first.
    for (int iteration = -1; iteration < iterations; ++iteration) {
      const auto run_fabric = [&] {
        fill(data, rank);
        const double seconds = timed(comm, [&] {
          report = fabric::all_reduce(transport, data, fabric::ReduceOp::sum, collective);
        });
        if (iteration >= 0) fabric_seconds.push_back(seconds);
      };
      const auto run_mpi = [&] {
        fill(reference, rank);
        const double seconds = timed(comm, [&] {
          MPI_Allreduce(MPI_IN_PLACE, reference.data(), static_cast<int>(elements), MPI_FLOAT,
                        MPI_SUM, comm);
        });
        if (iteration >= 0) mpi_seconds.push_back(seconds);
      };
      if (iteration % 2 == 0) {
        run_fabric();
        run_mpi();
      } else {
        run_mpi();
        run_fabric();
      }
    }
    int local_mismatch = options.check && data != reference ? 1 : 0;
    int any_mismatch = 0;
    MPI_Allreduce(&local_mismatch, &any_mismatch, 1, MPI_INT, MPI_MAX, comm);
    mismatches += any_mismatch;

    if (rank == 0) {
      const double fabric_time = median(fabric_seconds);
      const double mpi_time = median(mpi_seconds);
      const double bus_factor = 2.0 * (size - 1) / size;
      const double algbw = static_cast<double>(bytes) / fabric_time / 1e9;
      const double busbw = bus_factor * algbw;
      const double mpi_busbw = bus_factor * static_cast<double>(bytes) / mpi_time / 1e9;
      const fabric::CollectiveReport on_m2000 = predicted(m2000, elements);
      const fabric::CollectiveReport on_pod16 = predicted(pod16, elements);
      std::printf("%9s  %-6s %10.3f %10.3f %10.2f %10.2f %10.2f %6.2fx  %9.1f %-6s  %9.1f %-6s%s\n",
                  human_bytes(bytes).c_str(), short_name(report.algorithm), fabric_time * 1e3,
                  mpi_time * 1e3, algbw, busbw, mpi_busbw, size > 1 ? busbw / mpi_busbw : 1.0,
                  on_m2000.predicted_seconds * 1e6, short_name(on_m2000.algorithm),
                  on_pod16.predicted_seconds * 1e6, short_name(on_pod16.algorithm),
                  any_mismatch ? "  RESULT DIFFERS" : "");
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    std::printf("\nresults %s MPI_Allreduce's (exact integer-valued sums)\n",
                mismatches == 0 ? "equal" : "DIFFER FROM");
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

void add_allreduce_bench(CLI::App& bench, int& exit_code) {
  auto options = std::make_shared<AllreduceBenchOptions>();
  CLI::App* sub = bench.add_subcommand(
      "allreduce",
      "Fabric all-reduce vs MPI_Allreduce on the same ranks (run under mpirun, e.g. "
      "mpirun -n 4 ipupod bench allreduce)");
  sub->add_option("--min-bytes", options->min_bytes, "Smallest message (bytes)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{4}, std::size_t{1} << 31));
  sub->add_option("--max-bytes", options->max_bytes, "Largest message (bytes; sizes grow x4)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{4}, std::size_t{1} << 31));
  sub->add_option("--iterations", options->iterations, "Timed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--large-iterations", options->large_iterations,
                  "Timed iterations per size from 64 MiB up")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--algorithm", options->algorithm,
                  "automatic, ring or bidirectional_ring (hierarchical needs a topology)")
      ->capture_default_str();
  sub->add_option("--segment-kib", options->segment_kib, "Largest message on the wire (KiB)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  sub->callback([options, &exit_code] {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "ipupod bench allreduce: MPI_Init_thread failed; run it under mpirun\n");
      exit_code = 1;
      return;
    }
    try {
      exit_code = run_allreduce_bench(*options);
    } catch (const std::exception& error) {
      // One rank failing would leave the others waiting in a collective: end the whole job.
      std::fprintf(stderr, "ipupod bench allreduce: %s\n", error.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
  });
}

}  // namespace ipupod::pod

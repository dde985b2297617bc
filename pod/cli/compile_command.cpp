// `ipupod compile` as a command: the stages spread over the ranks, the reports gathered.
#include "pod/cli/compile_command.hpp"

#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "pod/job/protocol.hpp"
#include "pod/report.hpp"

namespace ipupod::pod {
namespace {

constexpr int kStageReportTag = 1;

}  // namespace

Ranks ranks_of(MPI_Comm world) {
  Ranks r;
  MPI_Comm_rank(world, &r.rank);
  MPI_Comm_size(world, &r.size);
  return r;
}

int usage_status(const Ranks& ranks, const char* command, const std::function<void()>& check) {
  try {
    check();
  } catch (const UsageError& e) {
    if (ranks.rank == 0) std::cerr << "ipupod " << command << ": " << e.what() << "\n";
    return 2;
  }
  return 0;
}

[[noreturn]] void abort_command(MPI_Comm world, const char* command, const std::string& what) {
  const std::string message = std::string("ipupod ") + command + ": error on rank " +
                              std::to_string(ranks_of(world).rank) + ": " + what + "\n";
  std::cerr << message << std::flush;  // one write, not split by mpirun's own notices
  MPI_Abort(world, 1);
  std::abort();
}

unsigned plan_threads(unsigned asked, MPI_Comm world) {
  MPI_Comm machine;  // the world's ranks that share this one's memory
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &machine);
  int here = 1;
  MPI_Comm_size(machine, &here);
  MPI_Comm_free(&machine);
  if (asked != 0) return asked;
  // The CPUs this process may run on (a Slurm allocation or a cpuset can give it fewer than
  // the machine has).
  unsigned cpus = std::max(1U, std::thread::hardware_concurrency());
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) cpus = std::max(1, CPU_COUNT(&allowed));
  return std::max(1U, cpus / static_cast<unsigned>(std::max(1, here)));
}

int run_compile(const CompileConfig& config, MPI_Comm world) {
  const auto [rank, size] = ranks_of(world);
  if (const int status = usage_status({rank, size}, "compile", [&] { validate(config); }))
    return status;
  CompileConfig c = config;
  c.threads = plan_threads(config.threads, world);
  std::vector<std::size_t> stages;
  for (std::size_t s = 0; s < c.train.stages; ++s)
    if (c.only_stages.empty() ||
        std::find(c.only_stages.begin(), c.only_stages.end(), s) != c.only_stages.end())
      stages.push_back(s);
  std::vector<nlohmann::json> reports(stages.size());
  try {
    if (rank == 0) std::filesystem::create_directories(c.train.run_dir);
    for (std::size_t i = static_cast<std::size_t>(rank); i < stages.size();
         i += static_cast<std::size_t>(size)) {
      const std::size_t s = stages[i];
      nlohmann::json report = compile_stage(c, s, &std::cout);
      malloc_trim(0);  // the stage's graph is gone: give its memory back before the next one
      const auto& seconds = report.at("compile_seconds");
      const auto& graph = report.at("graph");
      std::printf(
          "stage %zu compiled: lowered in %.1f s (%zu compute sets, %zu vertices), "
          "engine in %.1f s; peak host memory %.1f MiB for %.1f MiB of tile memory\n",
          s, seconds.at("lower").get<double>(), graph.at("compute_sets").get<std::size_t>(),
          graph.at("vertices").get<std::size_t>(), seconds.at("engine").get<double>(),
          static_cast<double>(
              report.at("host_memory").at("peak_resident_bytes").get<std::size_t>()) /
              (1024.0 * 1024.0),
          static_cast<double>(report.at("total_bytes").get<std::size_t>()) / (1024.0 * 1024.0));
      std::fflush(stdout);
      if (rank == 0) {
        reports[i] = std::move(report);
      } else {
        send_text(report.dump(), 0, kStageReportTag, world);
      }
    }
    if (rank != 0) return 0;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const int from = static_cast<int>(i % static_cast<std::size_t>(size));
      if (from == 0) continue;
      reports[i] = nlohmann::json::parse(receive_text(from, kStageReportTag, world));
    }
    nlohmann::json memory = nlohmann::json::array();
    nlohmann::json summary = {{"config", config_json(c.train)},
                              {"stages", nlohmann::json::array()}};
    summary["config"].erase("data");
    summary["config"]["sample_shape"] = c.sample_shape;
    summary["config"]["classes"] = c.classes;
    bool all_fit = true;
    for (const auto& r : reports) {
      all_fit &= r.at("fits").get<bool>();
      nlohmann::json row = r;
      row.erase("per_tile");
      summary["stages"].push_back(std::move(row));
      memory.push_back(r);
    }
    summary["fits"] = all_fit;
    write_file_atomically(c.train.run_dir, "memory.json", memory.dump(1) + "\n");
    write_file_atomically(c.train.run_dir, "compile.json", summary.dump(1) + "\n");
    print_compile_report(c, reports, std::cout);
    std::cout << "wrote " << c.train.run_dir << "/{memory.json,compile.json}" << std::endl;
    return all_fit ? 0 : 1;
  } catch (const std::exception& e) {
    if (size > 1) abort_command(world, "compile", e.what());
    std::cerr << "ipupod compile: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ipupod::pod

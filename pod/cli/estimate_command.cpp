// `ipupod estimate` as a command: the stages compiled and timed over the ranks, the pipeline
// played, the host's input pipeline beside it, the report and estimate.json.
#include "pod/cli/estimate_command.hpp"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/arch.hpp"
#include "pod/job/protocol.hpp"
#include "pod/job/step_timing.hpp"
#include "pod/report.hpp"

namespace ipupod::pod {
namespace {

constexpr int kStageReportTag = 2;
// One host server per 16 IPUs when not given: a POD16 (4 IPU-M2000) has one (REFERENCES.md).
constexpr std::size_t kIpusPerHost = 16;
constexpr double kMaxHostInputRate = 1e12;
constexpr std::size_t kMaxSteps = 1000;

[[noreturn]] void abort_estimate(MPI_Comm world, const std::string& what) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::cerr << "ipupod estimate: error on rank " << rank << ": " << what << std::endl;
  MPI_Abort(world, 1);
  std::abort();
}

std::size_t host_servers(const EstimateConfig& c) {
  return c.hosts > 0 ? c.hosts : (c.compile.train.ipus() + kIpusPerHost - 1) / kIpusPerHost;
}

// The parts of a host step, in seconds, each what one part of the machine would take if it
// were the only one: the step takes the IPU's own time or the host's input time, the larger.
struct StepParts {
  double compute = 0, exchange = 0, sync = 0, waits = 0, all_reduce = 0, transfers = 0,
         host_link = 0, host_input = 0;
  double ipu() const {
    return compute + exchange + sync + waits + all_reduce + transfers + host_link;
  }
  double step() const { return std::max(ipu(), host_input); }
  std::array<std::pair<const char*, double>, 8> named() const {
    return {{{"IPU compute", compute},
             {"exchange", exchange},
             {"sync", sync},
             {"pipeline bubble", waits},
             {"all-reduce", all_reduce},
             {"pipeline transfers", transfers},
             {"host link", host_link},
             {"host input", host_input}}};
  }
  // The part that bounds the step: the host's input when the IPU would wait for it, else the
  // largest part of the IPU's time.
  const char* bound() const {
    if (host_input > ipu()) return "host input";
    const auto all = named();
    return std::max_element(all.begin(), all.end() - 1,
                            [](const auto& a, const auto& b) { return a.second < b.second; })
        ->first;
  }
};

nlohmann::json parts_json(const StepParts& p) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, seconds] : p.named()) j[name] = seconds;
  return j;
}

std::string seconds_text(double s) {
  char text[32];
  if (s >= 1)
    std::snprintf(text, sizeof text, "%.3f s", s);
  else if (s >= 1e-3)
    std::snprintf(text, sizeof text, "%.3f ms", s * 1e3);
  else
    std::snprintf(text, sizeof text, "%.1f us", s * 1e6);
  return text;
}

// The slowest replica's pipeline (train reports the slowest replica's first stage): which
// class, and its stages played together.
struct Played {
  std::size_t replica = 0;
  PipelineTiming pipeline;
};

Played play_slowest(const std::vector<std::size_t>& classes,
                    const std::vector<std::vector<StageTiming>>& by_stage, std::size_t first_step,
                    std::size_t end_step) {
  Played best;
  std::uint64_t slowest = 0;
  for (std::size_t k = 0; k < classes.size(); ++k) {
    std::vector<StageTiming> stages;
    for (const auto& per_class : by_stage) stages.push_back(per_class[k]);
    PipelineTiming p = play_pipeline(stages);
    const std::uint64_t cycles = p.steps(0, first_step, end_step).cycles.total();
    if (k == 0 || cycles > slowest) {
      best = {classes[k], std::move(p)};
      slowest = cycles;
    }
  }
  return best;
}

}  // namespace

void validate(const EstimateConfig& c) {
  validate(c.compile);
  validate_job(c.compile.train);
  if (c.steps < 1 || c.steps > kMaxSteps || c.warm_up_steps > kMaxSteps)
    throw UsageError("--steps must be a whole number in [1, " + std::to_string(kMaxSteps) +
                     "] and --warm-up-steps in [0, " + std::to_string(kMaxSteps) + "], got " +
                     std::to_string(c.steps) + " and " + std::to_string(c.warm_up_steps));
  if (!(std::isfinite(c.host_input_rate) && c.host_input_rate >= 0 &&
        c.host_input_rate <= kMaxHostInputRate))
    throw UsageError(
        "--host-input-rate must be a number of samples/s in [0, 1e12] (0: not "
        "modelled), got " +
        std::to_string(c.host_input_rate));
  if (c.hosts > c.compile.train.ipus())
    throw UsageError("--hosts " + std::to_string(c.hosts) + " is more host servers than the " +
                     std::to_string(c.compile.train.ipus()) + " IPUs of the job");
}

int run_estimate(const EstimateConfig& c, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  try {
    validate(c);
  } catch (const UsageError& e) {
    if (rank == 0) std::cerr << "ipupod estimate: " << e.what() << "\n";
    return 2;
  }
  const TrainConfig& t = c.compile.train;
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(t.arch);
  const std::vector<std::size_t> classes = replica_classes(t);
  std::vector<nlohmann::json> reports(t.stages);
  try {
    if (rank == 0) std::filesystem::create_directories(t.run_dir);
    for (std::size_t s = static_cast<std::size_t>(rank); s < t.stages;
         s += static_cast<std::size_t>(size)) {
      nlohmann::json timings = nlohmann::json::array();
      double timing_seconds = 0;
      nlohmann::json report = compile_stage(c.compile, s, &std::cout, [&](ipu::Engine& engine) {
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t replica : classes) {
          const IpuPlace place{.stage = static_cast<int>(s),
                               .replica = static_cast<int>(replica),
                               .ipu = static_cast<int>(replica * t.stages + s)};
          timings.push_back(to_json(time_stage(engine, t, place, c.warm_up_steps + c.steps)));
        }
        timing_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      });
      malloc_trim(0);  // the stage's graph is gone: give its memory back before the next one
      report["timings"] = std::move(timings);
      report["compile_seconds"]["timing"] = timing_seconds;
      std::printf("stage %zu compiled and timed in %.1f s; peak host memory %.1f MiB\n", s,
                  report["compile_seconds"]["lower"].get<double>() +
                      report["compile_seconds"]["engine"].get<double>() + timing_seconds,
                  static_cast<double>(
                      report.at("host_memory").at("peak_resident_bytes").get<std::size_t>()) /
                      (1024.0 * 1024.0));
      std::fflush(stdout);
      if (rank == 0)
        reports[s] = std::move(report);
      else
        send_text(report.dump(), 0, kStageReportTag, world);
    }
    if (rank != 0) return 0;
    for (std::size_t s = 0; s < t.stages; ++s) {
      const int from = static_cast<int>(s % static_cast<std::size_t>(size));
      if (from != 0) reports[s] = nlohmann::json::parse(receive_text(from, kStageReportTag, world));
    }

    std::vector<std::vector<StageTiming>> by_stage;
    for (const auto& r : reports) {
      std::vector<StageTiming> per_class;
      for (const auto& j : r.at("timings")) per_class.push_back(stage_timing_from_json(j));
      by_stage.push_back(std::move(per_class));
    }
    const std::size_t end_step = c.warm_up_steps + c.steps;
    const Played played = play_slowest(classes, by_stage, c.warm_up_steps, end_step);
    const auto timed = [&](std::size_t stage) {
      return played.pipeline.steps(stage, c.warm_up_steps, end_step);
    };
    const double steps = static_cast<double>(c.steps);
    const auto per_step = [&](std::uint64_t cycles) {
      return static_cast<double>(cycles) / steps / arch.clock_hz;
    };
    const PipelineTiming::Steps stage0 = timed(0);
    const ipu::CycleBreakdown& first = stage0.cycles;
    const std::uint64_t waits = stage0.waits, collectives = stage0.collectives;
    StepParts parts{.compute = per_step(first.compute),
                    .exchange = per_step(first.exchange),
                    .sync = per_step(first.sync - waits),
                    .waits = per_step(waits),
                    .all_reduce = per_step(collectives),
                    .transfers = per_step(first.fabric - collectives),
                    .host_link = per_step(first.host)};
    const double samples_per_step = static_cast<double>(t.samples_per_replica_step() * t.replicas);
    const std::size_t hosts = host_servers(c);
    if (c.host_input_rate > 0)
      parts.host_input = samples_per_step / (c.host_input_rate * static_cast<double>(hosts));
    const double ipu_samples_per_s = samples_per_step / parts.ipu();
    const double samples_per_s = samples_per_step / parts.step();

    bool all_fit = true;
    nlohmann::json memory = nlohmann::json::array(), stages = nlohmann::json::array();
    for (std::size_t s = 0; s < t.stages; ++s) {
      all_fit &= reports[s].at("fits").get<bool>();
      nlohmann::json row = reports[s];
      row.erase("per_tile");
      row.erase("timings");
      const PipelineTiming::Steps st = timed(s);
      row["cycles_per_step"] = to_json(st.cycles);
      row["cycles_per_step"]["waits"] = st.waits;
      row["cycles_per_step"]["collectives"] = st.collectives;
      for (auto& [kind, value] : row["cycles_per_step"].items())
        value = static_cast<double>(value.get<std::uint64_t>()) / steps;
      stages.push_back(std::move(row));
      nlohmann::json m = reports[s];
      m.erase("timings");
      memory.push_back(std::move(m));
    }
    nlohmann::json summary = {{"config", config_json(t)}, {"stages", stages}};
    summary["config"].erase("data");
    summary["config"]["sample_shape"] = c.compile.sample_shape;
    summary["config"]["classes"] = c.compile.classes;
    summary["fits"] = all_fit;
    summary["steps_timed"] = c.steps;
    summary["warm_up_steps"] = c.warm_up_steps;
    summary["slowest_replica"] = played.replica;
    summary["replica_classes"] = classes;
    summary["samples_per_host_step"] = samples_per_step;
    summary["host"] = {{"servers", hosts},
                       {"input_samples_per_s_per_server", c.host_input_rate},
                       {"input_seconds_per_step", parts.host_input}};
    summary["seconds_per_host_step"] = parts.step();
    summary["ipu_seconds_per_host_step"] = parts.ipu();
    summary["breakdown_seconds_per_host_step"] = parts_json(parts);
    summary["predicted_ipu_samples_per_s"] = ipu_samples_per_s;
    summary["predicted_samples_per_s"] = samples_per_s;
    summary["bound"] = parts.bound();
    write_file_atomically(t.run_dir, "memory.json", memory.dump(1) + "\n");
    write_file_atomically(t.run_dir, "estimate.json", summary.dump(1) + "\n");

    print_compile_report(c.compile, reports, std::cout, "estimate");
    std::cout << "\nPredicted on " << arch.name << ", " << t.replicas << " replica"
              << (t.replicas == 1 ? "" : "s") << " x " << t.stages << " stage"
              << (t.stages == 1 ? "" : "s") << " on " << t.topology << " (" << hosts
              << " host server" << (hosts == 1 ? "" : "s") << "): a host step of "
              << samples_per_step << " samples (micro-batch " << t.micro_batch << " x accumulation "
              << t.gradient_accumulation << " x device iterations " << t.device_iterations
              << " x replicas " << t.replicas << ") takes " << seconds_text(parts.step()) << "\n";
    std::cout << "per host step, stage by stage (cycles; waits: for the other stages at syncs):\n";
    std::printf("  %-6s %14s %14s %14s %14s %14s %14s\n", "stage", "compute", "exchange", "sync",
                "waits", "fabric", "host");
    for (std::size_t s = 0; s < t.stages; ++s) {
      const PipelineTiming::Steps st = timed(s);
      const ipu::CycleBreakdown& cs = st.cycles;
      const std::uint64_t w = st.waits;
      const auto each = [&](std::uint64_t v) { return static_cast<double>(v) / steps; };
      std::printf("  %-6zu %14.0f %14.0f %14.0f %14.0f %14.0f %14.0f\n", s, each(cs.compute),
                  each(cs.exchange), each(cs.sync - w), each(w), each(cs.fabric), each(cs.host));
    }
    std::cout << "breakdown of a host step (stage 0, which the host steps with):";
    for (const auto& [name, seconds] : parts.named()) {
      if (std::string(name) == "host input" && c.host_input_rate <= 0) continue;
      std::cout << " " << name << " " << seconds_text(seconds) << ";";
    }
    std::cout << "\n";
    if (c.host_input_rate <= 0)
      std::cout << "host input: not modelled (give --host-input-rate, samples/s one host server "
                   "prepares)\n";
    std::printf("predicted: %.1f samples/s (the IPUs alone: %.1f samples/s); bound by %s\n",
                samples_per_s, ipu_samples_per_s, parts.bound());
    if (!all_fit)
      std::cout << "Not every stage fits: the figures are what the job would take if it did.\n";
    std::cout << "wrote " << t.run_dir << "/{estimate.json,memory.json}" << std::endl;
    return all_fit ? 0 : 1;
  } catch (const std::exception& e) {
    if (size > 1) abort_estimate(world, e.what());
    std::cerr << "ipupod estimate: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ipupod::pod

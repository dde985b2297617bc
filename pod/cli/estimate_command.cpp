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
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fabric/topology.hpp"
#include "ipu_process/arch.hpp"
#include "pod/cli/compile_command.hpp"
#include "pod/compiler/compiler.hpp"
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
constexpr std::size_t kMaxJobs = 10000;

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

// One configuration of the estimate (one of a sweep's).
struct Job {
  std::size_t replicas, stages, accumulation, iterations;
  std::string topology;
};

// The IPUs of a topology, or 0 when it cannot be read (validation then names the error).
std::size_t topology_ipus(const std::string& topology) {
  try {
    return static_cast<std::size_t>(fabric::Topology::preset(topology).ipus());
  } catch (const std::exception&) {
    return 0;
  }
}

std::vector<Job> jobs_of(const EstimateConfig& c) {
  const TrainConfig& t = c.compile.train;
  const auto list = [](const std::vector<std::size_t>& given, std::size_t value) {
    return given.empty() ? std::vector<std::size_t>{value} : given;
  };
  const std::vector<std::string> topologies =
      c.sweep_topologies.empty() ? std::vector<std::string>{t.topology} : c.sweep_topologies;
  std::vector<Job> jobs;
  for (const std::string& topology : topologies)
    for (std::size_t s : list(c.sweep_stages, t.stages))
      for (std::size_t r : list(c.sweep_replicas, t.replicas))
        for (std::size_t g : c.accumulation_given || !c.sweep_accumulation.empty()
                                 ? list(c.sweep_accumulation, t.gradient_accumulation)
                                 : std::vector<std::size_t>{std::max<std::size_t>(1, s)})
          for (std::size_t d : list(c.sweep_iterations, t.device_iterations))
            jobs.push_back({r, s, g, d, topology});
  // Across several topologies, the combinations a topology is too small for are left out (a
  // sweep over POD16 to POD256 and 16 to 256 replicas); a single topology still refuses them.
  if (topologies.size() > 1)
    std::erase_if(jobs, [](const Job& j) {
      const std::size_t ipus = topology_ipus(j.topology);
      return ipus > 0 && j.replicas * j.stages > ipus;
    });
  return jobs;
}

TrainConfig job_config(const EstimateConfig& c, const Job& j) {
  TrainConfig t = c.compile.train;
  t.replicas = j.replicas;
  t.stages = j.stages;
  t.gradient_accumulation = j.accumulation;
  t.device_iterations = j.iterations;
  t.topology = j.topology;
  return t;
}

std::string job_name(const Job& j) {
  return std::to_string(j.replicas) + " replicas x " + std::to_string(j.stages) +
         " stages, accumulation " + std::to_string(j.accumulation) + ", device iterations " +
         std::to_string(j.iterations) + " on " + j.topology;
}

// Jobs compiled together: the same stages, and replica counts whose graphs are the same (one
// replica has no gradient all-reduce; with replicated tensor sharding each count shards its
// own way). One compile times every accumulation and device iteration count of its jobs.
struct Unit {
  std::size_t stages = 1, replicas = 1;  // the replicas it is compiled for
  std::vector<std::size_t> jobs;         // indices into the job list; the first is compiled
};

std::vector<Unit> units_of(const EstimateConfig& c, const std::vector<Job>& jobs) {
  std::vector<Unit> units;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    const auto same = [&](const Unit& u) {
      if (u.stages != j.stages) return false;
      if (c.compile.train.replicated_tensor_sharding) return u.replicas == j.replicas;
      return (u.replicas > 1) == (j.replicas > 1);
    };
    auto it = std::find_if(units.begin(), units.end(), same);
    if (it == units.end()) it = units.insert(units.end(), Unit{j.stages, j.replicas, {}});
    it->jobs.push_back(i);
  }
  return units;
}

CompileConfig unit_compile(const EstimateConfig& c, const std::vector<Job>& jobs, const Unit& u) {
  CompileConfig cc = c.compile;
  const Job& first = jobs[u.jobs.front()];
  cc.train = job_config(c, first);
  cc.train.replicas = u.replicas;
  for (std::size_t i : u.jobs)
    if (jobs[i].accumulation != first.accumulation || jobs[i].iterations != first.iterations)
      cc.timed_steps.emplace_back(jobs[i].accumulation, jobs[i].iterations);
  return cc;
}

// The prediction of one job from its stages' reports (per job: per replica class timings).
struct JobResult {
  nlohmann::json summary;  // estimate.json's content for the job
  StepParts parts;
  Played played;
  double samples_per_step = 0;
  std::size_t hosts = 1;
  bool fits = true;
};

// `planned_accumulation`: the accumulation count of the program the stages' memory was planned
// for (a sweep plans one per compile; the grouped pipeline's first stage needs a little more
// memory with more micro-batches).
JobResult predict_job(const EstimateConfig& c, const Job& job, std::size_t job_index,
                      const std::vector<const nlohmann::json*>& reports,
                      std::size_t planned_accumulation) {
  const TrainConfig t = job_config(c, job);
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(t.arch);
  const std::vector<std::size_t> classes = replica_classes(t);
  std::vector<std::vector<StageTiming>> by_stage;
  for (const nlohmann::json* r : reports) {
    std::vector<StageTiming> per_class;
    for (const auto& j : r->at("timings").at(std::to_string(job_index)))
      per_class.push_back(stage_timing_from_json(j));
    by_stage.push_back(std::move(per_class));
  }
  JobResult out;
  const std::size_t end_step = c.warm_up_steps + c.steps;
  out.played = play_slowest(classes, by_stage, c.warm_up_steps, end_step);
  const auto timed = [&](std::size_t stage) {
    return out.played.pipeline.steps(stage, c.warm_up_steps, end_step);
  };
  const double steps = static_cast<double>(c.steps);
  const auto per_step = [&](std::uint64_t cycles) {
    return static_cast<double>(cycles) / steps / arch.clock_hz;
  };
  const PipelineTiming::Steps stage0 = timed(0);
  const ipu::CycleBreakdown& first = stage0.cycles;
  const std::uint64_t waits = stage0.waits, collectives = stage0.collectives;
  StepParts& parts = out.parts;
  parts = {.compute = per_step(first.compute),
           .exchange = per_step(first.exchange),
           .sync = per_step(first.sync - waits),
           .waits = per_step(waits),
           .all_reduce = per_step(collectives),
           .transfers = per_step(first.fabric - collectives),
           .host_link = per_step(first.host)};
  out.samples_per_step = static_cast<double>(t.samples_per_replica_step() * t.replicas);
  out.hosts = c.hosts > 0 ? c.hosts : (t.ipus() + kIpusPerHost - 1) / kIpusPerHost;
  if (c.host_input_rate > 0)
    parts.host_input = out.samples_per_step / (c.host_input_rate * static_cast<double>(out.hosts));

  nlohmann::json stages = nlohmann::json::array();
  std::size_t busiest = 0, largest = 0;
  for (std::size_t s = 0; s < t.stages; ++s) {
    const nlohmann::json& report = *reports[s];
    out.fits &= report.at("fits").get<bool>();
    busiest = std::max(busiest, report.at("busiest_tile_bytes").get<std::size_t>());
    largest = std::max(largest, report.at("total_bytes").get<std::size_t>());
    nlohmann::json row = report;
    row.erase("per_tile");
    row.erase("timings");
    const PipelineTiming::Steps st = timed(s);
    row["cycles_per_step"] = to_json(st.cycles);
    row["cycles_per_step"]["waits"] = st.waits;
    row["cycles_per_step"]["collectives"] = st.collectives;
    for (auto& [kind, value] : row["cycles_per_step"].items())
      value = static_cast<double>(value.get<std::uint64_t>()) / steps;
    stages.push_back(std::move(row));
  }
  nlohmann::json& j = out.summary;
  j = {{"config", config_json(t)}, {"stages", stages}};
  j["config"].erase("data");
  j["config"]["sample_shape"] = c.compile.sample_shape;
  j["config"]["classes"] = c.compile.classes;
  j["ipus"] = t.ipus();
  j["fits"] = out.fits;
  j["busiest_tile_bytes"] = busiest;
  j["largest_stage_bytes"] = largest;
  j["memory_planned_with_accumulation"] = planned_accumulation;
  j["steps_timed"] = c.steps;
  j["warm_up_steps"] = c.warm_up_steps;
  j["slowest_replica"] = out.played.replica;
  j["replica_classes"] = classes;
  j["samples_per_host_step"] = out.samples_per_step;
  j["host"] = {{"servers", out.hosts},
               {"input_samples_per_s_per_server", c.host_input_rate},
               {"input_seconds_per_step", parts.host_input}};
  j["seconds_per_host_step"] = parts.step();
  j["ipu_seconds_per_host_step"] = parts.ipu();
  j["breakdown_seconds_per_host_step"] = parts_json(parts);
  j["predicted_ipu_samples_per_s"] = out.samples_per_step / parts.ipu();
  j["predicted_samples_per_s"] = out.samples_per_step / parts.step();
  j["bound"] = parts.bound();
  return out;
}

void print_job(const EstimateConfig& c, const Job& job, const JobResult& r, std::ostream& out) {
  const TrainConfig t = job_config(c, job);
  const double steps = static_cast<double>(c.steps);
  out << "\nPredicted on " << ipu::ArchPreset::get(t.arch).name << ", " << t.replicas << " replica"
      << (t.replicas == 1 ? "" : "s") << " x " << t.stages << " stage" << (t.stages == 1 ? "" : "s")
      << " on " << t.topology << " (" << r.hosts << " host server" << (r.hosts == 1 ? "" : "s")
      << "): a host step of " << r.samples_per_step << " samples (micro-batch " << t.micro_batch
      << " x accumulation " << t.gradient_accumulation << " x device iterations "
      << t.device_iterations << " x replicas " << t.replicas << ") takes "
      << seconds_text(r.parts.step()) << "\n";
  out << "per host step, stage by stage (cycles; waits: for the other stages at syncs):\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-6s %14s %14s %14s %14s %14s %14s\n", "stage", "compute",
                "exchange", "sync", "waits", "fabric", "host");
  out << line;
  for (std::size_t s = 0; s < t.stages; ++s) {
    const PipelineTiming::Steps st =
        r.played.pipeline.steps(s, c.warm_up_steps, c.warm_up_steps + c.steps);
    const ipu::CycleBreakdown& cs = st.cycles;
    const auto each = [&](std::uint64_t v) { return static_cast<double>(v) / steps; };
    std::snprintf(line, sizeof line, "  %-6zu %14.0f %14.0f %14.0f %14.0f %14.0f %14.0f\n", s,
                  each(cs.compute), each(cs.exchange), each(cs.sync - st.waits), each(st.waits),
                  each(cs.fabric), each(cs.host));
    out << line;
  }
  out << "breakdown of a host step (stage 0, which the host steps with):";
  for (const auto& [name, seconds] : r.parts.named()) {
    if (std::string(name) == "host input" && c.host_input_rate <= 0) continue;
    out << " " << name << " " << seconds_text(seconds) << ";";
  }
  out << "\n";
  if (c.host_input_rate <= 0)
    out << "host input: not modelled (give --host-input-rate, samples/s one host server "
           "prepares)\n";
  std::snprintf(line, sizeof line,
                "predicted: %.1f samples/s (the IPUs alone: %.1f samples/s); bound by %s\n",
                r.samples_per_step / r.parts.step(), r.samples_per_step / r.parts.ipu(),
                r.parts.bound());
  out << line;
  if (!r.fits) out << "Not every stage fits: the figures are what the job would take if it did.\n";
}

constexpr const char* kCsvColumns =
    "model,arch,topology,replicas,stages,gradient_accumulation,device_iterations,ipus,"
    "micro_batch,global_batch,samples_per_host_step,predicted_samples_per_s,"
    "predicted_ipu_samples_per_s,seconds_per_host_step,compute_s,exchange_s,sync_s,bubble_s,"
    "all_reduce_s,transfers_s,host_link_s,host_input_s,bound,fits,busiest_tile_bytes,"
    "largest_stage_bytes,memory_planned_with_accumulation";

std::string csv_row(const EstimateConfig& c, const Job& job, const JobResult& r) {
  const TrainConfig t = job_config(c, job);
  std::ostringstream row;
  row.precision(10);
  row << t.model << "," << t.arch << "," << t.topology << "," << job.replicas << "," << job.stages
      << "," << job.accumulation << "," << job.iterations << "," << t.ipus() << "," << t.micro_batch
      << "," << t.global_batch() << "," << r.samples_per_step << ","
      << r.summary.at("predicted_samples_per_s").get<double>() << ","
      << r.summary.at("predicted_ipu_samples_per_s").get<double>() << "," << r.parts.step();
  for (const auto& [name, seconds] : r.parts.named()) row << "," << seconds;
  row << "," << r.parts.bound() << "," << (r.fits ? "yes" : "no") << ","
      << r.summary.at("busiest_tile_bytes").get<std::size_t>() << ","
      << r.summary.at("largest_stage_bytes").get<std::size_t>() << ","
      << r.summary.at("memory_planned_with_accumulation").get<std::size_t>();
  return row.str();
}

}  // namespace

void validate(const EstimateConfig& c) {
  validate(c.compile);
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
  const std::vector<Job> jobs = jobs_of(c);
  if (jobs.empty())
    throw UsageError(
        "no configuration of the sweep fits on any of its topologies; give larger "
        "topologies or fewer replicas and stages");
  if (jobs.size() > kMaxJobs)
    throw UsageError("the sweep has " + std::to_string(jobs.size()) +
                     " configurations, more than " + std::to_string(kMaxJobs) +
                     "; shorten its lists");
  std::vector<std::size_t> stage_counts_checked;  // the model's split, once per count
  for (const Job& job : jobs) {
    const TrainConfig t = job_config(c, job);
    try {
      validate_job(t);
      if (std::find(stage_counts_checked.begin(), stage_counts_checked.end(), job.stages) ==
          stage_counts_checked.end()) {
        CompileConfig cc = c.compile;
        cc.train = t;
        validate(cc);
        stage_counts_checked.push_back(job.stages);
      }
    } catch (const UsageError& e) {
      if (jobs.size() == 1) throw;
      throw UsageError(job_name(job) + ": " + e.what());
    }
    if (c.hosts > t.ipus())
      throw UsageError("--hosts " + std::to_string(c.hosts) + " is more host servers than the " +
                       std::to_string(t.ipus()) + " IPUs of " +
                       (jobs.size() == 1 ? std::string("the job") : job_name(job)));
  }
}

int run_estimate(const EstimateConfig& config, MPI_Comm world) {
  const auto [rank, size] = ranks_of(world);
  if (const int status = usage_status({rank, size}, "estimate", [&] { validate(config); }))
    return status;
  EstimateConfig c = config;
  c.compile.threads = plan_threads(config.compile.threads, world);
  const std::string& run_dir = c.compile.train.run_dir;
  const std::vector<Job> jobs = jobs_of(c);
  const std::vector<Unit> units = units_of(c, jobs);
  // The work: every stage of every unit, item i on rank i % size.
  std::vector<std::pair<std::size_t, std::size_t>> items;  // (unit, stage)
  for (std::size_t u = 0; u < units.size(); ++u)
    for (std::size_t s = 0; s < units[u].stages; ++s) items.emplace_back(u, s);
  std::vector<nlohmann::json> reports(items.size());
  try {
    if (rank == 0) std::filesystem::create_directories(run_dir);
    for (std::size_t i = static_cast<std::size_t>(rank); i < items.size();
         i += static_cast<std::size_t>(size)) {
      const auto [u, s] = items[i];
      const Unit& unit = units[u];
      const CompileConfig cc = unit_compile(c, jobs, unit);
      nlohmann::json timings = nlohmann::json::object();
      double timing_seconds = 0;
      nlohmann::json report = compile_stage(cc, s, &std::cout, [&](ipu::Engine& engine) {
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t j : unit.jobs) {
          const Job& job = jobs[j];
          const TrainConfig t = job_config(c, job);
          const std::string program = job.accumulation == cc.train.gradient_accumulation &&
                                              job.iterations == cc.train.device_iterations
                                          ? std::string("train")
                                          : timed_train_program(job.accumulation, job.iterations);
          nlohmann::json per_class = nlohmann::json::array();
          for (std::size_t replica : replica_classes(t)) {
            const IpuPlace place{.stage = static_cast<int>(s),
                                 .replica = static_cast<int>(replica),
                                 .ipu = static_cast<int>(replica * t.stages + s)};
            per_class.push_back(
                to_json(time_stage(engine, t, place, c.warm_up_steps + c.steps, program)));
          }
          timings[std::to_string(j)] = std::move(per_class);
        }
        timing_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      });
      malloc_trim(0);  // the stage's graph is gone: give its memory back before the next one
      report["timings"] = std::move(timings);
      report["compile_seconds"]["timing"] = timing_seconds;
      std::printf("%sstage %zu compiled and timed in %.1f s; peak host memory %.1f MiB\n",
                  units.size() > 1 ? (std::to_string(unit.stages) + " stages: ").c_str() : "", s,
                  report["compile_seconds"]["lower"].get<double>() +
                      report["compile_seconds"]["engine"].get<double>() + timing_seconds,
                  static_cast<double>(
                      report.at("host_memory").at("peak_resident_bytes").get<std::size_t>()) /
                      (1024.0 * 1024.0));
      std::fflush(stdout);
      if (rank == 0)
        reports[i] = std::move(report);
      else
        send_text(report.dump(), 0, kStageReportTag, world);
    }
    if (rank != 0) return 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const int from = static_cast<int>(i % static_cast<std::size_t>(size));
      if (from != 0) reports[i] = nlohmann::json::parse(receive_text(from, kStageReportTag, world));
    }
    // Each job's stage reports (its unit's), in stage order.
    std::vector<JobResult> results(jobs.size());
    bool all_fit = true;
    for (std::size_t u = 0; u < units.size(); ++u)
      for (std::size_t j : units[u].jobs) {
        std::vector<const nlohmann::json*> stage_reports;
        for (std::size_t i = 0; i < items.size(); ++i)
          if (items[i].first == u) stage_reports.push_back(&reports[i]);
        results[j] =
            predict_job(c, jobs[j], j, stage_reports, jobs[units[u].jobs.front()].accumulation);
        all_fit &= results[j].fits;
      }
    nlohmann::json memory = nlohmann::json::array();
    for (const auto& r : reports) {
      nlohmann::json m = r;
      m.erase("timings");
      memory.push_back(std::move(m));
    }
    write_file_atomically(run_dir, "memory.json", memory.dump(1) + "\n");

    // One row per configuration, a single one too (a sweep of one value, a script's query).
    std::string csv = std::string(kCsvColumns) + "\n";
    for (std::size_t j = 0; j < jobs.size(); ++j) csv += csv_row(c, jobs[j], results[j]) + "\n";
    const std::filesystem::path csv_path = c.csv.empty()
                                               ? std::filesystem::path(run_dir) / "estimate.csv"
                                               : std::filesystem::path(c.csv);
    const std::string csv_dir = csv_path.has_parent_path() ? csv_path.parent_path().string() : ".";
    std::filesystem::create_directories(csv_dir);
    write_file_atomically(csv_dir, csv_path.filename().string(), csv);
    if (jobs.size() == 1) {
      write_file_atomically(run_dir, "estimate.json", results[0].summary.dump(1) + "\n");
      CompileConfig cc = c.compile;
      cc.train = job_config(c, jobs[0]);
      print_compile_report(cc, reports, std::cout, "estimate");
      print_job(c, jobs[0], results[0], std::cout);
      std::cout << "wrote " << run_dir << "/{estimate.json,memory.json} and " << csv_path.string()
                << std::endl;
      return all_fit ? 0 : 1;
    }
    nlohmann::json all = {{"jobs", nlohmann::json::array()}};
    std::cout << "\nipupod estimate: " << c.compile.train.model << " on "
              << c.compile.train.topology << ", micro-batch " << c.compile.train.micro_batch << ", "
              << jobs.size() << " configurations from " << items.size() << " stage compiles\n";
    char line[200];
    std::snprintf(line, sizeof line, "%9s %7s %13s %10s %5s %14s %12s %5s  %s\n", "replicas",
                  "stages", "accumulation", "iterations", "IPUs", "samples/s", "step", "fits",
                  "bound");
    std::cout << line;
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      const Job& job = jobs[j];
      const JobResult& r = results[j];
      all["jobs"].push_back(r.summary);
      std::snprintf(line, sizeof line, "%9zu %7zu %13zu %10zu %5zu %14.1f %12s %5s  %s\n",
                    job.replicas, job.stages, job.accumulation, job.iterations,
                    job.replicas * job.stages, r.samples_per_step / r.parts.step(),
                    seconds_text(r.parts.step()).c_str(), r.fits ? "yes" : "no", r.parts.bound());
      std::cout << line;
    }
    write_file_atomically(run_dir, "estimate.json", all.dump(1) + "\n");
    if (!all_fit)
      std::cout << "Not every configuration fits: the figures are what they would take if they "
                   "did (see the fits column).\n";
    std::cout << "wrote " << run_dir << "/{estimate.json,memory.json} and " << csv_path.string()
              << std::endl;
    return all_fit ? 0 : 1;
  } catch (const std::exception& e) {
    if (size > 1) abort_command(world, "estimate", e.what());
    std::cerr << "ipupod estimate: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ipupod::pod

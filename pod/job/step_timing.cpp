// Timing host steps from compiled stages and playing a pipeline's stages together.
#include "pod/job/step_timing.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

#include "fabric/topology.hpp"
#include "pod/job/fabric_costs.hpp"

namespace ipupod::pod {

StageTiming time_stage(ipu::Engine& engine, const TrainConfig& config, const IpuPlace& place,
                       std::size_t steps, const std::string& program) {
  const FabricCosts costs(config, place);
  StageTiming timing;
  std::uint64_t collectives = 0;
  const ipu::CycleBreakdown start = engine.cycles();
  const double clock_hz = ipu::ArchPreset::get(config.arch).clock_hz;
  ipu::CollectiveBinding binding;
  costs.bind_predictions(binding);
  // The collectives' share of the fabric cycles, rounded up as the engine charges them.
  const auto counted = [&](auto predict) {
    return [&collectives, clock_hz, predict](std::size_t bytes) {
      const double seconds = predict(bytes);
      collectives += static_cast<std::uint64_t>(std::ceil(seconds * clock_hz));
      return seconds;
    };
  };
  binding.predict_seconds = counted(binding.predict_seconds);
  binding.predict_reduce_scatter_seconds = counted(binding.predict_reduce_scatter_seconds);
  binding.predict_all_gather_seconds = counted(binding.predict_all_gather_seconds);
  if (config.stages > 1)  // a single IPU's external syncs wait for nobody (DeviceFabric)
    binding.external_sync = [&timing, &engine, start](std::uint64_t now) {
      timing.at_syncs.push_back(engine.cycles() - start);
      return now;
    };
  engine.bind_collectives(binding);
  for (std::size_t s = 0; s < steps; ++s) {
    engine.time(program);
    timing.step_ends.push_back(engine.cycles() - start);
    timing.syncs_at_step_ends.push_back(timing.at_syncs.size());
    timing.collectives_at_step_ends.push_back(collectives);
  }
  engine.bind_collectives({});
  return timing;
}

PipelineTiming play_pipeline(const std::vector<StageTiming>& stages) {
  const std::size_t n = stages.size();
  if (n == 0) return {};
  const StageTiming& first = stages.front();
  for (const StageTiming& s : stages)
    if (s.at_syncs.size() != first.at_syncs.size() ||
        s.syncs_at_step_ends != first.syncs_at_step_ends)
      throw std::invalid_argument("the stages reach " + std::to_string(first.at_syncs.size()) +
                                  " and " + std::to_string(s.at_syncs.size()) +
                                  " external syncs over their steps: they cannot run as one "
                                  "pipeline");
  PipelineTiming out;
  out.step_ends.resize(n);
  out.waits.resize(n);
  out.collectives.resize(n);
  std::vector<std::uint64_t> waits(n, 0);  // each stage's so far
  std::size_t k = 0;                       // the next sync
  for (std::size_t step = 0; step < first.step_ends.size(); ++step) {
    for (; k < first.syncs_at_step_ends[step]; ++k) {
      std::uint64_t latest = 0;
      for (std::size_t s = 0; s < n; ++s)
        latest = std::max(latest, stages[s].at_syncs[k].total() + waits[s]);
      for (std::size_t s = 0; s < n; ++s)
        waits[s] += latest - (stages[s].at_syncs[k].total() + waits[s]);
    }
    for (std::size_t s = 0; s < n; ++s) {
      ipu::CycleBreakdown c = stages[s].step_ends[step];
      c.sync += waits[s];
      out.step_ends[s].push_back(c);
      out.waits[s].push_back(waits[s]);
      out.collectives[s].push_back(stages[s].collectives_at_step_ends[step]);
    }
  }
  return out;
}

PipelineTiming::Steps PipelineTiming::steps(std::size_t stage, std::size_t first,
                                            std::size_t last) const {
  Steps out;
  if (last <= first) return out;
  out.cycles = step_ends[stage][last - 1];
  out.waits = waits[stage][last - 1];
  out.collectives = collectives[stage][last - 1];
  if (first > 0) {
    out.cycles = out.cycles - step_ends[stage][first - 1];
    out.waits -= waits[stage][first - 1];
    out.collectives -= collectives[stage][first - 1];
  }
  return out;
}

std::vector<std::size_t> replica_classes(const TrainConfig& config) {
  const fabric::Topology topology = fabric::Topology::preset(config.topology);
  std::map<std::vector<std::string>, std::size_t> first_of;
  std::vector<std::size_t> out;
  const auto stages = static_cast<int>(config.stages);
  for (std::size_t r = 0; r < config.replicas; ++r) {
    std::vector<std::string> key;  // the link class between every two of its stages
    const int base = static_cast<int>(r) * stages;
    for (int a = 0; a < stages; ++a)
      for (int b = a + 1; b < stages; ++b) {
        const fabric::LinkClass& link = topology.link(base + a, base + b);
        key.push_back(link.name + "/" + std::to_string(link.latency_s) + "/" +
                      std::to_string(link.bandwidth_bytes_per_s));
      }
    if (first_of.emplace(std::move(key), r).second) out.push_back(r);
  }
  return out;
}

nlohmann::json to_json(const ipu::CycleBreakdown& c) {
  return {{"compute", c.compute},
          {"exchange", c.exchange},
          {"sync", c.sync},
          {"host", c.host},
          {"fabric", c.fabric}};
}

ipu::CycleBreakdown breakdown_from_json(const nlohmann::json& j) {
  return {j.at("compute"), j.at("exchange"), j.at("sync"), j.at("host"), j.at("fabric")};
}

nlohmann::json to_json(const StageTiming& t) {
  nlohmann::json syncs = nlohmann::json::array(), ends = nlohmann::json::array();
  for (const auto& c : t.at_syncs) syncs.push_back(to_json(c));
  for (const auto& c : t.step_ends) ends.push_back(to_json(c));
  return {{"at_syncs", syncs},
          {"step_ends", ends},
          {"syncs_at_step_ends", t.syncs_at_step_ends},
          {"collectives_at_step_ends", t.collectives_at_step_ends}};
}

StageTiming stage_timing_from_json(const nlohmann::json& j) {
  StageTiming t;
  for (const auto& c : j.at("at_syncs")) t.at_syncs.push_back(breakdown_from_json(c));
  for (const auto& c : j.at("step_ends")) t.step_ends.push_back(breakdown_from_json(c));
  t.syncs_at_step_ends = j.at("syncs_at_step_ends").get<std::vector<std::size_t>>();
  t.collectives_at_step_ends = j.at("collectives_at_step_ends").get<std::vector<std::uint64_t>>();
  return t;
}

}  // namespace ipupod::pod

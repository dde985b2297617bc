// Fuzz test of the configuration parsers: architecture files, topology files, the training
// configuration's validation and the comparison of a resumed run's options with the
// checkpoint's. Valid documents are mutated (fields set to extreme or wrongly typed values,
// removed, renamed, nested deeply; the text flipped, truncated, spliced). Every input is either
// accepted with figures inside their documented bounds or refused with the documented error
// (std::invalid_argument, FabricError, UsageError) and a message; nothing else may happen.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "fabric/topology.hpp"
#include "ipu_process/arch.hpp"
#include "pod/config.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/host/temp_dir.hpp"

namespace {

using ipupod::fuzz::pick;
using ipupod::fuzz::Rng;
using nlohmann::json;

json arch_document(const ipupod::ipu::ArchPreset& p) {
  return {{"name", "fuzzed"},
          {"description", p.description},
          {"tiles", p.tiles},
          {"bytes_per_tile", p.bytes_per_tile},
          {"clock_hz", p.clock_hz},
          {"workers_per_tile", p.workers_per_tile},
          {"fp32_flops_per_cycle_per_tile", p.fp32_flops_per_cycle_per_tile},
          {"fp16_flops_per_cycle_per_tile", p.fp16_flops_per_cycle_per_tile},
          {"fp16_fp32_partials_flops_per_cycle_per_tile",
           p.fp16_fp32_partials_flops_per_cycle_per_tile},
          {"amp_pipeline_depth", p.amp_pipeline_depth},
          {"fp32_vector_width", p.fp32_vector_width},
          {"exchange_bytes_per_cycle_per_tile", p.exchange_bytes_per_cycle_per_tile},
          {"exchange_latency_cycles", p.exchange_latency_cycles},
          {"sync_cycles_internal", p.sync_cycles_internal},
          {"sync_cycles_external", p.sync_cycles_external},
          {"vertex_overhead_cycles", p.vertex_overhead_cycles},
          {"vertex_state_bytes_per_region", p.vertex_state_bytes_per_region},
          {"codelet_code_bytes", p.codelet_code_bytes},
          {"host_link_bytes_per_s", p.host_link_bytes_per_s},
          {"sources", p.sources}};
}

TEST(FuzzConfig, ArchitectureFilesLoadWithinBoundsOrAreRefusedWithAReason) {
  const ipupod::testing::TempDir dir;
  const std::vector<json> seeds = {
      arch_document(ipupod::ipu::ArchPreset::get("mk2")),
      {{"base", "tiny"}, {"name", "half"}, {"tiles", 16}},
      {{"base", "mk1"}, {"clock_hz", 1e9}, {"sources", {"a test"}}},
  };
  std::size_t accepted = 0;
  ipupod::fuzz::fuzz_loop("architecture files", 20000, 200, [&](std::size_t i, Rng& rng) {
    const json& base = seeds[pick(rng, seeds.size())];
    const std::string text =
        ipupod::fuzz::json_text(i < seeds.size() ? seeds[i] : ipupod::fuzz::mutate_json(base, rng),
                                seeds[pick(rng, seeds.size())].dump(), rng);
    // Loaded presets are kept by path for the process: every input gets its own name.
    const std::string path = dir.file("arch-" + std::to_string(i) + ".json");
    std::ofstream(path, std::ios::binary) << text;
    try {
      const ipupod::ipu::ArchPreset& p = ipupod::ipu::ArchPreset::get(path);
      ++accepted;
      EXPECT_GE(p.tiles, 1u);
      EXPECT_LE(p.tiles, 1u << 20);
      EXPECT_GE(p.bytes_per_tile, 1u);
      EXPECT_LE(p.bytes_per_tile, std::numeric_limits<std::uint32_t>::max());
      EXPECT_GE(p.workers_per_tile, 1u);
      EXPECT_GE(p.fp32_vector_width, 1u);
      for (double figure : {p.clock_hz, p.fp32_flops_per_cycle_per_tile,
                            p.exchange_bytes_per_cycle_per_tile, p.host_link_bytes_per_s})
        EXPECT_TRUE(std::isfinite(figure) && figure > 0) << figure;
      EXPECT_TRUE(std::isfinite(p.peak_fp32_flops()));
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_LT(std::string(e.what()).size(), 4096u)
          << "an unbounded message: " << std::string(e.what()).substr(0, 300);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not std::invalid_argument: " << e.what();
    }
    std::filesystem::remove(path);
  });
  if (!ipupod::fuzz::replaying()) {
    EXPECT_GE(accepted, seeds.size());
  }
}

TEST(FuzzConfig, TopologyFilesLoadWithinBoundsOrAreRefusedWithAReason) {
  const ipupod::testing::TempDir dir;
  const json link = {{"bandwidth_gbytes_per_s", 32}, {"latency_us", 1}, {"source", "test"}};
  const std::vector<json> seeds = {
      {{"name", "two-m2000"},
       {"pods", 1},
       {"machines_per_pod", 2},
       {"ipus_per_machine", 4},
       {"links", {{"within_machine", link}, {"between_machines", link}, {"between_pods", link}}},
       {"sync_us", {{"within_machine", 0.4}, {"within_pod", 1}, {"between_pods", 10}}},
       {"layout", "two machines"}},
      {{"base", "pod16"}, {"pods", 2}, {"machines_per_pod", 4}, {"ipus_per_machine", 4}},
      {{"base", "bow-pod64"},
       {"pods", 1},
       {"machines_per_pod", 1},
       {"ipus_per_machine", 2},
       {"links", {{"within_machine", {{"latency_us", 0}}}}},
       {"sync_us", {{"within_pod", 3}, {"source", "ours"}}}},
  };
  // A file whose base is a file (itself, here): the loader must not follow it forever.
  const std::string self = dir.file("self.json");
  std::ofstream(self)
      << json{{"base", self}, {"pods", 1}, {"machines_per_pod", 1}, {"ipus_per_machine", 1}}.dump();
  const auto check = [&](const std::string& text, const std::string& origin, bool from_file) {
    try {
      const ipupod::fabric::Topology topo =
          from_file ? ipupod::fabric::Topology::preset(origin)
                    : ipupod::fabric::Topology::from_json_text(text, origin);
      EXPECT_GE(topo.ipus(), 1);
      const int last = topo.ipus() - 1;
      std::vector<int> ring = {0, last};
      if (last == 0) ring.pop_back();
      EXPECT_TRUE(std::isfinite(ipupod::fabric::predict_all_reduce_seconds(topo, ring, 1 << 20)));
      EXPECT_TRUE(std::isfinite(ipupod::fabric::predict_barrier_seconds(topo, ring)));
    } catch (const ipupod::fabric::FabricError& e) {
      EXPECT_NE(std::string(e.what()).find(origin), std::string::npos) << e.what();
      EXPECT_LT(std::string(e.what()).size(), 4096u)
          << "an unbounded message: " << std::string(e.what()).substr(0, 300);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a FabricError: " << e.what();
    }
  };
  check("", self, true);
  ipupod::fuzz::fuzz_loop("topology files", 20000, 200, [&](std::size_t i, Rng& rng) {
    const json& base = seeds[pick(rng, seeds.size())];
    const std::string text =
        ipupod::fuzz::json_text(i < seeds.size() ? seeds[i] : ipupod::fuzz::mutate_json(base, rng),
                                seeds[pick(rng, seeds.size())].dump(), rng);
    check(text, "fuzz-" + std::to_string(i) + ".json", false);
  });
}

// The counts and reals of a run set to extreme values: validate() accepts only runs whose counts
// and products stay in range, and refuses the rest with UsageError.
TEST(FuzzConfig, TrainingConfigurationsValidateOrAreRefusedWithAReason) {
  ipupod::fuzz::fuzz_loop("train configurations", 50000, 0, [&](std::size_t, Rng& rng) {
    ipupod::pod::TrainConfig c;
    c.data = "data.h5";
    c.arch = "tiny";
    c.topology = "pod16";
    std::size_t* const counts[] = {
        &c.replicas,          &c.stages,           &c.micro_batch,    &c.gradient_accumulation,
        &c.device_iterations, &c.epochs,           &c.warmup_steps,   &c.shuffle_window,
        &c.trace_events,      &c.checkpoint_every, &c.checkpoint_keep};
    double* const reals[] = {&c.timeout_s,     &c.width,        &c.depth,
                             &c.learning_rate, &c.momentum,     &c.weight_decay,
                             &c.clip_norm,     &c.loss_scaling, &c.available_memory_proportion};
    static const double odd_reals[] = {0,
                                       -1,
                                       1e-300,
                                       0.5,
                                       1,
                                       1e300,
                                       std::numeric_limits<double>::infinity(),
                                       -std::numeric_limits<double>::infinity(),
                                       std::numeric_limits<double>::quiet_NaN()};
    const std::size_t changes = 1 + pick(rng, 4);
    for (std::size_t k = 0; k < changes; ++k) {
      if (pick(rng, 2) == 0) {
        *counts[pick(rng, std::size(counts))] = ipupod::fuzz::extreme_u64(rng);
      } else {
        *reals[pick(rng, std::size(reals))] = odd_reals[pick(rng, std::size(odd_reals))];
      }
    }
    if (pick(rng, 8) == 0) c.hidden = {ipupod::fuzz::extreme_u64(rng)};
    const int world =
        pick(rng, 4) == 0 ? static_cast<int>(rng()) : static_cast<int>(c.world_size());
    try {
      ipupod::pod::validate(c, world);
      EXPECT_EQ(static_cast<std::size_t>(world), c.world_size());
      EXPECT_LE(c.samples_per_replica_step() * c.replicas, ipupod::pod::kMaxCount);
      EXPECT_TRUE(std::isfinite(c.learning_rate) && c.learning_rate > 0);
      EXPECT_TRUE(std::isfinite(c.timeout_s) && c.timeout_s > 0);
    } catch (const ipupod::pod::UsageError& e) {
      EXPECT_GT(std::string(e.what()).size(), 10u);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a UsageError: " << e.what();
    }
  });
}

// A checkpoint's configuration record as a resume compares it with the run: any JSON at all is
// compared without a library exception, and what differs is listed in bounded text.
TEST(FuzzConfig, ResumeComparisonTakesAnyRecord) {
  ipupod::pod::TrainConfig c;
  c.data = "data.h5";
  const json seed = ipupod::pod::config_json(c);
  ipupod::fuzz::fuzz_loop("resume comparisons", 20000, 0, [&](std::size_t i, Rng& rng) {
    const std::string text =
        ipupod::fuzz::json_text(i == 0 ? seed : ipupod::fuzz::mutate_json(seed, rng), "{}", rng);
    const json saved = json::parse(text, nullptr, false);
    if (saved.is_discarded()) return;  // not JSON: load_resume refuses it before comparing
    try {
      const auto differences = ipupod::pod::resume_differences(c, saved);
      if (i == 0) {
        EXPECT_TRUE(differences.empty());
      }
      for (const std::string& d : differences) EXPECT_LT(d.size(), 4096u) << "an unbounded line";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "resume_differences threw: " << e.what();
    }
  });
}

// Settings added after checkpoints were first written hold their defaults in an older record:
// it resumes a run that leaves them so, and not one that sets them.
TEST(ResumeComparison, AnOlderRecordHoldsTheLaterSettingsDefaults) {
  ipupod::pod::TrainConfig c;
  c.data = "data.h5";
  json older = ipupod::pod::config_json(c);
  older.erase("split_at");
  older.erase("shuffle_window");
  EXPECT_TRUE(ipupod::pod::resume_differences(c, older).empty());
  c.split_at = {"layer3"};
  c.shuffle_window = 64;
  const auto differences = ipupod::pod::resume_differences(c, older);
  ASSERT_EQ(differences.size(), 2u);
  EXPECT_EQ(differences[0], "split_at: checkpoint [], this run [\"layer3\"]");
  EXPECT_EQ(differences[1], "shuffle_window: checkpoint 0, this run 64");
}

}  // namespace

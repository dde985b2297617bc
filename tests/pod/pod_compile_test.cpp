// `ipupod compile`: every pipeline stage compiled on its own IPU reports its memory, whether it
// fits, and, when it does not, the worst tiles and advice; also the command itself.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ipu_process/arch.hpp"
#include "models/zoo.hpp"
#include "pod/compiler/stage_compile.hpp"
#include "tests/host/temp_dir.hpp"
#include "tests/pod/run_command.hpp"

namespace ipupod::pod {
namespace {

CompileConfig cnn(std::size_t stages, const std::string& arch) {
  CompileConfig c;
  c.train.model = "cnn";
  c.train.stages = stages;
  c.train.gradient_accumulation = stages;
  c.train.micro_batch = 2;
  c.train.arch = arch;
  c.sample_shape = {1, 8, 8};
  return c;
}

TEST(Compile, EachStageOfATwoStageCnnReportsItsMemoryAndFitsAnMk2) {
  const CompileConfig c = cnn(2, "mk2");
  ASSERT_NO_THROW(validate(c));
  std::vector<nlohmann::json> stages;
  for (std::size_t s = 0; s < 2; ++s) stages.push_back(compile_stage(c, s));
  // Split marks: the two convolution blocks on stage 0, the classifier head on stage 1.
  EXPECT_EQ(stages[0].at("layers").at("first"), "features0.conv");
  EXPECT_EQ(stages[0].at("layers").at("last"), "features1.bn");
  EXPECT_EQ(stages[1].at("layers").at("first"), "fc1");
  EXPECT_EQ(stages[1].at("layers").at("last"), "fc2");
  models::ModelOptions o;
  o.micro_batch = 2;
  o.sample_shape = {1, 8, 8};
  EXPECT_EQ(stages[0].at("layers").at("parameters").get<std::size_t>() +
                stages[1].at("layers").at("parameters").get<std::size_t>(),
            models::build_model("cnn", o).parameter_count());
  const auto& mk2 = ipu::ArchPreset::get("mk2");
  for (std::size_t s = 0; s < 2; ++s) {
    const auto& r = stages[s];
    EXPECT_EQ(r.at("stage"), s);
    EXPECT_TRUE(r.at("fits").get<bool>());
    EXPECT_EQ(r.at("tiles_over_capacity"), 0u);
    EXPECT_EQ(r.at("per_tile").size(), mk2.tiles);
    EXPECT_GT(r.at("total_bytes").get<std::size_t>(), 0u);
    EXPECT_LE(r.at("busiest_tile_bytes").get<std::size_t>(), mk2.bytes_per_tile);
  }
  // The grouped pipeline stashes the first stage's activations for 2 (S - 1 - s) + 1 slots.
  EXPECT_EQ(stages[0].at("stash_slots"), 3u);
  EXPECT_GT(stages[0].at("stash_bytes").get<std::size_t>(), 0u);
  EXPECT_EQ(stages[1].at("stash_slots"), 1u);
  EXPECT_EQ(stages[1].at("stash_bytes"), 0u);
  std::ostringstream report;
  print_compile_report(c, stages, report);
  EXPECT_NE(report.str().find("Every stage fits."), std::string::npos) << report.str();
}

TEST(Compile, ATooSmallArchitectureReportsNoFitWithTheWorstTilesAndAdvice) {
  const ipupod::testing::TempDir tmp;
  const std::filesystem::path arch = tmp.path() / "small.json";
  std::ofstream(arch) << R"({"base": "tiny", "name": "small", "tiles": 8, "bytes_per_tile": 8192})";
  const CompileConfig c = cnn(2, arch.string());
  const nlohmann::json r = compile_stage(c, 0);
  EXPECT_FALSE(r.at("fits").get<bool>());
  EXPECT_GT(r.at("tiles_over_capacity").get<std::size_t>(), 0u);
  EXPECT_GT(r.at("busiest_tile_bytes").get<std::size_t>(), 8192u);
  std::ostringstream report;
  print_compile_report(c, {r}, report);
  const std::string text = report.str();
  EXPECT_NE(text.find("Stage 0 does not fit"), std::string::npos) << text;
  const std::string worst = "tile " + std::to_string(r.at("busiest_tile").get<unsigned>()) + ": ";
  EXPECT_NE(text.find(worst), std::string::npos) << text;
  EXPECT_NE(text.find("live at its busiest step: activation "), std::string::npos) << text;
  EXPECT_NE(text.find("the largest then: '"), std::string::npos) << text;
  // What is live at the peak is part of the tile's bytes, not more.
  const auto& busiest = r.at("per_tile").at(r.at("busiest_tile").get<std::size_t>());
  std::size_t at_peak = 0;
  for (const auto& [category, bytes] : busiest.at("peak_by_category").items())
    at_peak += bytes.get<std::size_t>();
  EXPECT_GT(at_peak, 0u);
  EXPECT_LE(at_peak, busiest.at("always_live").get<std::size_t>() +
                         busiest.at("peak_live").get<std::size_t>());
  EXPECT_NE(text.find("Advice: the stage needs"), std::string::npos) << text;
  EXPECT_NE(text.find("activation stash slots"), std::string::npos) << text;
  EXPECT_NE(text.find("--recompute stashes only"), std::string::npos) << text;
}

TEST(Compile, MoreStagesThanTheModelSplitsIntoIsAUsageError) {
  try {
    validate(cnn(4, "mk2"));
    FAIL() << "expected a usage error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 3 pipeline stages"), std::string::npos)
        << e.what();
  }
  CompileConfig grouped = cnn(2, "mk2");
  grouped.train.gradient_accumulation = 1;
  EXPECT_THROW(validate(grouped), UsageError);
}

// The command: one process compiles every stage, or one rank per stage under mpiexec; both
// write the same verdicts and exit 1 when a stage does not fit.
TEST(CompileCommand, WritesMemoryReportsAndExitsOneWhenAStageDoesNotFit) {
  const ipupod::testing::TempDir tmp;
  const std::filesystem::path dir = tmp.path() / "run";
  for (const std::string& launcher :
       {std::string(),
        std::string(IPUPOD_MPIEXEC) + " -n 2 --oversubscribe --allow-run-as-root "}) {
    std::filesystem::remove_all(dir);
    const auto r = testing_support::run(launcher + IPUPOD_BINARY +
                                            " compile --model cnn --stages 2 --arch tiny "
                                            "--micro-batch 2 --run-dir " +
                                            dir.string(),
                                        300);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;
    std::ifstream in(dir / "memory.json");
    ASSERT_TRUE(in) << r.output;
    const nlohmann::json memory = nlohmann::json::parse(in);
    ASSERT_EQ(memory.size(), 2u);
    for (std::size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(memory[s].at("stage"), s);
      EXPECT_FALSE(memory[s].at("fits").get<bool>());
    }
    std::ifstream summary(dir / "compile.json");
    ASSERT_TRUE(summary);
    EXPECT_FALSE(nlohmann::json::parse(summary).at("fits").get<bool>());
  }
  // --stage compiles just the stages asked for.
  std::filesystem::remove_all(dir);
  const auto one = testing_support::run(std::string(IPUPOD_BINARY) +
                                            " compile --model cnn --stages 2 --arch mk2 "
                                            "--micro-batch 2 --stage 1 --run-dir " +
                                            dir.string(),
                                        300);
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("Every stage fits."), std::string::npos) << one.output;
  std::ifstream in(dir / "memory.json");
  ASSERT_TRUE(in) << one.output;
  const nlohmann::json memory = nlohmann::json::parse(in);
  ASSERT_EQ(memory.size(), 1u);
  EXPECT_EQ(memory[0].at("stage"), 1u);
  // The graph section counts vertices and their vertex-state regions (at most the regions
  // connected) per codelet: the same codelets in both maps, the per-codelet sums equal to the
  // totals, the busiest tile's share within
  // the whole and present for at least one codelet.
  const nlohmann::json& graph = memory[0].at("graph");
  const nlohmann::json& by_vertex = graph.at("vertices_by_codelet");
  const nlohmann::json& by_region = graph.at("regions_by_codelet");
  ASSERT_EQ(by_vertex.size(), by_region.size());
  std::size_t vertices = 0, regions = 0, busiest = 0;
  for (const auto& [name, count] : by_vertex.items()) {
    ASSERT_TRUE(by_region.contains(name)) << name;
    const auto& r = by_region.at(name);
    vertices += count.get<std::size_t>();
    regions += r.at("all_tiles").get<std::size_t>();
    busiest += r.at("busiest_tile").get<std::size_t>();
    EXPECT_LE(r.at("busiest_tile").get<std::size_t>(), r.at("all_tiles").get<std::size_t>());
  }
  EXPECT_EQ(vertices, graph.at("vertices").get<std::size_t>());
  EXPECT_EQ(regions, graph.at("state_regions").get<std::size_t>());
  EXPECT_LT(regions, graph.at("regions").get<std::size_t>()) << "worker slices share runs";
  EXPECT_GT(busiest, 0u);
  EXPECT_LT(busiest, regions);
  std::filesystem::remove_all(dir);
}

}  // namespace
// `ipupod info --json`: what scripts (ipupod-run) read instead of --help text. The figures come
// from the presets themselves, so the test checks the structure against them and the layout of
// a pod16 (4 IPU-M2000s of 4 IPUs).
TEST(InfoCommand, JsonHoldsPresetsTopologiesModelsAndOptionDefaults) {
  const testing_support::Result r =
      testing_support::run(std::string(IPUPOD_BINARY) + " info --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json info = nlohmann::json::parse(r.output);
  const ipu::ArchPreset& mk2 = ipu::ArchPreset::get("mk2");
  EXPECT_EQ(info["architectures"]["mk2"]["tiles"], mk2.tiles);
  EXPECT_EQ(info["architectures"]["mk2"]["bytes_per_tile"], mk2.bytes_per_tile);
  EXPECT_EQ(info["architectures"]["mk2"]["sources"].size(), mk2.sources.size());
  const nlohmann::json& pod16 = info["topologies"]["pod16"];
  EXPECT_EQ(pod16["ipus"], 16);
  ASSERT_EQ(pod16["machines"].size(), 4u);
  EXPECT_EQ(pod16["machines"][1],
            (nlohmann::json{{"pod", 0}, {"machine", 1}, {"first_ipu", 4}, {"last_ipu", 7}}));
  EXPECT_TRUE(info["models"].contains("efficientnetv2_s"));
  EXPECT_EQ(info["models"].size(), models::zoo().size());
  EXPECT_EQ(info["defaults"]["train"]["topology"], "pod16");
  EXPECT_EQ(info["defaults"]["train"]["micro-batch"], "16");
  EXPECT_TRUE(info["defaults"]["estimate"].contains("replicas"));
  const testing_support::Result one =
      testing_support::run(std::string(IPUPOD_BINARY) + " info --json --topology pod64");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(nlohmann::json::parse(one.output)["topology"]["machines"].size(), 16u);
  const testing_support::Result unknown =
      testing_support::run(std::string(IPUPOD_BINARY) + " info --json --topology pod17");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
}

}  // namespace ipupod::pod

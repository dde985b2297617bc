// Topology presets (where IPUs sit, which links join them) and the collective cost model.
#include "fabric/topology.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace ipupod::fabric {
namespace {

TEST(Topology, Pod16HasFourMachinesOfFourIpus) {
  const Topology pod16 = Topology::preset("pod16");
  EXPECT_EQ(pod16.name(), "pod16");
  EXPECT_EQ(pod16.ipus(), 16);
  const IpuLocation last = pod16.location(15);
  EXPECT_EQ(last.pod, 0);
  EXPECT_EQ(last.machine, 3);
  EXPECT_EQ(last.ipu, 3);
  const IpuLocation fifth = pod16.location(5);
  EXPECT_EQ(fifth.machine, 1);
  EXPECT_EQ(fifth.ipu, 1);
  EXPECT_THROW(pod16.location(16), FabricError);
  EXPECT_THROW(pod16.location(-1), FabricError);
}

TEST(Topology, M2000HasFourIpusInOneMachine) {
  const Topology m2000 = Topology::preset("m2000");
  EXPECT_EQ(m2000.ipus(), 4);
  EXPECT_EQ(m2000.location(3).machine, 0);
}

TEST(Topology, LinkClassesFollowMachineAndPodBoundaries) {
  const Topology pod16 = Topology::preset("pod16");
  const LinkClass& inside = pod16.link(0, 1);
  const LinkClass& across = pod16.link(3, 4);
  EXPECT_NE(inside.name.find("within machine"), std::string::npos);
  EXPECT_NE(across.name.find("between machines"), std::string::npos);
  EXPECT_EQ(&pod16.link(1, 0), &inside);
  EXPECT_THROW(pod16.link(2, 2), FabricError);
  EXPECT_THROW(pod16.link(0, 16), FabricError);
  for (const LinkClass& link : pod16.link_classes()) {
    EXPECT_GT(link.bandwidth_bytes_per_s, 0.0);
    EXPECT_FALSE(link.source.empty()) << link.name << " has no source for its numbers";
  }

  const Topology pod128 = Topology::preset("pod128");
  EXPECT_EQ(pod128.ipus(), 128);
  EXPECT_EQ(pod128.location(64).pod, 1);
  EXPECT_NE(pod128.link(0, 64).name.find("GW-Link"), std::string::npos);
}

TEST(Topology, UnknownPresetListsTheKnownOnes) {
  try {
    Topology::preset("pod7");
    FAIL() << "expected FabricError";
  } catch (const FabricError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("pod7"), std::string::npos) << text;
    for (const std::string& name : Topology::preset_names()) {
      EXPECT_NE(text.find(name), std::string::npos) << text;
    }
  }
}

TEST(Topology, DescribeListsMachinesAndLinkSources) {
  const std::string text = Topology::preset("pod16").describe();
  EXPECT_NE(text.find("16 IPUs"), std::string::npos) << text;
  EXPECT_NE(text.find("12..15"), std::string::npos) << text;
  EXPECT_NE(text.find("GW-Link"), std::string::npos) << text;
}

TEST(CostModel, AllReduceTimeGrowsWithBytes) {
  const Topology pod16 = Topology::preset("pod16");
  const std::vector<int> ring{0, 1, 2, 3};
  const double small = predict_all_reduce_seconds(pod16, ring, 1 << 10);
  const double large = predict_all_reduce_seconds(pod16, ring, 1 << 24);
  EXPECT_GT(small, 0.0);
  EXPECT_GT(large, small);
  EXPECT_EQ(predict_all_reduce_seconds(pod16, ring, 0), 0.0);
  EXPECT_EQ(predict_all_reduce_seconds(pod16, std::vector<int>{5}, 1 << 20), 0.0);
}

TEST(CostModel, AllReduceFollowsTheRingFormula) {
  const Topology m2000 = Topology::preset("m2000");
  const std::vector<int> ring{0, 1, 2, 3};
  const LinkClass& link = m2000.link(0, 1);
  const double bytes = 4.0e6;
  const double expected = 2.0 * 3.0 * (link.latency_s + bytes / 4.0 / link.bandwidth_bytes_per_s);
  EXPECT_DOUBLE_EQ(predict_all_reduce_seconds(m2000, ring, 4000000), expected);
}

TEST(CostModel, GwLinkInTheRingSlowsTheAllReduce) {
  const Topology pod128 = Topology::preset("pod128");
  const std::vector<int> within_pod{0, 4, 8, 12};
  const std::vector<int> across_pods{0, 4, 64, 68};
  const std::size_t bytes = 100 << 20;
  EXPECT_GT(predict_all_reduce_seconds(pod128, across_pods, bytes),
            predict_all_reduce_seconds(pod128, within_pod, bytes));
  EXPECT_GT(predict_barrier_seconds(pod128, across_pods),
            predict_barrier_seconds(pod128, within_pod));
}

TEST(CostModel, RejectsRepeatedOrUnknownIpus) {
  const Topology pod16 = Topology::preset("pod16");
  EXPECT_THROW(predict_all_reduce_seconds(pod16, std::vector<int>{0, 1, 0}, 8), FabricError);
  EXPECT_THROW(predict_barrier_seconds(pod16, std::vector<int>{0, 99}), FabricError);
}

}  // namespace
}  // namespace ipupod::fabric

namespace ipupod::fabric {
namespace {

TEST(Topology, Pod256AndBowPresets) {
  const Topology pod256 = Topology::preset("pod256");
  EXPECT_EQ(pod256.ipus(), 256);
  EXPECT_EQ(pod256.pods(), 4);
  EXPECT_NE(pod256.link(0, 192).name.find("GW-Link"), std::string::npos);
  for (const char* name : {"bow-2000", "bow-pod16", "bow-pod64", "bow-pod128", "bow-pod256"}) {
    const Topology bow = Topology::preset(name);
    const std::string mk2_name =
        std::string(name) == "bow-2000" ? "m2000" : std::string(name).substr(4);
    const Topology mk2 = Topology::preset(mk2_name);
    EXPECT_EQ(bow.ipus(), mk2.ipus()) << name;
    EXPECT_NE(bow.link_classes().front().source.find("Bow"), std::string::npos) << name;
    // 500 sync cycles at the faster Bow clock.
    EXPECT_LT(bow.sync().within_machine_s, mk2.sync().within_machine_s) << name;
  }
  const std::vector<std::string> names = Topology::preset_names();
  EXPECT_EQ(names.size(), 10U);
}

TEST(Topology, SyncCostGrowsWithTheScopeOfTheGroup) {
  const Topology pod128 = Topology::preset("pod128");
  const double one_machine = predict_barrier_seconds(pod128, std::vector<int>{0, 1, 2, 3});
  const double machines = predict_barrier_seconds(pod128, std::vector<int>{0, 4});
  const double pods = predict_barrier_seconds(pod128, std::vector<int>{0, 64});
  EXPECT_GT(one_machine, 0.0);
  EXPECT_LT(one_machine, machines);
  EXPECT_LT(machines, pods);
  EXPECT_EQ(predict_barrier_seconds(pod128, std::vector<int>{7}), 0.0);
  // 500 cycles at 1.33 GHz (REFERENCES.md).
  EXPECT_NEAR(one_machine, 500.0 / 1.33e9, 1e-12);
  EXPECT_NE(pod128.describe().find("Cross-IPU sync"), std::string::npos);
}

TEST(TopologyFile, TheExampleFileLoadsByPathLikeAPreset) {
  const char* source_dir = std::getenv("IPUPOD_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "ctest sets IPUPOD_SOURCE_DIR";
  const Topology topo =
      Topology::preset(std::string(source_dir) + "/fabric/topologies/two_m2000.json");
  EXPECT_EQ(topo.name(), "two-m2000");
  EXPECT_EQ(topo.ipus(), 8);
  EXPECT_EQ(topo.machines_per_pod(), 2);
  EXPECT_DOUBLE_EQ(topo.link(3, 4).bandwidth_bytes_per_s, 32e9);
  EXPECT_DOUBLE_EQ(topo.link(3, 4).latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(topo.sync().within_pod_s, 0.376e-6);
  EXPECT_NE(topo.describe().find("example of a user topology"), std::string::npos);
}

TEST(TopologyFile, BaseGivesDefaultsAndFieldsOverrideThem) {
  const Topology topo = Topology::from_json_text(
      R"({"base": "bow-pod16", "pods": 1, "machines_per_pod": 3, "ipus_per_machine": 2,
          "links": {"between_machines": {"bandwidth_gbytes_per_s": 8, "latency_us": 5}}})",
      "inline");
  EXPECT_EQ(topo.name(), "inline");
  EXPECT_EQ(topo.ipus(), 6);
  EXPECT_DOUBLE_EQ(topo.link(0, 2).bandwidth_bytes_per_s, 8e9);
  EXPECT_DOUBLE_EQ(topo.link(0, 2).latency_s, 5e-6);
  EXPECT_EQ(topo.link(0, 2).source, "user topology file inline");
  EXPECT_EQ(topo.link(0, 1).bandwidth_bytes_per_s,
            Topology::preset("bow-pod16").link(0, 1).bandwidth_bytes_per_s);
  EXPECT_EQ(topo.sync().within_machine_s, Topology::preset("bow-pod16").sync().within_machine_s);
}

void expect_file_error(const std::string& text, const std::string& needle) {
  try {
    Topology::from_json_text(text, "bad.json");
    ADD_FAILURE() << "expected FabricError for " << text;
  } catch (const FabricError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("bad.json"), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
}

TEST(TopologyFile, ErrorsNameTheFileAndTheKey) {
  expect_file_error("{not json", "not valid JSON");
  expect_file_error("[1, 2]", "JSON object");
  expect_file_error(R"({"base": "m2000", "pods": 1, "machines_per_pod": 1, "ipus_per_machine": 4,
                        "ipus_per_machin": 4})",
                    "unknown key 'ipus_per_machin'");
  expect_file_error(R"({"base": "m2000", "machines_per_pod": 1, "ipus_per_machine": 4})", "pods");
  expect_file_error(R"({"base": "m2000", "pods": "one", "machines_per_pod": 1,
                        "ipus_per_machine": 4})",
                    "pods must be a whole number");
  expect_file_error(R"({"pods": 1, "machines_per_pod": 1, "ipus_per_machine": 4})",
                    "links is missing");
  expect_file_error(R"({"base": "m2000", "pods": 1, "machines_per_pod": 1, "ipus_per_machine": 4,
                        "links": {"within_machine": {"bandwidth_gbytes_per_s": -1}}})",
                    "links.within_machine.bandwidth_gbytes_per_s must be a finite number >= 0");
  expect_file_error(R"({"base": "m2000", "pods": 1, "machines_per_pod": 1, "ipus_per_machine": 4,
                        "links": {"within_machine": {"latency_us": "slow"}}})",
                    "links.within_machine.latency_us must be a finite number");
  EXPECT_THROW(Topology::preset("no/such/topology.json"), FabricError);
  EXPECT_THROW(Topology::from_json_file("no/such/topology.json"), FabricError);
}

// Every field is checked for type, sign and range before it is converted: a count past int
// used to wrap (2^32 + 1 pods read as 1), a product of counts to overflow, a string field of
// another type to fail with the JSON library's message naming no field.
TEST(TopologyFile, FieldsAreCheckedForTypeSignAndRange) {
  const auto with = [](const std::string& fields) {
    return R"({"base": "m2000", )" + fields + "}";
  };
  const std::string one_machine = R"("pods": 1, "machines_per_pod": 1, "ipus_per_machine": 4)";
  expect_file_error(with(R"("pods": 4294967297, "machines_per_pod": 1, "ipus_per_machine": 4)"),
                    "pods must be a whole number in [1, 65536], got 4294967297");
  expect_file_error(with(R"("pods": 1, "machines_per_pod": -1, "ipus_per_machine": 4)"),
                    "machines_per_pod must be a whole number in [1, 65536], got -1");
  expect_file_error(
      with(R"("pods": 1, "machines_per_pod": 1, "ipus_per_machine": 18446744073709551615)"),
      "ipus_per_machine must be a whole number");
  expect_file_error(with(R"("pods": 1, "machines_per_pod": 1, "ipus_per_machine": 4.5)"),
                    "ipus_per_machine must be a whole number");
  expect_file_error(with(R"("pods": 65536, "machines_per_pod": 65536, "ipus_per_machine": 2)"),
                    "65536 pods x 65536 machines x 2 IPUs is more IPUs than");
  expect_file_error(with(one_machine + R"(, "name": 5)"), "name must be a string, got 5");
  expect_file_error(R"({"base": 7, )" + one_machine + "}", "base must be a string, got 7");
  expect_file_error(with(one_machine + R"(, "layout": ["a"])"), "layout must be a string");
  expect_file_error(with(one_machine + R"(, "links": {"within_machine": {"name": 1}})"),
                    "links.within_machine.name must be a string");
  expect_file_error(
      with(one_machine + R"(, "links": {"between_pods": {"bandwidth_gbytes_per_s": 1e300}})"),
      "needs a finite bandwidth");
  // A bandwidth of 0 passes the field's check and fails the topology's: the file is still named
  // (not only the topology's "name").
  expect_file_error(with(one_machine + R"(, "name": "mine",
                         "links": {"within_machine": {"bandwidth_gbytes_per_s": 0}})"),
                    "needs a finite bandwidth");
  // The base is a built-in preset: a file as the base (here the file itself) was followed until
  // the stack overflowed.
  expect_file_error(R"({"base": "bad.json", )" + one_machine + "}",
                    "base 'bad.json' is not a built-in preset");
  expect_file_error(with(one_machine + R"(, "sync_us": {"within_pod": -2})"),
                    "sync_us.within_pod must be a finite number >= 0, got -2");
  expect_file_error(with(one_machine + R"(, "sync_us": {"source": false})"),
                    "sync_us.source must be a string");
}

}  // namespace
TEST(TopologyPresets, EveryLinkAndSyncNamesItsSourceAndNoneIsAssumed) {
  for (const std::string& name : Topology::preset_names()) {
    const Topology t = Topology::preset(name);
    for (const LinkClass* link :
         {&t.spec().within_machine, &t.spec().between_machines, &t.spec().between_pods}) {
      EXPECT_FALSE(link->source.empty()) << name << ": " << link->name;
      EXPECT_EQ(link->source.find("assumed"), std::string::npos) << name << ": " << link->source;
    }
    EXPECT_FALSE(t.sync().source.empty()) << name;
    EXPECT_EQ(t.sync().source.find("assumed"), std::string::npos)
        << name << ": " << t.sync().source;
    // A wider scope never syncs faster.
    EXPECT_LE(t.sync().within_machine_s, t.sync().within_pod_s) << name;
    EXPECT_LE(t.sync().within_pod_s, t.sync().between_pods_s) << name;
  }
}

}  // namespace ipupod::fabric

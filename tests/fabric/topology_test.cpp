// Topology presets (where IPUs sit, which links join them) and the collective cost model.
#include "fabric/topology.hpp"

#include <gtest/gtest.h>

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

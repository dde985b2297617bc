// The shared collective cases over the loopback fabric: one thread per participant, for
// participant counts 1, 2, 3, 4 and 8; hierarchical plans on placements of real topologies;
// collectives over subsets of the participants; reports and algorithm choice.
#include <gtest/gtest.h>

#include <string>

#include "collective_cases.hpp"
#include "fabric/loopback_transport.hpp"
#include "fabric/subset_transport.hpp"

namespace ipupod::fabric::testing {
namespace {

constexpr int kParticipantCounts[] = {1, 2, 3, 4, 8};
constexpr std::size_t kLengths[] = {0, 1, 3, 1000, 65543};

class LoopbackCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LoopbackCollectives, EveryCollectiveMatchesTheDocumentedOrderBitwise) {
  run_on_loopback(GetParam(), [](Transport& t) { check_every_collective(t, kLengths); });
}

TEST_P(LoopbackCollectives, ManyMegabyteAllReduceWithDefaultSegments) {
  if (GetParam() != 3 && GetParam() != 8) {
    GTEST_SKIP() << "run at 3 and 8 participants only, to keep the suite fast";
  }
  run_on_loopback(GetParam(), [](Transport& t) {
    CaseOptions ring;
    ring.collective.algorithm = Algorithm::ring;
    check_all_reduce(t, std::size_t{1} << 20, ReduceOp::sum, ring);
    CaseOptions bidirectional;
    bidirectional.type = DataType::float16;
    bidirectional.collective.algorithm = Algorithm::bidirectional_ring;
    check_all_reduce(t, (std::size_t{1} << 20) + 5, ReduceOp::mean, bidirectional);
  });
}

TEST_P(LoopbackCollectives, BroadcastFromNonZeroRootByTreeAndRing) {
  for (Algorithm algorithm : {Algorithm::tree, Algorithm::ring, Algorithm::automatic}) {
    run_on_loopback(GetParam(), [&](Transport& t) { check_broadcast(t, t.size() - 1, algorithm); });
    run_on_loopback(GetParam(), [&](Transport& t) { check_broadcast(t, 1, algorithm); });
  }
}

TEST_P(LoopbackCollectives, Barrier) {
  run_on_loopback(GetParam(), [](Transport& t) { check_barrier(t); });
}

TEST_P(LoopbackCollectives, RepeatedAllReduceIsBitwiseReproducible) {
  for (Algorithm algorithm : {Algorithm::ring, Algorithm::bidirectional_ring}) {
    std::vector<std::vector<float>> first(GetParam());
    std::vector<std::vector<float>> second(GetParam());
    for (auto* results : {&first, &second}) {
      run_on_loopback(GetParam(), [&](Transport& t) {
        std::vector<float> data(7777);
        for (std::size_t i = 0; i < data.size(); ++i) data[i] = input_value(t.rank(), i);
        CollectiveOptions options;
        options.algorithm = algorithm;
        options.segment_bytes = 1024;
        all_reduce(t, data, ReduceOp::sum, options);
        (*results)[static_cast<std::size_t>(t.rank())] = data;
      });
    }
    EXPECT_EQ(first, second) << to_string(algorithm);
    for (const auto& rank_result : first) EXPECT_EQ(rank_result, first.front());
  }
}

INSTANTIATE_TEST_SUITE_P(Participants, LoopbackCollectives, ::testing::ValuesIn(kParticipantCounts),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// Hierarchical all-reduce of every op and type on `ipus` of `topo`; `stages` is the plan the
// placement must give (machines, then machines of a pod, then pods).
void check_hierarchical(const Topology& topo, const std::vector<int>& ipus,
                        const std::vector<Rings>& stages) {
  run_on_loopback(static_cast<int>(ipus.size()), [&](Transport& t) {
    for (DataType type : {DataType::float32, DataType::float16}) {
      CaseOptions options;
      options.type = type;
      options.collective.algorithm = Algorithm::hierarchical;
      options.collective.topology = &topo;
      options.collective.ipus = ipus;
      options.collective.segment_bytes = 1024;
      options.stages = stages;
      for (std::size_t length : {0, 1, 3, 1000, 20011}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
          check_all_reduce(t, length, op, options);
        }
      }
    }
  });
}

TEST(LoopbackHierarchical, TwoMachinesOfFourOnAPod16) {
  check_hierarchical(Topology::preset("pod16"), {0, 1, 2, 3, 4, 5, 6, 7},
                     {Rings{{0, 1, 2, 3}, {4, 5, 6, 7}}, Rings{{0, 4}, {1, 5}, {2, 6}, {3, 7}}});
}

TEST(LoopbackHierarchical, RanksPlacedOutOfOrderFollowTheirIpus) {
  // Rank 0 on IPU 5, rank 1 on IPU 0, rank 2 on IPU 4, rank 3 on IPU 1.
  check_hierarchical(Topology::preset("pod16"), {5, 0, 4, 1},
                     {Rings{{1, 3}, {2, 0}}, Rings{{1, 2}, {3, 0}}});
}

TEST(LoopbackHierarchical, ThreeLevelsOnAUserTopologyOfTwoPods) {
  const Topology topo = Topology::from_json_text(
      R"({"name": "tiny-pods", "base": "pod128", "pods": 2, "machines_per_pod": 2,
          "ipus_per_machine": 2})",
      "test");
  check_hierarchical(topo, {0, 1, 2, 3, 4, 5, 6, 7},
                     {Rings{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, Rings{{0, 2}, {1, 3}, {4, 6}, {5, 7}},
                      Rings{{0, 4}, {1, 5}, {2, 6}, {3, 7}}});
}

TEST(LoopbackHierarchical, UnevenMachinesAreRejectedWhenForcedAndAvoidedWhenAutomatic) {
  const Topology pod16 = Topology::preset("pod16");
  run_on_loopback(3, [&](Transport& t) {
    std::vector<float> data(100, 1.0F);
    CollectiveOptions options;
    options.topology = &pod16;
    options.ipus = {0, 1, 4};  // two IPUs on machine 0, one on machine 1
    options.algorithm = Algorithm::hierarchical;
    EXPECT_THROW(all_reduce(t, data, ReduceOp::sum, options), FabricError);
    options.algorithm = Algorithm::automatic;
    const CollectiveReport report = all_reduce(t, data, ReduceOp::sum, options);
    EXPECT_NE(report.algorithm, Algorithm::hierarchical);
    EXPECT_EQ(data, std::vector<float>(100, 3.0F));
  });
}

TEST(LoopbackSubsets, DisjointGroupsRunEveryCollectiveAtTheSameTime) {
  // Like the stage groups of a pipeline-parallel job: groups of 4, 3 (in a scrambled order)
  // and 1 participant out of 8, all busy at once on one fabric.
  const std::vector<std::vector<int>> groups{{0, 2, 4, 6}, {7, 3, 5}, {1}};
  run_on_loopback(8, [&](Transport& parent) {
    for (const auto& members : groups) {
      if (std::find(members.begin(), members.end(), parent.rank()) == members.end()) continue;
      SubsetTransport group(parent, members);
      EXPECT_EQ(group.size(), static_cast<int>(members.size()));
      const std::size_t lengths[] = {1, 1000};
      check_every_collective(group, lengths);
      check_broadcast(group, 1, Algorithm::ring);
      barrier(group);

      // The sum of parent ranks shows the groups did not mix.
      std::vector<float> ranks{static_cast<float>(parent.rank())};
      all_reduce(group, ranks, ReduceOp::sum);
      float expected = 0.0F;
      for (int member : members) expected += static_cast<float>(member);
      EXPECT_EQ(ranks[0], expected);
    }
  });
}

TEST(LoopbackSubsets, RejectsNonMembersAndBadMembers) {
  LoopbackFabric fabric(4);
  EXPECT_THROW(SubsetTransport(fabric.endpoint(0), {1, 2}), FabricError);
  EXPECT_THROW(SubsetTransport(fabric.endpoint(0), {0, 4}), FabricError);
  EXPECT_THROW(SubsetTransport(fabric.endpoint(0), {0, 1, 0}), FabricError);
  SubsetTransport group(fabric.endpoint(2), {3, 2});
  EXPECT_EQ(group.rank(), 1);
  EXPECT_EQ(group.size(), 2);
}

TEST(CollectiveReports, EveryCollectiveReportsItsPredictionAndAdvancesTheModelClock) {
  const Topology pod16 = Topology::preset("pod16");
  run_on_loopback(4, [&](Transport& t) {
    CollectiveOptions options;
    options.topology = &pod16;
    options.ipus = {0, 1, 4, 5};
    const std::size_t length = 1 << 16;
    std::vector<float> data(length, 1.0F);
    std::vector<float> block(ring_chunk(length, 4, t.rank()).size());
    std::vector<std::byte> bytes(4096);

    double expected_clock = 0.0;
    const auto expect_report = [&](const CollectiveReport& report, Collective collective,
                                   std::size_t elements, DataType type) {
      const CollectiveReport predicted = predict(collective, type, elements, 4, options);
      EXPECT_EQ(report.collective, collective);
      EXPECT_EQ(report.participants, 4);
      EXPECT_EQ(report.algorithm, predicted.algorithm) << to_string(collective);
      EXPECT_NE(report.algorithm, Algorithm::automatic);
      EXPECT_GT(report.predicted_seconds, 0.0) << to_string(collective);
      EXPECT_EQ(report.predicted_seconds, predicted.predicted_seconds) << to_string(collective);
      expected_clock += report.predicted_seconds;
      EXPECT_EQ(t.model_seconds(), expected_clock);
    };
    expect_report(all_reduce(t, data, ReduceOp::sum, options), Collective::all_reduce, length,
                  DataType::float32);
    expect_report(reduce_scatter(t, data, block, ReduceOp::sum, options),
                  Collective::reduce_scatter, length, DataType::float32);
    expect_report(all_gather(t, block, data, options), Collective::all_gather, length,
                  DataType::float32);
    expect_report(broadcast(t, bytes, 0, options), Collective::broadcast, bytes.size(),
                  DataType::float32);
    expect_report(barrier(t, options), Collective::barrier, 0, DataType::float32);

    // Without a topology nothing is predicted.
    const CollectiveReport plain = all_reduce(t, data, ReduceOp::sum);
    EXPECT_EQ(plain.predicted_seconds, 0.0);
    EXPECT_EQ(plain.bytes, length * sizeof(float));
  });
}

TEST(CollectiveReports, Float16TravelsAsFloat32WhileReducingAndAsFloat16WhileGathering) {
  const Topology m2000 = Topology::preset("m2000");
  CollectiveOptions options;
  options.topology = &m2000;
  options.algorithm = Algorithm::ring;
  const std::size_t length = 1 << 20;
  const auto f32 = predict(Collective::reduce_scatter, DataType::float32, length, 4, options);
  const auto f16 = predict(Collective::reduce_scatter, DataType::float16, length, 4, options);
  EXPECT_EQ(f16.predicted_seconds, f32.predicted_seconds);
  EXPECT_EQ(f16.bytes * 2, f32.bytes);
  const auto g32 = predict(Collective::all_gather, DataType::float32, length, 4, options);
  const auto g16 = predict(Collective::all_gather, DataType::float16, length, 4, options);
  EXPECT_LT(g16.predicted_seconds, g32.predicted_seconds);
}

TEST(CollectiveReports, AutomaticChoiceFollowsTopologyAndSize) {
  const Topology pod16 = Topology::preset("pod16");
  CollectiveOptions options;
  options.topology = &pod16;
  // 16 IPUs over 4 machines: few steps win for small messages, both link directions for large.
  const auto small = predict(Collective::all_reduce, DataType::float32, 16, 16, options);
  const auto large = predict(Collective::all_reduce, DataType::float32, 64 << 20, 16, options);
  EXPECT_EQ(small.algorithm, Algorithm::hierarchical);
  EXPECT_EQ(large.algorithm, Algorithm::bidirectional_ring);
  for (Algorithm forced :
       {Algorithm::ring, Algorithm::bidirectional_ring, Algorithm::hierarchical}) {
    options.algorithm = forced;
    EXPECT_GE(predict(Collective::all_reduce, DataType::float32, 16, 16, options).predicted_seconds,
              small.predicted_seconds);
    EXPECT_GE(
        predict(Collective::all_reduce, DataType::float32, 64 << 20, 16, options).predicted_seconds,
        large.predicted_seconds);
  }
  // The ring formula of predict_all_reduce_seconds is the ring algorithm's prediction.
  options.algorithm = Algorithm::ring;
  std::vector<int> ring(16);
  for (int i = 0; i < 16; ++i) ring[static_cast<std::size_t>(i)] = i;
  EXPECT_DOUBLE_EQ(
      predict(Collective::all_reduce, DataType::float32, 1 << 20, 16, options).predicted_seconds,
      predict_all_reduce_seconds(pod16, ring, 4 << 20));
}

TEST(CollectiveReports, BadOptionsAreRejectedWithReasons) {
  const Topology m2000 = Topology::preset("m2000");
  CollectiveOptions options;
  options.algorithm = Algorithm::hierarchical;
  EXPECT_THROW(predict(Collective::all_reduce, DataType::float32, 8, 4, options), FabricError)
      << "hierarchical needs a topology";
  EXPECT_THROW(predict(Collective::reduce_scatter, DataType::float32, 8, 4, options), FabricError);
  options.algorithm = Algorithm::bidirectional_ring;
  EXPECT_THROW(predict(Collective::broadcast, DataType::float32, 8, 4, options), FabricError);
  options.algorithm = Algorithm::automatic;
  options.segment_bytes = 0;
  EXPECT_THROW(predict(Collective::all_reduce, DataType::float32, 8, 4, options), FabricError);
  options.segment_bytes = 1024;
  options.topology = &m2000;
  EXPECT_THROW(predict(Collective::all_reduce, DataType::float32, 8, 5, options), FabricError)
      << "5 participants do not fit on an M2000";
  options.ipus = {0, 1, 1};
  EXPECT_THROW(predict(Collective::all_reduce, DataType::float32, 8, 3, options), FabricError);
  options.ipus = {0, 1};
  EXPECT_THROW(predict(Collective::all_reduce, DataType::float32, 8, 3, options), FabricError);
  EXPECT_EQ(algorithm_from_string("bidirectional_ring"), Algorithm::bidirectional_ring);
  EXPECT_THROW(algorithm_from_string("butterfly"), FabricError);

  run_on_loopback(2, [](Transport& t) {
    std::vector<float> input(10);
    std::vector<float> wrong(3);
    EXPECT_THROW(reduce_scatter(t, input, wrong, ReduceOp::sum), FabricError);
    EXPECT_THROW(all_gather(t, wrong, input), FabricError);
  });
}

}  // namespace
}  // namespace ipupod::fabric::testing

// The shared collective cases over MPI, one process per rank (run at 1, 2, 3, 4 and 8 ranks),
// plus collectives inside sub-communicators (MPI_Comm_split and SubsetTransport) and the
// hierarchical plan where the world size fits a placement.
#include <gtest/gtest.h>
#include <mpi.h>

#include "collective_cases.hpp"
#include "fabric/mpi_transport.hpp"
#include "fabric/subset_transport.hpp"

namespace ipupod::fabric::testing {
namespace {

constexpr std::size_t kLengths[] = {0, 1, 3, 1000, 65543};

TEST(MpiCollectives, EveryCollectiveMatchesTheDocumentedOrderBitwise) {
  MpiTransport t(MPI_COMM_WORLD);
  check_every_collective(t, kLengths);
}

TEST(MpiCollectives, ManyMegabyteAllReduceWithDefaultSegments) {
  MpiTransport t(MPI_COMM_WORLD);
  CaseOptions ring;
  ring.collective.algorithm = Algorithm::ring;
  check_all_reduce(t, std::size_t{2} << 20, ReduceOp::sum, ring);
  CaseOptions bidirectional;
  bidirectional.type = DataType::float16;
  bidirectional.collective.algorithm = Algorithm::bidirectional_ring;
  check_all_reduce(t, (std::size_t{1} << 20) + 5, ReduceOp::mean, bidirectional);
}

TEST(MpiCollectives, BroadcastFromNonZeroRootByTreeAndRing) {
  MpiTransport t(MPI_COMM_WORLD);
  for (Algorithm algorithm : {Algorithm::tree, Algorithm::ring}) {
    check_broadcast(t, t.size() - 1, algorithm);
    check_broadcast(t, 1, algorithm);
  }
}

TEST(MpiCollectives, Barrier) {
  MpiTransport t(MPI_COMM_WORLD);
  check_barrier(t);
}

TEST(MpiCollectives, HierarchicalOnTwoMachinesOfAPod16) {
  MpiTransport t(MPI_COMM_WORLD);
  const Topology pod16 = Topology::preset("pod16");
  CaseOptions options;
  options.collective.algorithm = Algorithm::hierarchical;
  options.collective.topology = &pod16;
  options.collective.segment_bytes = 1024;
  if (t.size() == 8) {
    options.collective.ipus = {0, 1, 2, 3, 4, 5, 6, 7};
    options.stages = {Rings{{0, 1, 2, 3}, {4, 5, 6, 7}}, Rings{{0, 4}, {1, 5}, {2, 6}, {3, 7}}};
  } else if (t.size() == 4) {
    options.collective.ipus = {5, 0, 4, 1};
    options.stages = {Rings{{1, 3}, {2, 0}}, Rings{{1, 2}, {3, 0}}};
  } else {
    GTEST_SKIP() << "placements are written for 4 and 8 ranks";
  }
  for (DataType type : {DataType::float32, DataType::float16}) {
    options.type = type;
    for (std::size_t length : {0, 1, 3, 1000, 20011}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
        check_all_reduce(t, length, op, options);
      }
    }
  }
}

TEST(MpiCollectives, EveryCollectiveWithinEachHalfOfASplitWorld) {
  int world_rank = 0;
  int world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  // Even world ranks form one group, odd ones the other (like replicas of one stage).
  const int colour = world_rank % 2;
  MPI_Comm half = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, colour, world_rank, &half), MPI_SUCCESS);
  {
    MpiTransport t(half);
    EXPECT_EQ(t.size(), colour == 0 ? (world_size + 1) / 2 : world_size / 2);
    const std::size_t lengths[] = {2, 1001};
    check_every_collective(t, lengths);

    // The sum of world ranks within the group shows the groups did not mix.
    std::vector<float> ranks{static_cast<float>(world_rank)};
    all_reduce(t, ranks, ReduceOp::sum);
    float expected = 0.0F;
    for (int r = colour; r < world_size; r += 2) expected += static_cast<float>(r);
    EXPECT_EQ(ranks[0], expected);
  }
  MPI_Comm_free(&half);
}

TEST(MpiCollectives, EveryCollectiveOverASubsetInScrambledOrder) {
  MpiTransport world(MPI_COMM_WORLD);
  // All ranks but rank 0 (when there are more than 1), in reverse order; rank 0 sits out.
  std::vector<int> members;
  for (int r = world.size() - 1; r >= (world.size() > 1 ? 1 : 0); --r) members.push_back(r);
  if (std::find(members.begin(), members.end(), world.rank()) != members.end()) {
    SubsetTransport group(world, members);
    const std::size_t lengths[] = {5, 1000};
    check_every_collective(group, lengths);
    check_broadcast(group, 1, Algorithm::ring);
  }
  barrier(world);
}

TEST(MpiTransport, RejectsNullCommunicator) {
  EXPECT_THROW(MpiTransport{MPI_COMM_NULL}, FabricError);
}

}  // namespace
}  // namespace ipupod::fabric::testing

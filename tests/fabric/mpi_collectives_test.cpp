// The shared collective cases over MPI, one process per rank (run at 1, 2, 3 and 4 ranks),
// plus collectives inside sub-communicators made with MPI_Comm_split.
#include <gtest/gtest.h>
#include <mpi.h>

#include "collective_cases.hpp"
#include "fabric/mpi_transport.hpp"

namespace ipupod::fabric::testing {
namespace {

constexpr std::size_t kLengths[] = {0, 1, 3, 1000, std::size_t{1} << 20};

TEST(MpiCollectives, AllReduceMatchesRingOrderReferenceOnEveryRank) {
  MpiTransport t(MPI_COMM_WORLD);
  for (std::size_t length : kLengths) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
      check_all_reduce(t, length, op);
    }
  }
}

TEST(MpiCollectives, BroadcastFromNonZeroRoot) {
  MpiTransport t(MPI_COMM_WORLD);
  check_broadcast(t, t.size() - 1);
  check_broadcast(t, 1);
}

TEST(MpiCollectives, Barrier) {
  MpiTransport t(MPI_COMM_WORLD);
  check_barrier(t);
}

TEST(MpiCollectives, AllReduceWithinEachHalfOfASplitWorld) {
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
    check_all_reduce(t, 1001, ReduceOp::sum);
    check_all_reduce(t, 2, ReduceOp::mean);

    // The sum of world ranks within the group shows the groups did not mix.
    std::vector<float> ranks{static_cast<float>(world_rank)};
    all_reduce(t, ranks, ReduceOp::sum);
    float expected = 0.0F;
    for (int r = colour; r < world_size; r += 2) expected += static_cast<float>(r);
    EXPECT_EQ(ranks[0], expected);
  }
  MPI_Comm_free(&half);
}

TEST(MpiTransport, RejectsNullCommunicator) {
  EXPECT_THROW(MpiTransport{MPI_COMM_NULL}, FabricError);
}

}  // namespace
}  // namespace ipupod::fabric::testing

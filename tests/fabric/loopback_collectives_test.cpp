// The shared collective cases over the loopback fabric: one thread per participant, for
// participant counts 1, 2, 3, 4 and 8.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "collective_cases.hpp"
#include "fabric/loopback_transport.hpp"

namespace ipupod::fabric::testing {
namespace {

constexpr int kParticipantCounts[] = {1, 2, 3, 4, 8};
constexpr std::size_t kLengths[] = {0, 1, 3, 1000, std::size_t{1} << 20};

class LoopbackAllReduce : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(LoopbackAllReduce, MatchesRingOrderReferenceOnEveryRank) {
  const auto [participants, length] = GetParam();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
    run_on_loopback(participants, [&](Transport& t) { check_all_reduce(t, length, op); });
  }
}

INSTANTIATE_TEST_SUITE_P(ParticipantsAndLengths, LoopbackAllReduce,
                         ::testing::Combine(::testing::ValuesIn(kParticipantCounts),
                                            ::testing::ValuesIn(kLengths)),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_len" +
                                  std::to_string(std::get<1>(info.param));
                         });

class LoopbackCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LoopbackCollectives, BroadcastFromNonZeroRoot) {
  run_on_loopback(GetParam(), [](Transport& t) { check_broadcast(t, t.size() - 1); });
  run_on_loopback(GetParam(), [](Transport& t) { check_broadcast(t, 1); });
}

TEST_P(LoopbackCollectives, Barrier) {
  run_on_loopback(GetParam(), [](Transport& t) { check_barrier(t); });
}

TEST_P(LoopbackCollectives, RepeatedAllReduceIsBitwiseReproducible) {
  std::vector<std::vector<float>> first(GetParam());
  std::vector<std::vector<float>> second(GetParam());
  for (auto* results : {&first, &second}) {
    run_on_loopback(GetParam(), [&](Transport& t) {
      std::vector<float> data(777);
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = input_value(t.rank(), i);
      all_reduce(t, data, ReduceOp::sum);
      (*results)[static_cast<std::size_t>(t.rank())] = data;
    });
  }
  EXPECT_EQ(first, second);
}

INSTANTIATE_TEST_SUITE_P(Participants, LoopbackCollectives, ::testing::ValuesIn(kParticipantCounts),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace ipupod::fabric::testing

// GoogleTest main for tests that run as MPI processes: rank 0 prints the usual report, other
// ranks print only their failures (prefixed with their rank), and a failure anywhere fails all.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace {

int world_rank = 0;

// Non-zero ranks: report failed assertions and failed tests on stderr, nothing else.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", world_rank,
                 result.file_name() ? result.file_name() : "unknown", result.line_number(),
                 result.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", world_rank, info.test_suite_name(),
                 info.name());
  }
};

// An exception escaping a test leaves this rank out of step with the others, which would
// then wait forever in a collective; end the whole job promptly instead, saying why.
[[noreturn]] void abort_job_on_uncaught_exception() {
  const char* what = "unknown exception";
  try {
    if (auto current = std::current_exception()) std::rethrow_exception(current);
  } catch (const std::exception& error) {
    what = error.what();
    std::fprintf(stderr, "[rank %d] uncaught exception, aborting the MPI job: %s\n", world_rank,
                 what);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (...) {
  }
  std::fprintf(stderr, "[rank %d] terminate called (%s), aborting the MPI job\n", world_rank, what);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "MPI_Init_thread failed; is the program started with mpiexec?\n");
    return 1;
  }
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "MPI provides thread level %d, the tests need at least FUNNELED (%d)\n",
                 provided, MPI_THREAD_FUNNELED);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::set_terminate(abort_job_on_uncaught_exception);

  ::testing::InitGoogleTest(&argc, argv);
  // Let exceptions reach the terminate handler above instead of desynchronising the ranks.
  GTEST_FLAG_SET(catch_exceptions, false);
  if (world_rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter);
  }

  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = local_failed;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank == 0 && any_failed && !local_failed) {
    std::fprintf(stderr, "tests passed on rank 0 but failed on another rank (see above)\n");
  }
  MPI_Finalize();
  return any_failed ? 1 : 0;
}

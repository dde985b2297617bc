// Not a GoogleTest: an MPI program in which one rank dies in the middle of an all-reduce, the
// others being inside the same all-reduce. The ctest around it passes only if mpiexec ends
// the whole job with a non-zero status within its time limit (no rank left hanging).
//   rank_death_program abort|exit|exit0   (how the dying rank goes: abort(), _exit(3), _exit(0))
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/mpi_transport.hpp"

namespace {

// Forwards to MPI; on the victim rank, the process dies at its 6th send, i.e. inside the
// first ring steps of the all-reduce while its neighbours wait for its segments.
class DyingTransport final : public ipupod::fabric::Transport {
 public:
  DyingTransport(ipupod::fabric::Transport& inner, bool victim, std::string how)
      : inner_(inner), victim_(victim), how_(std::move(how)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  ipupod::fabric::Request isend(int peer, std::span<const std::byte> data, int tag) override {
    if (victim_ && ++sends_ == 6) die();
    return inner_.isend(peer, data, tag);
  }
  ipupod::fabric::Request irecv(int peer, std::span<std::byte> data, int tag) override {
    return inner_.irecv(peer, data, tag);
  }
  void wait(ipupod::fabric::Request& request) override { inner_.wait(request); }
  bool test(ipupod::fabric::Request& request) override { return inner_.test(request); }

 private:
  [[noreturn]] void die() const {
    std::fprintf(stderr, "rank %d: dying mid-all-reduce (%s)\n", rank(), how_.c_str());
    std::fflush(stderr);
    if (how_ == "abort") std::abort();
    _exit(how_ == "exit0" ? 0 : 3);
  }
  ipupod::fabric::Transport& inner_;
  bool victim_;
  std::string how_;
  int sends_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const std::string how = argc > 1 ? argv[1] : "abort";
  ipupod::fabric::MpiTransport world(MPI_COMM_WORLD);
  const int victim = world.size() / 2;
  DyingTransport transport(world, world.rank() == victim, how);
  std::vector<float> gradients(std::size_t{1} << 20, 1.0F);
  ipupod::fabric::CollectiveOptions options;
  options.segment_bytes = 64 << 10;
  for (int step = 0; step < 1000; ++step) {
    ipupod::fabric::all_reduce(transport, gradients, ipupod::fabric::ReduceOp::mean, options);
  }
  // Only reached if nobody died: the ctest treats a clean exit as a failure.
  std::fprintf(stderr, "rank %d: finished every all-reduce; nobody died\n", world.rank());
  MPI_Finalize();
  return 0;
}

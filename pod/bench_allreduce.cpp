// `ipupod bench allreduce` (not written yet: no subcommand is registered until it is).
#include "pod/bench.hpp"

namespace ipupod::pod {

void add_allreduce_bench(CLI::App& bench, int& exit_code) {
  (void)bench;
  (void)exit_code;
}

}  // namespace ipupod::pod

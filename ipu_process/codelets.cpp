// Codelet registry and the cost helpers the estimators share.
#include "ipu_process/codelets.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace ipupod::ipu {

const CodeletRegistry& CodeletRegistry::builtin() {
  static const CodeletRegistry registry = [] {
    CodeletRegistry r;
    register_elementwise_codelets(r);
    register_matmul_codelets(r);
    register_reduce_codelets(r);
    register_loss_codelets(r);
    register_gather_codelets(r);
    register_conv_codelets(r);
    register_pool_codelets(r);
    register_segment_codelets(r);
    register_softmax_codelets(r);
    register_norm_codelets(r);
    register_tensor_codelets(r);
    register_optimizer_codelets(r);
    return r;
  }();
  return registry;
}

void CodeletRegistry::add(Codelet codelet) {
  const std::string name = codelet.name;
  for (const auto& output : codelet.outputs)
    if (std::find(codelet.fields.begin(), codelet.fields.end(), output) == codelet.fields.end())
      throw std::logic_error("codelet '" + name + "' lists output '" + output +
                             "', which is not one of its fields");
  if (!codelets_.emplace(name, std::move(codelet)).second)
    throw std::logic_error("codelet '" + name + "' registered twice");
}

const Codelet& CodeletRegistry::get(const std::string& name) const {
  auto it = codelets_.find(name);
  if (it == codelets_.end())
    throw std::invalid_argument("unknown codelet '" + name + "' (see `ipupod info --codelets`)");
  return it->second;
}

std::uint64_t vector_cycles(const ArchPreset& arch, std::size_t elements,
                            std::size_t instructions_per_vector) {
  const std::size_t vectors = (elements + arch.fp32_vector_width - 1) / arch.fp32_vector_width;
  return arch.vertex_overhead_cycles +
         static_cast<std::uint64_t>(vectors * instructions_per_vector) * arch.workers_per_tile;
}

std::uint64_t amp_cycles(const ArchPreset& arch, double flops) {
  // One worker gets 1/workers of the tile's issue slots, hence of its AMP rate.
  const double per_worker = arch.fp32_flops_per_cycle_per_tile / arch.workers_per_tile;
  return arch.vertex_overhead_cycles + static_cast<std::uint64_t>(std::ceil(flops / per_worker));
}

}  // namespace ipupod::ipu

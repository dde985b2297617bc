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
  if (codelet.fields.size() > 32)
    throw std::logic_error("codelet '" + name + "' has more than 32 fields");
  // Bit f for each of the named fields (outputs, sliced) that is field f.
  const auto mask = [&](const std::vector<std::string>& names, const char* what) {
    std::uint32_t bits = 0;
    for (const auto& f : names) {
      const auto it = std::find(codelet.fields.begin(), codelet.fields.end(), f);
      if (it == codelet.fields.end())
        throw std::logic_error("codelet '" + name + "' " + what + " '" + f +
                               "', which is not one of its fields");
      bits |= 1U << (it - codelet.fields.begin());
    }
    return bits;
  };
  codelet.output_mask = mask(codelet.outputs, "lists output");
  codelet.sliced_mask = mask(codelet.sliced, "slices");
  if (by_index_.size() > UINT16_MAX)
    throw std::logic_error("codelet '" + name + "': more codelets than a vertex record names");
  codelet.index = static_cast<std::uint16_t>(by_index_.size());
  const auto [it, added] = codelets_.emplace(name, std::move(codelet));
  if (!added) throw std::logic_error("codelet '" + name + "' registered twice");
  by_index_.push_back(&it->second);
}

const Codelet& CodeletRegistry::get(const std::string& name) const {
  auto it = codelets_.find(name);
  if (it == codelets_.end())
    throw std::invalid_argument("unknown codelet '" + name + "' (see `ipupod info --codelets`)");
  return it->second;
}

const char* rounding_name(Rounding rounding) {
  return rounding == Rounding::stochastic ? "stochastic" : "nearest_even";
}

std::uint64_t counter_hash(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t vector_cycles(const ArchPreset& arch, std::size_t elements,
                            std::size_t instructions_per_vector, DType dtype) {
  const std::size_t lanes = arch.fp32_vector_width * sizeof(float) / dtype_size(dtype);
  const std::size_t vectors = (elements + lanes - 1) / lanes;
  return arch.vertex_overhead_cycles +
         static_cast<std::uint64_t>(vectors * instructions_per_vector) * arch.workers_per_tile;
}

std::uint64_t field_vector_cycles(const Vertex& vertex, const ArchPreset& arch, std::size_t field,
                                  std::size_t instructions_per_vector) {
  std::size_t elements = 0;
  for (const auto& t : vertex.fields[field]) elements += t.elements();
  const DType dtype = vertex.fields[field].empty() ? DType::f32 : vertex.fields[field][0].dtype();
  return vector_cycles(arch, elements, instructions_per_vector, dtype);
}

double amp_macs_per_cycle(const ArchPreset& arch, DType dtype, bool half_partials) {
  // A preset without FP16 figures computes float16 at the FP32 rate.
  double flops = arch.fp32_flops_per_cycle_per_tile;
  if (dtype == DType::f16 && arch.fp16_flops_per_cycle_per_tile > 0)
    flops = half_partials || !(arch.fp16_fp32_partials_flops_per_cycle_per_tile > 0)
                ? arch.fp16_flops_per_cycle_per_tile
                : arch.fp16_fp32_partials_flops_per_cycle_per_tile;
  return flops / 2;
}

std::uint64_t mac_cycles(const ArchPreset& arch, double macs, DType dtype, const AmpShape& shape) {
  const double lanes = static_cast<double>(arch.fp32_vector_width * sizeof(float)) /
                       static_cast<double>(dtype_size(dtype));
  const double amp = amp_macs_per_cycle(arch, dtype, shape.half_partials);
  // The unit sums amp_pipeline_depth loads of `lanes` inputs into each output, and its engines
  // (amp / lanes of them: one load of `lanes` inputs per engine per cycle) work on as many
  // outputs; a shorter depth or fewer outputs leave part of it idle.
  const auto fill = [](double n, double chunk) {
    if (n <= 0 || chunk <= 1) return 1.0;
    return n / (std::ceil(n / chunk) * chunk);
  };
  const double depth_chunk = static_cast<double>(arch.amp_pipeline_depth) * lanes;
  const double engines = std::max(1.0, amp / lanes);
  const double filled = amp * fill(shape.depth, depth_chunk) * fill(shape.width, engines);
  // One worker gets 1/workers of the tile's issue slots, hence of either unit's rate.
  const double per_worker = std::max(filled, lanes) / arch.workers_per_tile;
  return arch.vertex_overhead_cycles + static_cast<std::uint64_t>(std::ceil(macs / per_worker));
}

}  // namespace ipupod::ipu

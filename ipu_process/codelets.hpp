// The codelet registry: every vertex kind the device can run, its fields, its compute
// function and its cycle estimator, with documentation that `ipupod info --codelets` prints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ipu_process/arch.hpp"
#include "ipu_process/graph.hpp"

namespace ipupod::ipu {

// One connected region as the vertex sees it: a contiguous run of its tile's memory.
struct Region {
  std::byte* data = nullptr;
  std::uint32_t elements = 0;  // a region lies on one tile: far below 2^32 elements
  DType dtype = DType::f32;
};

// How float32 results are rounded when stored as float16 (Poplar's floating-point behaviour):
// to nearest with ties to even, or stochastically (unbiased, from a counter-based generator).
enum class Rounding : std::uint8_t { nearest_even, stochastic };
const char* rounding_name(Rounding rounding);

// The counter-based generator behind random masks and stochastic rounding (SplitMix64): the same
// key always gives the same draw, whatever thread or order computes it.
std::uint64_t counter_hash(std::uint64_t key);

// What a vertex's compute function may touch: its own regions and its parameters.
class VertexContext {
 public:
  VertexContext(std::span<const std::span<const Region>> fields, std::span<const double> params)
      : fields_(fields), params_(params) {}
  std::size_t regions(std::size_t field) const { return fields_[field].size(); }
  template <class T>
  std::span<T> region(std::size_t field, std::size_t i = 0) const {
    const Region& r = fields_[field][i];
    return {reinterpret_cast<T*>(r.data), r.elements};
  }
  double param(std::size_t i) const { return params_[i]; }
  std::size_t size_param(std::size_t i) const { return static_cast<std::size_t>(params_[i]); }

 private:
  std::span<const std::span<const Region>> fields_;
  std::span<const double> params_;
};

struct Codelet {
  std::string name;
  std::string doc;
  std::vector<std::string> fields;
  std::function<void(const VertexContext&)> compute;
  // Cycles the vertex keeps its worker busy, in tile clock cycles (a worker issues one
  // instruction every workers_per_tile cycles).
  std::function<std::uint64_t(const Vertex&, const ArchPreset&)> cycles;
  // Fields whose every region the vertex overwrites whole without reading it first. Liveness
  // uses them: a value written whole at the top of a loop body does not carry from the
  // previous iteration, so its bytes can be shared. Unlisted fields count as read.
  std::vector<std::string> outputs = {};
  // float16 regions reach most codelets as float32 values (the engine widens them, and rounds
  // what the codelet changed back to float16, as the AMP and vector units accumulate in
  // float32). A codelet that converts between the two itself sees their 16-bit storage.
  bool reads_float16_storage = false;
  // Fields a vertex with several worker slices splits among them (see Vertex::slices); the
  // others each slice sees whole. Empty: the codelet's vertices are one worker's work each.
  std::vector<std::string> sliced = {};
  // The parameters that differ from slice to slice (indices into the parameters).
  std::vector<std::size_t> slice_params = {};
  // How many parameters, from index `shared_from` on, every vertex's list holds alike within a
  // compute set (a convolution's geometry, a map's shape and strides): the graph keeps them
  // once per compute set (ComputeSet::heads). kSharedToEnd: all of them from `shared_from` to
  // the values of the worker slices (a list whose length varies with the vertices' rank).
  static constexpr std::size_t kSharedToEnd = SIZE_MAX;
  std::size_t shared_params = 0;
  std::size_t shared_from = 0;
  std::uint16_t index = 0;        // set by the registry: what a VertexRecord names it by
  std::uint32_t sliced_mask = 0;  // set by the registry: bit f for field f in `sliced`
  std::uint32_t output_mask = 0;  // set by the registry: bit f for field f in `outputs`
  bool is_output(std::size_t field) const { return (output_mask >> field & 1U) != 0; }
};

class CodeletRegistry {
 public:
  static const CodeletRegistry& builtin();
  void add(Codelet codelet);
  const Codelet& get(const std::string& name) const;  // throws std::invalid_argument
  const Codelet& at(std::uint16_t index) const { return *by_index_.at(index); }
  const std::map<std::string, Codelet>& all() const { return codelets_; }

 private:
  std::map<std::string, Codelet> codelets_;
  std::vector<const Codelet*> by_index_;  // in registration order
};

// Cost helpers shared by the codelets' estimators.
// A vector instruction covers the SIMD width's worth of elements of the dtype (twice as many
// float16 as float32); the AMP runs at the preset's FP16 rate for float16 operands.
std::uint64_t vector_cycles(const ArchPreset& arch, std::size_t elements,
                            std::size_t instructions_per_vector, DType dtype = DType::f32);
// The shape of a matrix-unit (AMP) product, which sets how well it fills the unit: `depth` terms
// summed into each output (a group's input channels, or a matmul's inner dimension; the unit
// takes them in chunks of amp_pipeline_depth x vector lanes) and `width` outputs that share each
// input (a group's output channels, or a matmul's columns; the unit's engines take them in
// chunks of one per engine). Partial sums in float16 ("half partials") or float32.
struct AmpShape {
  double depth = 0, width = 0;  // 0: large enough to fill the unit
  bool half_partials = false;
};
// Cycles of a worker doing `macs` multiply-accumulates of `dtype` operands: the AMP's rate for
// the operand and partials types, scaled by how well the shape fills it, or the vector unit's
// (one lane-wide multiply-add per cycle) where that is faster, as PopLibs takes depthwise
// convolutions off the AMP.
std::uint64_t mac_cycles(const ArchPreset& arch, double macs, DType dtype, const AmpShape& shape);
// The AMP's multiply-accumulates per cycle per tile for the operand and partials types.
double amp_macs_per_cycle(const ArchPreset& arch, DType dtype, bool half_partials);
// vector_cycles over the elements of every region of the vertex's field `field` (of its dtype).
std::uint64_t field_vector_cycles(const Vertex& vertex, const ArchPreset& arch, std::size_t field,
                                  std::size_t instructions_per_vector);

// Each op library registers its codelets here (called once by CodeletRegistry::builtin).
void register_elementwise_codelets(CodeletRegistry& registry);
void register_matmul_codelets(CodeletRegistry& registry);
void register_reduce_codelets(CodeletRegistry& registry);
void register_loss_codelets(CodeletRegistry& registry);
void register_gather_codelets(CodeletRegistry& registry);
void register_conv_codelets(CodeletRegistry& registry);
void register_pool_codelets(CodeletRegistry& registry);
void register_segment_codelets(CodeletRegistry& registry);
void register_softmax_codelets(CodeletRegistry& registry);
void register_norm_codelets(CodeletRegistry& registry);
void register_tensor_codelets(CodeletRegistry& registry);
void register_optimizer_codelets(CodeletRegistry& registry);

}  // namespace ipupod::ipu

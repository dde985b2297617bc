// The device graph of one IPU, in Poplar's vocabulary: variables mapped onto tiles, tensors
// (contiguous views of variables), compute sets of vertices, and host streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ipu_process/arch.hpp"

namespace ipupod::ipu {

enum class DType : std::uint8_t { f32, f16, i32, u32, u8 };
std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// What a variable holds, for the memory report (always-live vs not-always-live).
enum class MemoryCategory : std::uint8_t { weight, optimizer_state, activation, temporary, stream };
const char* category_name(MemoryCategory category);
bool always_live(MemoryCategory category);

using VariableId = std::uint32_t;
using ComputeSetId = std::uint32_t;

// A contiguous view of elements [offset, offset + elements()) of one variable, with a shape.
class Tensor {
 public:
  Tensor() = default;
  Tensor(VariableId var, std::size_t offset, std::vector<std::size_t> shape, DType dtype);

  VariableId variable() const { return var_; }
  std::size_t offset() const { return offset_; }
  const std::vector<std::size_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::size_t elements() const;
  std::size_t rank() const { return shape_.size(); }
  std::size_t dim(std::size_t i) const { return shape_.at(i); }

  Tensor flatten() const { return reshape({elements()}); }
  Tensor reshape(std::vector<std::size_t> shape) const;    // same element count, no copy
  Tensor slice(std::size_t begin, std::size_t end) const;  // flat elements, no copy
  Tensor row(std::size_t i) const;                         // index the first dimension
  Tensor rows(std::size_t begin, std::size_t end) const;   // range of the first dimension

 private:
  VariableId var_ = 0;
  std::size_t offset_ = 0;
  std::vector<std::size_t> shape_;
  DType dtype_ = DType::f32;
};

struct TileInterval {
  std::size_t begin = 0, end = 0;  // elements of the variable
  unsigned tile = 0;
};

struct Variable {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::size_t> shape;
  std::size_t elements = 0;
  MemoryCategory category = MemoryCategory::activation;
  bool host_access = false;           // read or written by the host: live for the whole run
  std::vector<TileInterval> mapping;  // sorted, disjoint, adjacent same-tile runs merged
};

// A vertex: one codelet instance on one tile. Each field is a list of regions (like
// Poplar's Vector<Input<Vector<T>>>); every region must live on the vertex's tile.
struct Vertex {
  std::string codelet;
  unsigned tile = 0;
  std::vector<std::vector<Tensor>> fields;  // in the codelet's field order
  std::vector<double> params;               // scalar parameters (sizes, flags, factors)
};

struct ComputeSet {
  std::string name;
  std::vector<Vertex> vertices;
};

class Graph {
 public:
  explicit Graph(const ArchPreset& arch);

  const ArchPreset& arch() const { return arch_; }
  unsigned tiles() const { return arch_.tiles; }

  Tensor add_variable(DType dtype, std::vector<std::size_t> shape, std::string name,
                      MemoryCategory category = MemoryCategory::activation);
  void set_tile_mapping(const Tensor& t, unsigned tile);
  // Lets the host read and write the tensor's variable between program runs (like Poplar's
  // createHostRead/createHostWrite); such a variable keeps its bytes for the whole run.
  void set_host_access(const Tensor& t);
  // Spread the tensor over tiles [first_tile, first_tile + tile_count) in pieces that are
  // whole multiples of grain elements, as evenly as possible.
  void map_linearly(const Tensor& t, std::size_t grain = 1, unsigned first_tile = 0,
                    unsigned tile_count = 0);
  std::vector<TileInterval> tile_mapping(const Tensor& t) const;  // in the tensor's elements
  // The single tile holding every element of t, or throws naming the tensor and the tiles.
  unsigned tile_of(const Tensor& t) const;

  ComputeSetId add_compute_set(std::string name);
  void add_vertex(ComputeSetId cs, Vertex vertex);

  const Variable& variable(VariableId id) const { return variables_.at(id); }
  const std::vector<Variable>& variables() const { return variables_; }
  const std::vector<ComputeSet>& compute_sets() const { return compute_sets_; }
  std::string describe(const Tensor& t) const;  // "name[offset:offset+n]" for messages

 private:
  const ArchPreset& arch_;
  std::vector<Variable> variables_;
  std::vector<ComputeSet> compute_sets_;
};

}  // namespace ipupod::ipu

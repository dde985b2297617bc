// Device graph: variables, tile mappings, tensor views and compute sets.
#include "ipu_process/graph.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

namespace ipupod::ipu {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::u32:
      return 4;
    case DType::u8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::i32:
      return "int32";
    case DType::u32:
      return "uint32";
    case DType::u8:
      return "uint8";
  }
  return "?";
}

const char* category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::weight:
      return "weight";
    case MemoryCategory::optimizer_state:
      return "optimizer_state";
    case MemoryCategory::activation:
      return "activation";
    case MemoryCategory::temporary:
      return "temporary";
    case MemoryCategory::stream:
      return "stream";
  }
  return "?";
}

bool always_live(MemoryCategory category) {
  return category == MemoryCategory::weight || category == MemoryCategory::optimizer_state;
}

namespace {
std::size_t product(const std::vector<std::size_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>());
}
std::string shape_string(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

Tensor::Tensor(VariableId var, std::size_t offset, std::vector<std::size_t> shape, DType dtype)
    : var_(var), offset_(offset), shape_(std::move(shape)), dtype_(dtype) {}

std::size_t Tensor::elements() const {
  return product(shape_);
}

Tensor Tensor::reshape(std::vector<std::size_t> shape) const {
  if (product(shape) != elements())
    throw std::invalid_argument("reshape of a tensor of shape " + shape_string(shape_) + " to " +
                                shape_string(shape) + ": element counts differ");
  return Tensor(var_, offset_, std::move(shape), dtype_);
}

Tensor Tensor::slice(std::size_t begin, std::size_t end) const {
  if (begin > end || end > elements())
    throw std::out_of_range("slice [" + std::to_string(begin) + "," + std::to_string(end) +
                            ") of a tensor of " + std::to_string(elements()) + " elements");
  return Tensor(var_, offset_ + begin, {end - begin}, dtype_);
}

Tensor Tensor::rows(std::size_t begin, std::size_t end) const {
  if (shape_.empty() || begin > end || end > shape_[0])
    throw std::out_of_range("rows [" + std::to_string(begin) + "," + std::to_string(end) +
                            ") of a tensor of shape " + shape_string(shape_));
  std::vector<std::size_t> shape = shape_;
  shape[0] = end - begin;
  const std::size_t row_elements = elements() / std::max<std::size_t>(shape_[0], 1);
  return Tensor(var_, offset_ + begin * row_elements, std::move(shape), dtype_);
}

Tensor Tensor::row(std::size_t i) const {
  Tensor r = rows(i, i + 1);
  std::vector<std::size_t> shape(r.shape_.begin() + 1, r.shape_.end());
  return Tensor(var_, r.offset_, std::move(shape), dtype_);
}

Graph::Graph(const ArchPreset& arch) : arch_(arch) {}

Tensor Graph::add_variable(DType dtype, std::vector<std::size_t> shape, std::string name,
                           MemoryCategory category) {
  Variable v;
  v.name = std::move(name);
  v.dtype = dtype;
  v.shape = shape;
  v.elements = product(shape);
  v.category = category;
  variables_.push_back(std::move(v));
  return Tensor(static_cast<VariableId>(variables_.size() - 1), 0, std::move(shape), dtype);
}

void Graph::set_tile_mapping(const Tensor& t, unsigned tile) {
  if (tile >= arch_.tiles)
    throw std::out_of_range("tile " + std::to_string(tile) + " of " + describe(t) +
                            " is outside the IPU's " + std::to_string(arch_.tiles) + " tiles");
  if (t.elements() == 0) return;
  auto& m = variables_.at(t.variable()).mapping;
  const std::size_t b = t.offset(), e = t.offset() + t.elements();
  if (m.empty() || m.back().end <= b) {  // the common case: mapping a variable front to back
    if (!m.empty() && m.back().tile == tile && m.back().end == b)
      m.back().end = e;
    else
      m.push_back({b, e, tile});
    return;
  }
  // Cut the new interval out of what is there, insert it, then merge same-tile neighbours.
  std::vector<TileInterval> out;
  for (const auto& iv : m) {
    if (iv.end <= b || iv.begin >= e) {
      out.push_back(iv);
      continue;
    }
    if (iv.begin < b) out.push_back({iv.begin, b, iv.tile});
    if (iv.end > e) out.push_back({e, iv.end, iv.tile});
  }
  out.push_back({b, e, tile});
  std::sort(out.begin(), out.end(), [](auto& x, auto& y) { return x.begin < y.begin; });
  m.clear();
  for (const auto& iv : out) {
    if (!m.empty() && m.back().tile == iv.tile && m.back().end == iv.begin)
      m.back().end = iv.end;
    else
      m.push_back(iv);
  }
}

void Graph::set_host_access(const Tensor& t) {
  variables_.at(t.variable()).host_access = true;
}

void Graph::map_linearly(const Tensor& t, std::size_t grain, unsigned first_tile,
                         unsigned tile_count) {
  if (tile_count == 0) tile_count = arch_.tiles - first_tile;
  grain = std::max<std::size_t>(grain, 1);
  const std::size_t n = t.elements();
  const std::size_t grains = (n + grain - 1) / grain;
  const std::size_t per_tile = (grains + tile_count - 1) / std::max(tile_count, 1u);
  for (unsigned i = 0; i < tile_count; ++i) {
    const std::size_t b = std::min(n, i * per_tile * grain);
    const std::size_t e = std::min(n, (i + 1) * per_tile * grain);
    if (b < e) set_tile_mapping(t.slice(b, e), first_tile + i);
  }
}

std::vector<TileInterval> Graph::tile_mapping(const Tensor& t) const {
  const auto& m = variables_.at(t.variable()).mapping;
  const std::size_t b = t.offset(), e = t.offset() + t.elements();
  std::vector<TileInterval> out;
  auto it = std::upper_bound(m.begin(), m.end(), b,
                             [](std::size_t x, const TileInterval& iv) { return x < iv.end; });
  for (; it != m.end() && it->begin < e; ++it)
    out.push_back({std::max(it->begin, b) - b, std::min(it->end, e) - b, it->tile});
  return out;
}

unsigned Graph::tile_of(const Tensor& t) const {
  const auto m = tile_mapping(t);
  std::size_t covered = 0;
  std::set<unsigned> tiles;
  for (const auto& iv : m) {
    covered += iv.end - iv.begin;
    tiles.insert(iv.tile);
  }
  if (covered != t.elements())
    throw std::logic_error(describe(t) + " is not fully mapped to tiles (" +
                           std::to_string(covered) + " of " + std::to_string(t.elements()) +
                           " elements mapped); call set_tile_mapping or map_linearly first");
  if (tiles.size() != 1) {
    std::string list;
    for (unsigned tile : tiles) list += (list.empty() ? "" : ", ") + std::to_string(tile);
    throw std::logic_error(describe(t) + " spans tiles " + list + ", expected one tile");
  }
  return *tiles.begin();
}

ComputeSetId Graph::add_compute_set(std::string name) {
  compute_sets_.push_back({std::move(name), {}});
  return static_cast<ComputeSetId>(compute_sets_.size() - 1);
}

void Graph::add_vertex(ComputeSetId cs, Vertex vertex) {
  compute_sets_.at(cs).vertices.push_back(std::move(vertex));
}

std::string Graph::describe(const Tensor& t) const {
  const auto& v = variables_.at(t.variable());
  if (t.offset() == 0 && t.elements() == v.elements) return "'" + v.name + "'";
  return "'" + v.name + "'[" + std::to_string(t.offset()) + ":" +
         std::to_string(t.offset() + t.elements()) + "]";
}

}  // namespace ipupod::ipu

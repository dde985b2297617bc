// Device graph: variables, tile mappings and tensor views (compute sets: graph_vertices.cpp).
#include "ipu_process/graph.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>
#include <tuple>

#include "ipu_process/codelets.hpp"

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
// Of a Shape or a std::vector of dimensions (no copy of either).
template <class Dims>
std::size_t product(const Dims& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>());
}
template <class Dims>
std::string shape_string(const Dims& shape) {
  std::string s = "[";
  std::size_t i = 0;
  for (const auto d : shape) s += (i++ ? "," : "") + std::to_string(d);
  return s + "]";
}
// A reshape keeps the element count; `what` is "tensor" or "view", for the message.
template <class From>
void check_reshape(const From& from, const std::vector<std::size_t>& to, const char* what) {
  if (product(from) != product(to))
    throw std::invalid_argument(std::string("reshape of a ") + what + " of shape " +
                                shape_string(from) + " to " + shape_string(to) +
                                ": element counts differ");
}
}  // namespace

Tensor::Tensor(VariableId var, std::size_t offset, Shape shape, DType dtype)
    : offset_(offset), var_(var), shape_(shape), dtype_(dtype) {}

std::size_t Tensor::elements() const {
  std::size_t n = 1;
  for (std::size_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::reshape(std::vector<std::size_t> shape) const {
  check_reshape(shape_, shape, "tensor");
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
  const std::size_t row_elements = elements() / std::max<std::size_t>(shape_[0], 1);
  return Tensor(var_, offset_ + begin * row_elements, shape_.with_front(end - begin), dtype_);
}

Tensor Tensor::row(std::size_t i) const {
  if (shape_.empty() || i >= shape_[0])
    throw std::out_of_range("row " + std::to_string(i) + " of a tensor of shape " +
                            shape_string(shape_));
  const std::size_t row_elements = elements() / shape_[0];
  return Tensor(var_, offset_ + i * row_elements, shape_.without_front(), dtype_);
}

namespace {
void push_merged(std::vector<ViewRegion>& out, const ViewRegion& r) {
  if (r.begin >= r.end) return;
  if (!out.empty() && out.back().var == r.var && out.back().end == r.begin)
    out.back().end = r.end;
  else
    out.push_back(r);
}

// Picks runs of a view's logical elements out of its regions: take(b, e) appends the regions
// holding elements [b, e), merged with what is already there.
class Picker {
 public:
  explicit Picker(const std::vector<ViewRegion>& regions) : regions_(regions) {
    starts_.reserve(regions.size() + 1);
    std::size_t n = 0;
    for (const auto& r : regions) {
      starts_.push_back(n);
      n += r.end - r.begin;
    }
    starts_.push_back(n);
  }
  void take(std::size_t b, std::size_t e, std::vector<ViewRegion>& out) {
    if (b >= e) return;
    std::size_t k = hint_;
    if (!(k < regions_.size() && starts_[k] <= b && b < starts_[k + 1]))
      k = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), b) -
                                   starts_.begin()) -
          1;
    while (b < e) {
      const ViewRegion& r = regions_[k];
      const std::size_t off = b - starts_[k];
      const std::size_t n = std::min(e - b, r.end - r.begin - off);
      push_merged(out, {r.var, r.begin + off, r.begin + off + n});
      b += n;
      if (b < e || off + n == r.end - r.begin) ++k;
    }
    hint_ = k;
  }

 private:
  const std::vector<ViewRegion>& regions_;
  std::vector<std::size_t> starts_;
  std::size_t hint_ = 0;
};

std::size_t product_of(const std::vector<std::size_t>& shape, std::size_t b, std::size_t e) {
  std::size_t n = 1;
  for (std::size_t i = b; i < e; ++i) n *= shape[i];
  return n;
}
}  // namespace

View::View(const Tensor& t) : shape_(t.shape()), dtype_(t.dtype()) {
  if (t.elements() > 0) regions_.push_back({t.variable(), t.offset(), t.offset() + t.elements()});
}

View::View(std::vector<ViewRegion> regions, std::vector<std::size_t> shape, DType dtype)
    : shape_(std::move(shape)), dtype_(dtype) {
  std::size_t n = 0;
  for (const auto& r : regions) {
    if (r.end < r.begin) throw std::invalid_argument("a view region ends before it begins");
    n += r.end - r.begin;
    push_merged(regions_, r);
  }
  if (n != product(shape_))
    throw std::invalid_argument("a view of shape " + shape_string(shape_) + " needs " +
                                std::to_string(product(shape_)) + " elements, its regions hold " +
                                std::to_string(n));
}

std::size_t View::elements() const {
  return product(shape_);
}

View View::reshape(std::vector<std::size_t> shape) const {
  check_reshape(shape_, shape, "view");
  View v = *this;
  v.shape_ = std::move(shape);
  return v;
}

View View::slice(std::size_t begin, std::size_t end, std::size_t dim) const {
  if (dim >= rank() || begin > end || end > shape_[dim])
    throw std::out_of_range("slice [" + std::to_string(begin) + "," + std::to_string(end) +
                            ") of dimension " + std::to_string(dim) + " of a view of shape " +
                            shape_string(shape_));
  const std::size_t outer = product_of(shape_, 0, dim), k = shape_[dim];
  const std::size_t inner = product_of(shape_, dim + 1, rank());
  View v;
  v.dtype_ = dtype_;
  v.shape_ = shape_;
  v.shape_[dim] = end - begin;
  Picker pick(regions_);
  for (std::size_t o = 0; o < outer; ++o)
    pick.take((o * k + begin) * inner, (o * k + end) * inner, v.regions_);
  return v;
}

View View::index(std::size_t i, std::size_t dim) const {
  View v = slice(i, i + 1, dim);
  v.shape_.erase(v.shape_.begin() + static_cast<std::ptrdiff_t>(dim));
  return v;
}

View View::permute(const std::vector<std::size_t>& perm) const {
  const std::size_t r = rank();
  std::vector<bool> seen(r, false);
  bool ok = perm.size() == r;
  for (std::size_t p : perm) {
    ok = ok && p < r && !seen[p];
    if (p < r) seen[p] = true;
  }
  if (!ok) {
    std::string list;
    for (std::size_t p : perm) list += (list.empty() ? "" : ",") + std::to_string(p);
    throw std::invalid_argument("permute of a view of shape " + shape_string(shape_) + " by (" +
                                list + "): not a permutation of its " + std::to_string(r) +
                                " dimensions");
  }
  std::vector<std::size_t> stride(r, 1);
  for (std::size_t i = r; i-- > 1;) stride[i - 1] = stride[i] * shape_[i];
  View v;
  v.dtype_ = dtype_;
  v.shape_.resize(r);
  std::vector<std::size_t> st(r);
  for (std::size_t i = 0; i < r; ++i) {
    v.shape_[i] = shape_[perm[i]];
    st[i] = stride[perm[i]];
  }
  if (elements() == 0 || r == 0) {
    v.regions_ = regions_;
    return v;
  }
  // Walk the new shape in row-major order; the innermost dimension is one run when it is
  // contiguous in this view, else one element at a time.
  Picker pick(regions_);
  const std::size_t inner = v.shape_[r - 1], s = st[r - 1];
  std::vector<std::size_t> idx(r - 1, 0);
  std::size_t base = 0;
  for (;;) {
    if (s == 1)
      pick.take(base, base + inner, v.regions_);
    else
      for (std::size_t j = 0; j < inner; ++j) pick.take(base + j * s, base + j * s + 1, v.regions_);
    std::size_t d = r - 1;
    while (d > 0) {  // odometer over dimensions 0 .. r-2
      --d;
      base += st[d];
      if (++idx[d] < v.shape_[d]) break;
      base -= st[d] * idx[d];
      idx[d] = 0;
      if (d == 0) return v;
    }
    if (r == 1) return v;
  }
}

View View::transpose() const {
  if (rank() < 2)
    throw std::invalid_argument("transpose of a view of shape " + shape_string(shape_) +
                                ": needs at least two dimensions");
  std::vector<std::size_t> perm(rank());
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  std::swap(perm[rank() - 1], perm[rank() - 2]);
  return permute(perm);
}

View View::broadcast(std::size_t n, std::size_t dim) const {
  if (dim >= rank())
    throw std::out_of_range("broadcast along dimension " + std::to_string(dim) +
                            " of a view of shape " + shape_string(shape_));
  const std::size_t outer = product_of(shape_, 0, dim);
  const std::size_t chunk = product_of(shape_, dim, rank());
  View v;
  v.dtype_ = dtype_;
  v.shape_ = shape_;
  v.shape_[dim] *= n;
  Picker pick(regions_);
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < n; ++i) pick.take(o * chunk, (o + 1) * chunk, v.regions_);
  return v;
}

View View::expand(const std::vector<std::size_t>& shape) const {
  const auto fail = [&] {
    return std::invalid_argument("cannot broadcast a view of shape " + shape_string(shape_) +
                                 " to " + shape_string(shape));
  };
  if (shape.size() < rank()) throw fail();
  std::vector<std::size_t> padded(shape.size() - rank(), 1);
  padded.insert(padded.end(), shape_.begin(), shape_.end());
  View v = reshape(padded);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (padded[d] == shape[d]) continue;
    if (padded[d] != 1) throw fail();
    v = v.broadcast(shape[d], d);
  }
  return v;
}

View View::concat(const std::vector<View>& parts, std::size_t dim) {
  if (parts.empty()) throw std::invalid_argument("concat of no views");
  const View& first = parts[0];
  if (dim >= first.rank())
    throw std::out_of_range("concat along dimension " + std::to_string(dim) +
                            " of views of shape " + shape_string(first.shape_));
  View v;
  v.dtype_ = first.dtype_;
  v.shape_ = first.shape_;
  v.shape_[dim] = 0;
  for (const View& p : parts) {
    bool same = p.rank() == first.rank() && p.dtype_ == first.dtype_;
    for (std::size_t d = 0; same && d < p.rank(); ++d)
      same = d == dim || p.shape_[d] == first.shape_[d];
    if (!same)
      throw std::invalid_argument("concat along dimension " + std::to_string(dim) + " of a " +
                                  dtype_name(p.dtype_) + " view of shape " +
                                  shape_string(p.shape_) + " with a " + dtype_name(first.dtype_) +
                                  " view of shape " + shape_string(first.shape_));
    v.shape_[dim] += p.shape_[dim];
  }
  const std::size_t outer = product_of(first.shape_, 0, dim);
  std::vector<Picker> pickers;
  std::vector<std::size_t> chunks;
  pickers.reserve(parts.size());
  for (const View& p : parts) {
    pickers.emplace_back(p.regions_);
    chunks.push_back(product_of(p.shape_, dim, p.rank()));
  }
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < parts.size(); ++i)
      pickers[i].take(o * chunks[i], (o + 1) * chunks[i], v.regions_);
  return v;
}

std::vector<Tensor> View::regions() const {
  std::vector<Tensor> out;
  out.reserve(regions_.size());
  for (const auto& r : regions_)
    out.emplace_back(r.var, r.begin, std::vector{r.end - r.begin}, dtype_);
  return out;
}

bool View::has_repeats() const {
  if (regions_.size() < 2) return false;
  std::vector<ViewRegion> sorted = regions_;
  std::sort(sorted.begin(), sorted.end(),
            [](auto& a, auto& b) { return a.var != b.var ? a.var < b.var : a.begin < b.begin; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].var == sorted[i - 1].var && sorted[i].begin < sorted[i - 1].end) return true;
  return false;
}

Graph::Graph(const ArchPreset& arch) : arch_(arch) {}

void Graph::set_available_memory_proportion(double proportion) {
  if (!(proportion > 0 && proportion <= 1))
    throw std::invalid_argument("available memory proportion must be in (0, 1], got " +
                                std::to_string(proportion));
  available_memory_proportion_ = proportion;
}

Tensor Graph::add_variable(DType dtype, std::vector<std::size_t> shape, std::string name,
                           MemoryCategory category) {
  Variable v;
  v.name = std::move(name);
  v.dtype = dtype;
  v.shape = shape;
  v.elements = product(shape);
  // Far beyond any IPU's memory; the graph's tables count a variable's elements in 32 bits.
  if (v.elements > UINT32_MAX)
    throw std::invalid_argument("variable '" + v.name + "' of " + std::to_string(v.elements) +
                                " elements: at most 2^32 - 1 elements per variable");
  v.category = category;
  variables_.push_back(std::move(v));
  ++tensors_made_;
  return Tensor(static_cast<VariableId>(variables_.size() - 1), 0, std::move(shape), dtype);
}

void Graph::set_tile_mapping(const Tensor& t, unsigned tile) {
  if (tile >= arch_.tiles)
    throw std::out_of_range("tile " + std::to_string(tile) + " of " + describe(t) +
                            " is outside the IPU's " + std::to_string(arch_.tiles) + " tiles");
  if (t.elements() == 0) return;
  auto& m = variables_.at(t.variable()).mapping;
  for (auto& o : ordinals_)
    if (o.var == t.variable()) o.var = ~VariableId{0};  // counted before this change
  // Within a variable, so under 2^32 (see add_variable).
  const auto b = static_cast<std::uint32_t>(t.offset()),
             e = static_cast<std::uint32_t>(t.offset() + t.elements());
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

Tensor Graph::append_piece(VariableId var, std::vector<std::size_t> shape, unsigned tile) {
  Variable& v = variables_.at(var);
  if (v.shape.size() != 1)
    throw std::logic_error("append_piece: '" + v.name + "' is not one-dimensional");
  const std::size_t offset = v.elements;
  if (offset > 0) ++tensors_made_;
  Tensor piece(var, offset, std::move(shape), v.dtype);
  if (offset + piece.elements() > UINT32_MAX)
    throw std::invalid_argument("variable '" + v.name +
                                "' would grow past 2^32 - 1 elements; use another variable");
  v.elements += piece.elements();
  v.shape = {v.elements};
  set_tile_mapping(piece, tile);
  return piece;
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
  const auto b = static_cast<std::uint32_t>(t.offset()),
             e = static_cast<std::uint32_t>(t.offset() + t.elements());
  std::vector<TileInterval> out;
  auto it = std::upper_bound(m.begin(), m.end(), b,
                             [](std::size_t x, const TileInterval& iv) { return x < iv.end; });
  for (; it != m.end() && it->begin < e; ++it)
    out.push_back({std::max(it->begin, b) - b, std::min(it->end, e) - b, it->tile});
  return out;
}

std::vector<TileInterval> Graph::tile_mapping(const View& v) const {
  if (v.elements() > UINT32_MAX)
    throw std::invalid_argument("tile mapping of a view of " + std::to_string(v.elements()) +
                                " elements: at most 2^32 - 1");
  std::vector<TileInterval> out;
  std::uint32_t pos = 0;
  for (const auto& r : v.view_regions()) {
    const auto n = static_cast<std::uint32_t>(r.end - r.begin);
    for (const auto& iv : tile_mapping(Tensor(r.var, r.begin, {n}, v.dtype()))) {
      if (!out.empty() && out.back().tile == iv.tile && out.back().end == pos + iv.begin)
        out.back().end = pos + iv.end;
      else
        out.push_back({pos + iv.begin, pos + iv.end, iv.tile});
    }
    pos += n;
  }
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

std::string Graph::describe(const Tensor& t) const {
  const auto& v = variables_.at(t.variable());
  if (t.offset() == 0 && t.elements() == v.elements) return "'" + v.name + "'";
  return "'" + v.name + "'[" + std::to_string(t.offset()) + ":" +
         std::to_string(t.offset() + t.elements()) + "]";
}

std::string Graph::describe(const View& v) const {
  const auto& rs = v.view_regions();
  if (rs.size() == 1 && rs[0].end - rs[0].begin == v.elements())
    return describe(Tensor(rs[0].var, rs[0].begin, {v.elements()}, v.dtype()));
  std::string s = "a view of shape " + shape_string(v.shape()) + " over " +
                  std::to_string(rs.size()) + " regions (";
  for (std::size_t i = 0; i < std::min<std::size_t>(rs.size(), 3); ++i)
    s += (i ? ", " : "") +
         describe(Tensor(rs[i].var, rs[i].begin, {rs[i].end - rs[i].begin}, v.dtype()));
  return s + (rs.size() > 3 ? ", ...)" : ")");
}

}  // namespace ipupod::ipu

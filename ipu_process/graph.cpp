// Device graph: variables, tile mappings, tensor views and compute sets.
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

namespace {
// Sorts a compute set's accesses by variable and merges each variable's written ranges that
// touch or overlap: what the liveness walk sees of them (a read, and which elements are
// written) is unchanged, and an op whose vertices write a variable in a scattered order (a
// convolution's output, tile by tile) keeps a few ranges of it rather than one per vertex.
void merge_accesses(ComputeSet& cs) {
  auto& a = cs.accesses;
  std::sort(a.begin(), a.end(), [](const ComputeSet::Access& x, const ComputeSet::Access& y) {
    return std::tie(x.var, x.write, x.begin) < std::tie(y.var, y.write, y.begin);
  });
  std::size_t kept = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (kept > 0) {
      ComputeSet::Access& last = a[kept - 1];
      if (last.var == a[i].var && last.write == a[i].write &&
          (!a[i].write || a[i].begin <= last.end)) {
        last.end = std::max(last.end, a[i].end);
        continue;
      }
    }
    a[kept++] = a[i];
  }
  a.resize(kept);
}

void shrink_tables(ComputeSet& cs) {
  cs.vertices.shrink_to_fit();
  cs.field_ends.shrink_to_fit();
  cs.entries.shrink_to_fit();
  cs.params.shrink_to_fit();
  cs.slice_cycles.shrink_to_fit();
  cs.accesses.shrink_to_fit();
}
}  // namespace

void Graph::release_vertex_tables(ComputeSetId id) {
  ComputeSet& cs = compute_sets_.at(id);
  std::vector<VertexRecord>().swap(cs.vertices);
  std::vector<std::uint32_t>().swap(cs.field_ends);
  std::vector<RegionEntry>().swap(cs.entries);
  std::vector<std::uint32_t>().swap(cs.slice_cycles);
  cs.params.clear();
  std::vector<ComputeSet::Head>().swap(cs.heads);
  cs.released = true;
}

void Graph::release_mapping(VariableId var) {
  std::vector<TileInterval>().swap(variables_.at(var).mapping);
}

void Graph::shrink_to_fit() {
  for (ComputeSet& cs : compute_sets_) shrink_tables(cs);
  compute_sets_.shrink_to_fit();
  variables_.shrink_to_fit();
}

void Graph::settle() {
  for (std::size_t i = settled_compute_sets_; i < compute_sets_.size(); ++i) {
    merge_accesses(compute_sets_[i]);
    shrink_tables(compute_sets_[i]);
  }
  for (std::size_t i = settled_variables_; i < variables_.size(); ++i)
    variables_[i].mapping.shrink_to_fit();
  settled_compute_sets_ = compute_sets_.size();
  last_access_.clear();
  param_lists_.clear();
  param_lists_of_ = ~ComputeSetId{0};
  settled_variables_ = variables_.size();
}

ComputeSetId Graph::add_compute_set(std::string name) {
  ComputeSet cs;
  cs.name = std::move(name);
  compute_sets_.push_back(std::move(cs));
  return static_cast<ComputeSetId>(compute_sets_.size() - 1);
}

namespace {
// Appends to `out` the cycles of each worker slice of a vertex with several, each a vertex of
// its own as the codelet's estimator sees it. Checks the slicing (see Vertex).
template <class Where>
void add_slice_cycles(const Codelet& codelet, const Vertex& vertex, const ArchPreset& arch,
                      const Where& where, std::vector<std::uint32_t>& out) {
  const std::size_t n = vertex.slices, p = codelet.slice_params.size();
  if (codelet.sliced_mask == 0)
    throw std::logic_error(where() + " has " + std::to_string(n) +
                           " worker slices, but its codelet slices no field");
  for (std::size_t f = 0; f < vertex.fields.size(); ++f)
    if ((codelet.sliced_mask >> f & 1U) && vertex.fields[f].size() != n)
      throw std::logic_error(where() + " has " + std::to_string(n) + " worker slices, but " +
                             std::to_string(vertex.fields[f].size()) + " regions in field '" +
                             codelet.fields[f] + "'");
  if (vertex.params.size() < (n - 1) * p)
    throw std::logic_error(where() + ": too few parameters for its slices");
  const std::size_t base = vertex.params.size() - (n - 1) * p;
  for (std::size_t i : codelet.slice_params)
    if (i >= base) throw std::logic_error(where() + ": slice parameter out of range");
  thread_local Vertex one;
  one.codelet = vertex.codelet;
  one.tile = vertex.tile;
  one.fields.resize(vertex.fields.size());
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t f = 0; f < vertex.fields.size(); ++f) {
      if (codelet.sliced_mask >> f & 1U)
        one.fields[f].assign(1, vertex.fields[f][k]);
      else
        one.fields[f] = vertex.fields[f];
    }
    one.params.assign(vertex.params.begin(),
                      vertex.params.begin() + static_cast<std::ptrdiff_t>(base));
    if (k > 0)
      for (std::size_t j = 0; j < p; ++j)
        one.params[codelet.slice_params[j]] = vertex.params[base + (k - 1) * p + j];
    const std::uint64_t cycles = codelet.cycles(one, arch);
    if (cycles > UINT32_MAX)
      throw std::logic_error(where() + ": a worker slice of over 2^32 cycles; make it a vertex");
    out.push_back(static_cast<std::uint32_t>(cycles));
  }
}
}  // namespace

void Graph::add_vertex(ComputeSetId cs_id, const Vertex& vertex) {
  ComputeSet& cs = compute_sets_.at(cs_id);
  const Codelet& codelet = CodeletRegistry::builtin().get(vertex.codelet);
  const auto where = [&] {
    return "vertex " + std::to_string(cs.vertices.size()) + " (" + vertex.codelet +
           ") of compute set '" + cs.name + "'";
  };
  if (vertex.fields.size() != codelet.fields.size())
    throw std::logic_error(where() + " connects " + std::to_string(vertex.fields.size()) +
                           " fields, the codelet has " + std::to_string(codelet.fields.size()));
  if (vertex.tile >= tiles())
    throw std::logic_error(where() + " is on tile " + std::to_string(vertex.tile) +
                           ", not a tile of the IPU");
  VertexRecord record;
  if (vertex.slices <= 1) {
    record.cycles = codelet.cycles(vertex, arch_);
  } else {
    if (vertex.slices > UINT32_MAX) throw std::logic_error(where() + ": too many worker slices");
    record.cycles = cs.slice_cycles.size();
    add_slice_cycles(codelet, vertex, arch_, where, cs.slice_cycles);
    record.slices = static_cast<std::uint32_t>(vertex.slices);
  }
  record.tile = vertex.tile;
  record.first_field = static_cast<std::uint32_t>(cs.field_ends.size());
  record.first_param = static_cast<std::uint32_t>(cs.params.size());
  record.codelet = codelet.index;
  record.fields = static_cast<std::uint8_t>(vertex.fields.size());
  record.params = static_cast<std::uint32_t>(vertex.params.size());
  std::size_t regions = 0;
  for (const auto& field : vertex.fields) regions += field.size();
  if (cs.region_count + regions > UINT32_MAX ||
      cs.params.size() + vertex.params.size() > UINT32_MAX)
    throw std::logic_error("compute set '" + cs.name +
                           "' would hold more than 2^32 regions or parameters; split it");
  std::size_t state_regions = 0;
  std::size_t last_entry = kNoEntry;  // the field's last first entry (see add_region_entry)
  for (std::size_t f = 0; f < vertex.fields.size(); ++f) {
    VariableId run_var = ~VariableId{0};
    std::size_t run_begin = 0, run_end = 0;
    for (const Tensor& region : vertex.fields[f]) {
      // The run of tile memory the field's previous regions formed, continued or a new one.
      const std::size_t b = region.offset(), e = b + region.elements();
      if (region.variable() == run_var && b >= run_begin &&
          (b <= run_end || next_in_tile_memory(run_var, vertex.tile, run_end, b))) {
        run_end = std::max(run_end, e);
      } else {
        ++state_regions, run_var = region.variable(), run_begin = b, run_end = e;
      }
      const Variable& var = variables_.at(region.variable());
      if (region.dtype() != var.dtype || region.elements() > UINT32_MAX)
        throw std::logic_error(where() + ": region " + describe(region) + " of " +
                               std::to_string(region.elements()) + " " +
                               dtype_name(region.dtype()) + " elements of a " +
                               dtype_name(var.dtype) + " variable");
      ++cs.region_count;
      if (keep_vertex_regions_)
        add_region_entry(cs, last_entry, region);
      else
        add_access(cs_id, codelet, f, vertex.tile, region, where);
    }
    if (keep_vertex_regions_) {
      last_entry = kNoEntry;  // a field's repeats stay within it
      cs.field_ends.push_back(static_cast<std::uint32_t>(cs.entries.size()));
    }
  }
  if (keep_vertex_regions_)
    cs.vertex_state_regions.push_back(static_cast<std::uint32_t>(state_regions));
  else
    record.first_field = static_cast<std::uint32_t>(state_regions);
  if (keep_vertex_params_) {
    std::span<const double> list = vertex.params;
    if (const std::size_t k = codelet.shared_params; k > 0 && list.size() >= k) {
      auto head = std::find_if(cs.heads.begin(), cs.heads.end(), [&](const ComputeSet::Head& h) {
        return h.codelet == codelet.index;
      });
      if (head == cs.heads.end())
        head =
            cs.heads.insert(cs.heads.end(), {codelet.index, shared_params(cs_id, list.first(k))});
      if (cs.params.holds(head->begin, list.first(k))) {
        list = list.subspan(k);
        record.flags |= VertexRecord::kHeaded;
      }
    }
    record.first_param = shared_params(cs_id, list);
    record.params = static_cast<std::uint32_t>(list.size());
  } else {
    record.params = 0;
  }
  cs.vertices.push_back(record);
}

void Graph::add_region_entry(ComputeSet& cs, std::size_t& last, const Tensor& region) {
  const auto offset = static_cast<std::uint32_t>(region.offset());
  const auto elements = static_cast<std::uint32_t>(region.elements());
  const VariableId var = region.variable();
  if (var >= RegionEntry::kRepeated)
    throw std::length_error("a graph holds fewer than 2^31 variables");
  auto& e = cs.entries;
  // The field's last entry, extended when the region repeats it at a constant distance.
  if (last != kNoEntry && (e[last].var & ~RegionEntry::kRepeated) == var &&
      e[last].elements == elements) {
    RegionEntry& first = e[last];
    if ((first.var & RegionEntry::kRepeated) != 0) {
      RegionEntry& repeat = e[last + 1];
      const auto stride = std::int64_t{static_cast<std::int32_t>(repeat.var)};
      if (std::int64_t{first.offset} + std::int64_t{repeat.offset} * stride == offset &&
          repeat.offset < UINT32_MAX) {
        ++repeat.offset;
        return;
      }
    } else {
      const std::int64_t stride = std::int64_t{offset} - std::int64_t{first.offset};
      if (stride >= INT32_MIN && stride <= INT32_MAX) {
        first.var |= RegionEntry::kRepeated;
        e.push_back({2, static_cast<VariableId>(static_cast<std::int32_t>(stride)), 0});
        return;
      }
    }
  }
  last = e.size();
  e.push_back({offset, var, elements});
}

std::uint32_t Graph::shared_params(ComputeSetId cs_id, std::span<const double> params) {
  ComputeSet& cs = compute_sets_[cs_id];
  if (param_lists_of_ != cs_id) param_lists_.clear(), param_lists_of_ = cs_id;
  std::uint64_t h = 14695981039346656037ULL ^ params.size();  // FNV-1a over the bit patterns
  for (double x : params) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    h = (h ^ bits) * 1099511628211ULL;
  }
  const auto [it, added] =
      param_lists_.try_emplace(h, static_cast<std::uint32_t>(cs.params.size()));
  if (!added && it->second + params.size() <= cs.params.size() &&
      cs.params.holds(it->second, params))
    return it->second;
  it->second = static_cast<std::uint32_t>(cs.params.size());  // new, or another list's hash
  cs.params.append(params);
  return it->second;
}

void ParamTable::append(std::span<const double> values) {
  if (!wide_ && !std::all_of(values.begin(), values.end(), [](double x) {
        return std::bit_cast<std::uint64_t>(static_cast<double>(static_cast<float>(x))) ==
               std::bit_cast<std::uint64_t>(x);
      })) {
    doubles_.assign(floats_.begin(), floats_.end());
    std::vector<float>().swap(floats_);
    wide_ = true;
  }
  if (wide_)
    doubles_.insert(doubles_.end(), values.begin(), values.end());
  else
    for (double x : values) floats_.push_back(static_cast<float>(x));
}

bool ParamTable::holds(std::size_t at, std::span<const double> values) const {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (std::bit_cast<std::uint64_t>((*this)[at + i]) != std::bit_cast<std::uint64_t>(values[i]))
      return false;
  return true;
}

std::size_t Graph::interval_after(VariableId var, std::size_t x) {
  const auto& m = variables_.at(var).mapping;
  if (hint_var_ == var)
    for (std::size_t k = hint_; k < m.size() && k < hint_ + 4; ++k)
      if (x < m[k].end && (k == 0 || m[k - 1].end <= x)) return hint_ = k;
  hint_var_ = var;
  hint_ = static_cast<std::size_t>(
      std::upper_bound(m.begin(), m.end(), x,
                       [](std::size_t y, const TileInterval& iv) { return y < iv.end; }) -
      m.begin());
  return hint_;
}

bool Graph::next_in_tile_memory(VariableId var, unsigned tile, std::size_t end, std::size_t begin) {
  const auto& mapping = variables_.at(var).mapping;
  const auto a = mapping.begin() + static_cast<std::ptrdiff_t>(interval_after(var, end - 1));
  const auto b = mapping.begin() + static_cast<std::ptrdiff_t>(interval_after(var, begin));
  if (a == mapping.end() || b == mapping.end() || a->end != end || b->begin != begin ||
      a->tile != tile || b->tile != tile || b <= a)
    return false;
  // The tile's next interval when no interval between the two is the tile's: a short gap is
  // looked at, a long one counted once per variable.
  if (b - a <= 64)
    return std::none_of(a + 1, b, [&](const TileInterval& iv) { return iv.tile == tile; });
  IntervalOrdinals* found = nullptr;
  for (auto& o : ordinals_)
    if (o.var == var && o.intervals == mapping.size()) found = &o;
  if (!found) {  // count each tile's intervals in order
    found = &ordinals_[next_ordinals_++ % ordinals_.size()];
    found->var = var, found->intervals = mapping.size();
    found->ordinal.resize(mapping.size());
    std::vector<std::uint32_t> seen(tiles(), 0);
    for (std::size_t i = 0; i < mapping.size(); ++i) found->ordinal[i] = seen[mapping[i].tile]++;
  }
  return found->ordinal[static_cast<std::size_t>(b - mapping.begin())] ==
         found->ordinal[static_cast<std::size_t>(a - mapping.begin())] + 1;
}

void Graph::add_access(ComputeSetId cs_id, const Codelet& codelet, std::size_t field, unsigned tile,
                       const Tensor& region, const std::function<std::string()>& where) {
  // The checks an engine makes of a region (Engine::compile), made now: on the vertex's tile,
  // within one interval of the mapping (contiguous in tile memory). Unmapped elements have no
  // tile memory, as an engine sees them.
  const Variable& var = variables_.at(region.variable());
  const std::size_t b = region.offset(), e = b + region.elements();
  auto it = var.mapping.begin() + static_cast<std::ptrdiff_t>(interval_after(region.variable(), b));
  std::size_t pieces = 0;
  for (; it != var.mapping.end() && it->begin < e; ++it, ++pieces)
    if (it->tile != tile)
      throw std::logic_error(where() + " on tile " + std::to_string(tile) + ": field '" +
                             codelet.fields[field] + "' is connected to " + describe(region) +
                             " which lives on tile " + std::to_string(it->tile) +
                             "; a vertex may only touch its own tile's memory (copy the data "
                             "first)");
  if (pieces > 1)
    throw std::logic_error(where() + ": field '" + codelet.fields[field] + "' region " +
                           describe(region) +
                           " is not contiguous in tile memory; split it into regions");
  ComputeSet& cs = compute_sets_[cs_id];
  const bool write = codelet.is_output(field);
  const std::uint64_t key =
      (std::uint64_t{cs_id} << 33) | (std::uint64_t{region.variable()} << 1) | (write ? 1 : 0);
  if (auto found = last_access_.find(key); found != last_access_.end()) {
    ComputeSet::Access& last = cs.accesses[found->second];
    if (!write) return;  // a read is a read, whichever elements
    if (last.end == b) {
      last.end = static_cast<std::uint32_t>(e);
      return;
    }
  }
  last_access_[key] = cs.accesses.size();
  cs.accesses.push_back(
      {region.variable(), static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(e), write});
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

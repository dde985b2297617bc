// Device graph, its compute sets: vertices packed into each compute set's tables (records,
// region entries, shared parameter lists and heads), or only their accesses in a graph lowered
// to be planned; settling, releasing and the tile-memory checks of their regions.
#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/graph.hpp"

namespace ipupod::ipu {

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
  std::vector<std::uint32_t>().swap(cs.vertex_state_regions);
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
// Whether the vertex's worker slices' parameters step evenly (see VertexRecord::kStepped):
// then `out` holds its list as the graph keeps it, the values before the slices' followed by
// one step per slice parameter. Slice k's value is rebuilt as value + k * step, so each must
// come out exactly.
bool stepped_slices(const Codelet& codelet, const Vertex& vertex, std::vector<double>& out) {
  const std::size_t n = vertex.slices, p = codelet.slice_params.size();
  if (n < 3 || p == 0) return false;  // with two slices the list is no longer
  const std::size_t base = vertex.params.size() - (n - 1) * p;
  out.assign(vertex.params.begin(), vertex.params.begin() + static_cast<std::ptrdiff_t>(base));
  for (std::size_t j = 0; j < p; ++j) {
    const double first = vertex.params[codelet.slice_params[j]];
    const double step = vertex.params[base + j] - first;
    for (std::size_t k = 1; k < n; ++k)
      if (std::bit_cast<std::uint64_t>(first + static_cast<double>(k) * step) !=
          std::bit_cast<std::uint64_t>(vertex.params[base + (k - 1) * p + j]))
        return false;
    out.push_back(step);
  }
  return true;
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
    thread_local std::vector<double> stepped;
    if (stepped_slices(codelet, vertex, stepped)) {
      list = stepped;
      record.flags |= VertexRecord::kStepped;
    }
    // The values after the base list: each later slice's, or the steps.
    const std::size_t p = codelet.slice_params.size(), from = codelet.shared_from;
    const std::size_t slice_values = vertex.slices <= 1 ? 0
                                     : (record.flags & VertexRecord::kStepped) != 0
                                         ? p
                                         : (vertex.slices - 1) * p;
    std::size_t k = codelet.shared_params;
    if (k == Codelet::kSharedToEnd)
      k = list.size() >= slice_values + from ? list.size() - slice_values - from : 0;
    if (k > 0 && k <= UINT16_MAX && list.size() >= from + k) {
      const std::span<const double> shared = list.subspan(from, k);
      // One head per codelet (the engine finds it by codelet).
      auto head = std::find_if(cs.heads.begin(), cs.heads.end(), [&](const ComputeSet::Head& h) {
        return h.codelet == codelet.index;
      });
      if (head == cs.heads.end())
        head = cs.heads.insert(cs.heads.end(), {codelet.index, static_cast<std::uint16_t>(k),
                                                shared_params(cs_id, shared)});
      if (head->length == k && cs.params.holds(head->begin, shared)) {
        thread_local std::vector<double> own;
        own.assign(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(from));
        own.insert(own.end(), list.begin() + static_cast<std::ptrdiff_t>(from + k), list.end());
        list = own;
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

void ParamTable::widen(Width to) {
  if (to <= width_) return;
  if (to == Width::f32) {
    floats_.assign(u16_.begin(), u16_.end());
  } else {
    doubles_.reserve(size());
    for (std::size_t i = 0; i < size(); ++i) doubles_.push_back((*this)[i]);
    std::vector<float>().swap(floats_);
  }
  std::vector<std::uint16_t>().swap(u16_);
  width_ = to;
}

void ParamTable::append(std::span<const double> values) {
  const auto same_bits = [](double x, double y) {
    return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
  };
  Width need = Width::u16;
  for (double x : values) {
    if (need == Width::u16 && x >= 0 && x <= UINT16_MAX &&
        same_bits(static_cast<double>(static_cast<std::uint16_t>(x)), x))
      continue;
    need = same_bits(static_cast<double>(static_cast<float>(x)), x) ? Width::f32 : Width::f64;
    if (need == Width::f64) break;
  }
  widen(need);
  switch (width_) {
    case Width::u16:
      for (double x : values) u16_.push_back(static_cast<std::uint16_t>(x));
      break;
    case Width::f32:
      for (double x : values) floats_.push_back(static_cast<float>(x));
      break;
    case Width::f64:
      doubles_.insert(doubles_.end(), values.begin(), values.end());
      break;
  }
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

}  // namespace ipupod::ipu

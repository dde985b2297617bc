// The engine's compiled programs, shared by its compilation and execution (nothing outside the
// engine includes this): compute sets with their vertices, exchanges, the tree of program nodes.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "float16/half.hpp"
#include "ipu_process/engine.hpp"

namespace ipupod::ipu {

// Where each tile's items start in a run table (tiles + 1 rising values, or none): 16-bit while
// the table holds fewer than 2^16 items (most compute sets and exchanges do), else 32-bit.
class TileStarts {
 public:
  TileStarts() = default;
  explicit TileStarts(const std::vector<std::uint32_t>& starts) {
    if (!starts.empty() && starts.back() <= UINT16_MAX)
      narrow_.assign(starts.begin(), starts.end());
    else
      wide_ = starts;
  }
  bool empty() const { return narrow_.empty() && wide_.empty(); }
  std::size_t size() const { return narrow_.empty() ? wide_.size() : narrow_.size(); }
  std::size_t operator[](std::size_t t) const { return narrow_.empty() ? wide_[t] : narrow_[t]; }

 private:
  std::vector<std::uint16_t> narrow_;
  std::vector<std::uint32_t> wide_;
};

struct Engine::CompiledComputeSet {
  // A vertex as the run table keeps it, 16 bytes: where its fields' region entries and its
  // parameters start, its codelet (by registry index), and flags. A vertex with several
  // worker slices has as many as its first sliced field has regions (see Vertex).
  struct VertexRuntime {
    static constexpr std::uint8_t kWidensFloat16 = 1;  // float16 regions seen as float32
    static constexpr std::uint8_t kSliced = 2;         // worker slices (see Vertex::slices)
    static constexpr std::uint8_t kHeaded = 4;         // its parameters hold its codelet's head
    static constexpr std::uint8_t kStepped = 8;        // its slices' parameters step evenly
    // Each of its fields is one entry, or one repeated entry and its count (most vertices'
    // are): field_begin points into `regions`, and it has no field ends.
    static constexpr std::uint8_t kOneEntryAField = 16;
    std::uint32_t field_begin;  // into field_ends, or (kOneEntryAField) into regions
    std::uint32_t param_begin;  // into params
    std::uint32_t param_count;
    std::uint16_t codelet;  // Codelet::index
    std::uint8_t field_count;
    std::uint8_t flags = 0;
    const Codelet& code() const { return CodeletRegistry::builtin().at(codelet); }
    bool widens_float16() const { return (flags & kWidensFloat16) != 0; }
  };
  static_assert(sizeof(VertexRuntime) == 16);
  // A region as the run table keeps it, 8 bytes: its offset in the tile memory block, its
  // element count and dtype (a region lies on one tile: far fewer than 2^28 elements). The
  // regions of a vertex become Regions only while it runs. A field's consecutive regions of
  // one size and dtype at a constant distance in tile memory are one entry marked kRepeated
  // and a second entry holding their count (in `offset`) and the distance in bytes (in
  // `elements_and_dtype`, as int32), as RegionEntry does in the graph.
  struct PackedRegion {
    static constexpr std::uint32_t kNull = UINT32_MAX;  // no tile memory (an empty region)
    static constexpr std::uint32_t kRepeated = 8;       // in the dtype bits: a count follows
    std::uint32_t offset = kNull;
    std::uint32_t elements_and_dtype = 0;  // elements << 4 | dtype (| kRepeated)
    Region unpack(std::byte* base) const {
      return {offset == kNull ? nullptr : base + offset, elements_and_dtype >> 4,
              static_cast<DType>(elements_and_dtype & 7U)};
    }
  };
  std::vector<PackedRegion> regions;
  // A vertex's field f (without kOneEntryAField) holds the entries regions[field_ends[b + f] ..
  // field_ends[b + f + 1]), b its field_begin: where its first field starts, then where each
  // field ends.
  std::vector<std::uint32_t> field_ends;

  // Appends a region of a field to `table`, as a repeat of the field's last entry (index
  // `last`, kNoEntry when the field has none yet) when it continues one.
  static constexpr std::size_t kNoEntry = ~std::size_t{0};
  static void add_region(std::vector<PackedRegion>& table, std::size_t& last, PackedRegion r) {
    if (last != kNoEntry && r.offset != PackedRegion::kNull &&
        table[last].offset != PackedRegion::kNull &&
        (table[last].elements_and_dtype & ~PackedRegion::kRepeated) == r.elements_and_dtype) {
      PackedRegion& first = table[last];
      if ((first.elements_and_dtype & PackedRegion::kRepeated) != 0) {
        PackedRegion& repeat = table[last + 1];
        const auto stride = std::int64_t{static_cast<std::int32_t>(repeat.elements_and_dtype)};
        if (std::int64_t{first.offset} + std::int64_t{repeat.offset} * stride == r.offset) {
          ++repeat.offset;
          return;
        }
      } else {
        const std::int64_t stride = std::int64_t{r.offset} - std::int64_t{first.offset};
        if (stride >= INT32_MIN && stride <= INT32_MAX) {
          first.elements_and_dtype |= PackedRegion::kRepeated;
          table.push_back({2, static_cast<std::uint32_t>(static_cast<std::int32_t>(stride))});
          return;
        }
      }
    }
    last = table.size();
    table.push_back(r);
  }

  // Calls f(region) for each region of entries [begin, end).
  template <class F>
  void for_each_in(std::size_t begin, std::size_t end, F&& f) const {
    for (std::size_t e = begin; e < end; ++e) {
      Region r = regions[e].unpack(base);
      if ((regions[e].elements_and_dtype & PackedRegion::kRepeated) == 0) {
        f(r);
        continue;
      }
      const PackedRegion& repeat = regions[++e];
      const auto stride =
          static_cast<std::ptrdiff_t>(static_cast<std::int32_t>(repeat.elements_and_dtype));
      for (std::uint32_t i = 0; i < repeat.offset; ++i, r.data += stride) f(r);
    }
  }
  std::byte* base = nullptr;  // the tile memory block
  // The vertices' parameters, as the graph keeps them (16-bit, float32 or float64: see
  // ParamTable).
  ParamTable params;
  std::vector<ComputeSet::Head> heads;  // as the graph's (see VertexRecord::kHeaded)
  double param(std::size_t i) const { return params[i]; }
  std::vector<VertexRuntime> vertices;

  // In tile order: the vertices of tile t are vertices[tile_begin[t] .. tile_begin[t + 1]), in
  // graph order.
  TileStarts tile_begin;
  std::uint64_t cycles = 0;  // max over tiles of the busiest worker

  // Calls f(data, bytes) for each region of each vertex.
  template <class F>
  void for_each_region(F&& f) const {
    for_each_in(0, regions.size(),
                [&](const Region& r) { f(r.data, std::size_t{r.elements} * dtype_size(r.dtype)); });
  }

  // Vertex i of the compute set's `run`-th execution in the engine's life (keys stochastic
  // rounding, so draws differ from run to run but not with the thread count).
  void run_vertex(std::size_t i, const Float16Stores& stores, std::uint64_t run) const {
    const VertexRuntime& v = vertices[i];
    // The vertex's fields as Regions, in per-thread scratch.
    thread_local std::vector<Region> unpacked;
    thread_local std::vector<std::size_t> field_starts;
    thread_local std::vector<std::span<const Region>> vertex_fields;
    unpacked.clear();
    field_starts.resize(v.field_count + 1);
    const bool one_entry_a_field = (v.flags & VertexRuntime::kOneEntryAField) != 0;
    for (std::size_t f = 0, e = v.field_begin; f < v.field_count; ++f) {
      field_starts[f] = unpacked.size();
      const std::size_t k = v.field_begin + f;
      const std::size_t begin = one_entry_a_field ? e : field_ends[k];
      const std::size_t end = !one_entry_a_field ? field_ends[k + 1]
                              : (regions[e].elements_and_dtype & PackedRegion::kRepeated) != 0
                                  ? e + 2
                                  : e + 1;
      for_each_in(begin, end, [](const Region& r) { unpacked.push_back(r); });
      e = end;
    }
    field_starts[v.field_count] = unpacked.size();
    vertex_fields.resize(v.field_count);
    for (std::size_t f = 0; f < v.field_count; ++f)
      vertex_fields[f] = std::span<const Region>(unpacked.data() + field_starts[f],
                                                 field_starts[f + 1] - field_starts[f]);
    const Codelet& codelet = v.code();
    std::span<const double> vertex_params;
    if (params.width() != ParamTable::Width::f64 || (v.flags & VertexRuntime::kHeaded) != 0) {
      // The head and the vertex's own, as float64 values.
      thread_local std::vector<double> assembled;
      assembled.clear();
      std::size_t own = 0;
      if ((v.flags & VertexRuntime::kHeaded) != 0) {
        std::size_t at = 0;
        while (heads[at].codelet != v.codelet) ++at;
        for (; own < codelet.shared_from; ++own) assembled.push_back(param(v.param_begin + own));
        for (std::size_t j = 0; j < heads[at].length; ++j)
          assembled.push_back(param(heads[at].begin + j));
      }
      for (; own < v.param_count; ++own) assembled.push_back(param(v.param_begin + own));
      vertex_params = assembled;
    } else {
      vertex_params = std::span(params.doubles()).subspan(v.param_begin, v.param_count);
    }
    const std::uint64_t key = counter_hash(counter_hash(stores.seed ^ counter_hash(run)) + i);
    if ((v.flags & VertexRuntime::kSliced) == 0) {
      run_slice(v, codelet, vertex_fields, vertex_params, stores.rounding, key);
      return;
    }
    // A MultiVertex: worker slice k sees region k of each sliced field and its own values of
    // the slice parameters (see Vertex), each slice 0's plus k steps when they step evenly
    // (see VertexRecord::kStepped).
    thread_local std::vector<std::span<const Region>> slice_fields;
    thread_local std::vector<double> slice_params;
    const std::size_t slices = vertex_fields[std::countr_zero(codelet.sliced_mask)].size();
    const std::size_t p = codelet.slice_params.size();
    const bool stepped = (v.flags & VertexRuntime::kStepped) != 0;
    const std::size_t base_params = vertex_params.size() - (stepped ? 1 : slices - 1) * p;
    slice_params.assign(vertex_params.begin(),
                        vertex_params.begin() + static_cast<std::ptrdiff_t>(base_params));
    slice_fields.assign(vertex_fields.begin(), vertex_fields.end());
    for (std::size_t k = 0; k < slices; ++k) {
      for (std::size_t f = 0; f < vertex_fields.size(); ++f)
        if (codelet.sliced_mask >> f & 1U) slice_fields[f] = vertex_fields[f].subspan(k, 1);
      if (k > 0 && stepped)
        for (std::size_t j = 0; j < p; ++j)
          slice_params[codelet.slice_params[j]] =
              vertex_params[codelet.slice_params[j]] +
              static_cast<double>(k) * vertex_params[base_params + j];
      else if (k > 0)
        for (std::size_t j = 0; j < p; ++j)
          slice_params[codelet.slice_params[j]] = vertex_params[base_params + (k - 1) * p + j];
      run_slice(v, codelet, slice_fields, slice_params, stores.rounding,
                k == 0 ? key : counter_hash(key + k));
    }
  }

 private:
  static void run_slice(const VertexRuntime& v, const Codelet& codelet,
                        std::span<const std::span<const Region>> fields,
                        std::span<const double> params, Rounding rounding, std::uint64_t key) {
    if (v.widens_float16())
      run_widened(codelet, fields, params, rounding, key);
    else
      codelet.compute(VertexContext(fields, params));
  }

  // Gives the codelet float32 copies of its float16 regions, then stores back, rounded, each
  // element the codelet changed (untouched inputs are never written, so vertices that share an
  // input on a tile do not race).
  static void run_widened(const Codelet& codelet, std::span<const std::span<const Region>> in,
                          std::span<const double> vertex_params, Rounding rounding,
                          std::uint64_t key) {
    struct Scratch {
      std::vector<float> values, before;
      std::vector<float16::Half> narrowed;
      std::vector<Region> regions;
      std::vector<std::span<const Region>> fields;
    };
    thread_local Scratch s;
    // Every float16 widened once, in a table: widening is most of the work of a float16 vertex.
    static const std::vector<float> widened = [] {
      std::vector<float> table(1U << 16);
      for (std::uint32_t b = 0; b < table.size(); ++b)
        table[b] = float16::to_float(float16::Half{static_cast<std::uint16_t>(b)});
      return table;
    }();
    std::size_t halves = 0, count = 0;
    for (const auto& f : in)
      for (const Region& r : f) {
        ++count;
        if (r.dtype == DType::f16) halves += r.elements;
      }
    s.values.resize(halves);
    s.regions.clear();
    s.regions.reserve(count);
    std::size_t at = 0;
    for (const auto& f : in)
      for (const Region& r : f) {
        if (r.dtype != DType::f16) {
          s.regions.push_back(r);
          continue;
        }
        const auto* bits = reinterpret_cast<const std::uint16_t*>(r.data);
        for (std::size_t j = 0; j < r.elements; ++j) s.values[at + j] = widened[bits[j]];
        s.regions.push_back(
            {reinterpret_cast<std::byte*>(s.values.data() + at), r.elements, DType::f32});
        at += r.elements;
      }
    s.before = s.values;
    s.fields.clear();
    std::size_t cursor = 0;
    for (const auto& f : in) {
      s.fields.emplace_back(s.regions.data() + cursor, f.size());
      cursor += f.size();
    }
    codelet.compute(VertexContext(s.fields, vertex_params));
    at = 0;
    std::uint64_t region_index = 0;
    for (const auto& f : in)
      for (const Region& r : f) {
        ++region_index;
        if (r.dtype != DType::f16) continue;
        const float* now = s.values.data() + at;
        const float* was = s.before.data() + at;
        at += r.elements;
        if (std::memcmp(now, was, r.elements * sizeof(float)) == 0) continue;  // an input
        const std::uint64_t region_key = counter_hash(key + region_index);
        auto* out = reinterpret_cast<std::uint16_t*>(r.data);
        if (rounding == Rounding::stochastic) {
          for (std::size_t j = 0; j < r.elements; ++j)
            if (std::memcmp(now + j, was + j, sizeof(float)) != 0)
              out[j] = float16::to_half_stochastic(now[j], counter_hash(region_key + j)).bits;
          continue;
        }
        // To nearest: the whole region at once (F16C where the CPU has it), then the elements
        // the codelet wrote (an element it left keeps its bits, a NaN's payload too).
        s.narrowed.resize(r.elements);
        float16::narrow(std::span(now, r.elements), s.narrowed);
        for (std::size_t j = 0; j < r.elements; ++j)
          if (std::memcmp(now + j, was + j, sizeof(float)) != 0) out[j] = s.narrowed[j].bits;
      }
  }
};

struct Engine::CompiledExchange {
  // `count` rows of `bytes` bytes to one tile, in order, addressed by their offsets in the tile
  // memory block (`base`). Three kinds, 24 bytes each:
  // - strided: row r from src + r * src_stride to dst + r * dst_stride, all from one tile (the
  //   rows of a tile's block of channel planes: one record);
  // - a gather (src == kGather) fills its destination row after row from sources anywhere:
  //   row r comes from sources[src_stride + r] + dst_stride (the shift, modulo 2^32), 4 bytes a
  //   row (the pieces of a channel block that many tiles' planes make up), and nothing at all
  //   when its sources are an earlier gather's shifted (the next block of the same planes);
  // - a list (src == kList) holds `count` single rows of any size and place,
  //   rows[src_stride .. src_stride + count), 12 bytes each.
  struct Transfer {
    static constexpr std::uint32_t kGather = UINT32_MAX, kList = UINT32_MAX - 1;
    std::uint32_t src, dst;
    std::uint32_t bytes, count;
    std::uint32_t src_stride, dst_stride;
    bool gather() const { return src == kGather; }
    bool list() const { return src == kList; }
    bool strided() const { return src < kList; }
    // The bytes from the first row's start to the last row's end (what a check must assume a
    // strided transfer reads, and a strided transfer or a gather writes).
    std::size_t src_span() const { return span(src_stride); }
    std::size_t dst_span() const {
      return gather() ? std::size_t{count} * bytes : span(dst_stride);
    }

   private:
    std::size_t span(std::uint32_t stride) const { return std::size_t{count - 1} * stride + bytes; }
  };
  struct Row {
    std::uint32_t src, dst, bytes;
  };
  // Tile memory offsets below this bound (the block is smaller; see allocate_memory).
  static constexpr std::size_t kMaxOffset = Transfer::kList;

  // When no transfer reads bytes that a transfer writes, the transfers are grouped by
  // destination tile (program order within a tile): those of tile t are
  // transfers[tile_begin[t] .. tile_begin[t + 1]), and tiles can be filled in any order or at
  // once, with the same result. Otherwise tile_begin is empty and they run in program order.
  std::vector<Transfer> transfers;
  std::vector<std::uint32_t> sources;  // the gathers' rows' source offsets
  std::vector<Row> rows;               // the lists' rows
  std::byte* base = nullptr;           // the tile memory block
  TileStarts tile_begin;
  std::uint64_t cycles = 0;

  // Once the transfers are in their final order (grouped by the tile starts given, or in
  // program order when there are none): runs of rows that fill a destination one after
  // another become gathers, and runs of other single rows become lists. Sets tile_begin.
  void compact(std::vector<std::uint32_t> tile_starts);

  // Calls f(data, bytes) for what transfer t reads (its span, or each row) and writes.
  template <class F>
  void for_each_read(const Transfer& t, F&& f) const {
    if (t.strided()) {
      f(base + t.src, t.src_span());
    } else if (t.gather()) {
      for (std::uint32_t r = 0; r < t.count; ++r) f(base + gathered(t, r), t.bytes);
    } else {
      for (std::uint32_t r = 0; r < t.count; ++r) {
        const Row& row = rows[t.src_stride + r];
        f(base + row.src, std::size_t{row.bytes});
      }
    }
  }
  template <class F>
  void for_each_write(const Transfer& t, F&& f) const {
    if (!t.list()) {
      f(base + t.dst, t.dst_span());
      return;
    }
    for (std::uint32_t r = 0; r < t.count; ++r) {
      const Row& row = rows[t.src_stride + r];
      f(base + row.dst, std::size_t{row.bytes});
    }
  }
  void run(const Transfer& t) const {  // a row may read what an earlier row wrote
    if (t.list()) {
      for (std::uint32_t r = 0; r < t.count; ++r) {
        const Row& row = rows[t.src_stride + r];
        std::memmove(base + row.dst, base + row.src, row.bytes);
      }
      return;
    }
    // A gather's rows fill its destination one after another (its dst_stride is the shift).
    const std::size_t dst_stride = t.gather() ? t.bytes : t.dst_stride;
    for (std::uint32_t r = 0; r < t.count; ++r)
      std::memmove(base + t.dst + std::size_t{r} * dst_stride,
                   base + (t.gather() ? gathered(t, r) : t.src + std::size_t{r} * t.src_stride),
                   t.bytes);
  }
  void run_disjoint(const Transfer& t) const {  // reads nothing any transfer writes
    std::byte* dst = base + t.dst;
    if (t.gather()) {
      const std::uint32_t* from = sources.data() + t.src_stride;
      switch (t.bytes) {  // the common sizes as fixed-size copies, not calls
        case 2:
          return gather_rows<2>(dst, from, t.dst_stride, t.count);
        case 4:
          return gather_rows<4>(dst, from, t.dst_stride, t.count);
        case 8:
          return gather_rows<8>(dst, from, t.dst_stride, t.count);
        case 16:
          return gather_rows<16>(dst, from, t.dst_stride, t.count);
        case 32:
          return gather_rows<32>(dst, from, t.dst_stride, t.count);
        default:
          for (std::uint32_t r = 0; r < t.count; ++r)
            std::memcpy(dst + std::size_t{r} * t.bytes, base + (from[r] + t.dst_stride), t.bytes);
          return;
      }
    }
    if (t.list()) {
      for (std::uint32_t r = 0; r < t.count; ++r) {
        const Row& row = rows[t.src_stride + r];
        std::memcpy(base + row.dst, base + row.src, row.bytes);
      }
      return;
    }
    const std::byte* src = base + t.src;
    if (t.count == 1 || (t.src_stride == t.bytes && t.dst_stride == t.bytes)) {
      std::memcpy(dst, src, std::size_t{t.count} * t.bytes);
      return;
    }
    for (std::uint32_t r = 0; r < t.count; ++r)
      std::memcpy(dst + std::size_t{r} * t.dst_stride, src + std::size_t{r} * t.src_stride,
                  t.bytes);
  }

 private:
  std::uint32_t gathered(const Transfer& t, std::uint32_t r) const {
    return sources[t.src_stride + r] + t.dst_stride;  // modulo 2^32
  }
  template <std::size_t N>
  void gather_rows(std::byte* dst, const std::uint32_t* from, std::uint32_t shift,
                   std::uint32_t count) const {
    for (std::uint32_t r = 0; r < count; ++r)
      std::memcpy(dst + std::size_t{r} * N, base + std::uint32_t(from[r] + shift), N);
  }
};

struct Engine::Node {
  Program::Kind kind = Program::Kind::sequence;
  std::vector<Node> children;
  std::size_t index = 0;  // compute set or exchange
  // An execute that runs tile by tile right after the exchange before it (see fuse_exchanges).
  std::optional<std::size_t> exchange;
  // A sequence of such executes that runs group by group of tiles (see chain_tile_steps): the
  // tiles of group g are group_tiles[group_begin[g] .. group_begin[g + 1]), in tile order.
  std::vector<unsigned> group_tiles;
  std::vector<std::size_t> group_begin;
  std::uint64_t count = 0;  // repeat count
  SyncKind sync = SyncKind::internal;
  CollectiveOp op = CollectiveOp::sum;
  std::string stream;
  std::vector<Piece> pieces;  // stream and collective data or the predicate, in element order
  std::size_t bytes = 0;
  std::vector<Piece> out_pieces;  // reduce_scatter's block, all_gather's result
  std::size_t out_bytes = 0;
  DType dtype = DType::f32;
  std::string name;            // for the trace
  unsigned peer = 0, tag = 0;  // send and receive
};

}  // namespace ipupod::ipu

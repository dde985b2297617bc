// The device graph of one IPU, in Poplar's vocabulary: variables mapped onto tiles, tensors
// (contiguous views of variables), views (ordered lists of regions of variables: slices,
// transposes, broadcasts and concatenations that copy nothing), compute sets of vertices, and
// host streams.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ipu_process/arch.hpp"
#include "ipu_process/planning.hpp"
#include "ipu_process/shape.hpp"

namespace ipupod::ipu {

struct Codelet;

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
  Tensor(VariableId var, std::size_t offset, Shape shape, DType dtype);

  VariableId variable() const { return var_; }
  std::size_t offset() const { return offset_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::size_t elements() const;
  std::size_t rank() const { return shape_.size(); }
  std::size_t dim(std::size_t i) const { return shape_.at(i); }

  Tensor flatten() const { return Tensor(var_, offset_, Shape{elements()}, dtype_); }
  Tensor reshape(std::vector<std::size_t> shape) const;    // same element count, no copy
  Tensor slice(std::size_t begin, std::size_t end) const;  // flat elements, no copy
  Tensor row(std::size_t i) const;                         // index the first dimension
  Tensor rows(std::size_t begin, std::size_t end) const;   // range of the first dimension

 private:
  std::size_t offset_ = 0;
  VariableId var_ = 0;
  Shape shape_;  // inline: a Tensor is 48 bytes and allocates nothing
  DType dtype_ = DType::f32;
};

// A contiguous run [begin, end) of the elements of one variable.
struct ViewRegion {
  VariableId var = 0;
  std::size_t begin = 0, end = 0;
  bool operator==(const ViewRegion&) const = default;
};

// A view that copies nothing, like a Poplar tensor: an ordered list of contiguous regions of
// variables (possibly of several variables, possibly naming the same elements more than once,
// as a broadcast does) read in order as the elements of a row-major logical shape. Every
// operation makes a new list of regions of the same variables: no variable, no byte, no copy.
// A Tensor converts to a View of one region; Program::copy, vertex fields (through regions())
// and Graph::tile_mapping accept views.
class View {
 public:
  View() = default;       // empty: shape {0}
  View(const Tensor& t);  // NOLINT(google-explicit-constructor): every tensor is a view
  // The given regions of one dtype read in order as `shape`; adjacent runs are merged.
  View(std::vector<ViewRegion> regions, std::vector<std::size_t> shape, DType dtype);

  const std::vector<std::size_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::size_t elements() const;
  std::size_t rank() const { return shape_.size(); }
  std::size_t dim(std::size_t i) const { return shape_.at(i); }

  View reshape(std::vector<std::size_t> shape) const;  // same element count
  View flatten() const { return reshape({elements()}); }
  // Elements [begin, end) of dimension `dim`; the other dimensions whole.
  View slice(std::size_t begin, std::size_t end, std::size_t dim = 0) const;
  // Index i of dimension `dim`, which goes away (rank - 1).
  View index(std::size_t i, std::size_t dim = 0) const;
  // Dimension i of the result is dimension perm[i] of this view (Poplar's dimShuffle).
  View permute(const std::vector<std::size_t>& perm) const;
  View transpose() const;  // swaps the last two dimensions
  // This view repeated n times along `dim` (Poplar's broadcast): size dim(d) becomes n * dim(d);
  // a dimension of size 1 becomes n copies of the same elements.
  View broadcast(std::size_t n, std::size_t dim) const;
  // Numpy-style broadcast to `shape`: dimensions aligned from the right, size-1 dimensions
  // (and missing leading ones) repeated.
  View expand(const std::vector<std::size_t>& shape) const;
  // The parts side by side along `dim`: same rank and dtype, the same sizes elsewhere.
  static View concat(const std::vector<View>& parts, std::size_t dim);

  // The regions in element order, adjacent runs merged (what a vertex field connects to).
  const std::vector<ViewRegion>& view_regions() const { return regions_; }
  std::vector<Tensor> regions() const;
  bool contiguous() const { return regions_.size() <= 1; }
  // Whether some element of a variable appears more than once (a broadcast, or a concat of a
  // view with itself): such a view may be read but not written.
  bool has_repeats() const;

 private:
  std::vector<ViewRegion> regions_;
  std::vector<std::size_t> shape_ = {0};  // the empty view by default
  DType dtype_ = DType::f32;
};

// 12 bytes: a full-size stage maps tens of millions of intervals, and a variable (or a view)
// holds fewer than 2^32 elements.
struct TileInterval {
  std::uint32_t begin = 0, end = 0;  // elements of the variable
  std::uint32_t tile = 0;
};

struct Variable {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;  // inline: a full-size graph has millions of variables
  std::size_t elements = 0;
  MemoryCategory category = MemoryCategory::activation;
  bool host_access = false;           // read or written by the host: live for the whole run
  std::vector<TileInterval> mapping;  // sorted, disjoint, adjacent same-tile runs merged
};

// A vertex as an op library builds it: one codelet instance on one tile. Each field is a list
// of regions (like Poplar's Vector<Input<Vector<T>>>); every region must live on the vertex's
// tile. Graph::add_vertex packs it into its compute set's tables (VertexRecord below).
//
// A vertex of a codelet with sliced fields (Codelet::sliced) may do several workers' work, as
// Poplar's MultiVertex does: with `slices` > 1 each sliced field holds `slices` regions, and
// worker slice k sees region k of each sliced field, the other fields whole, and the
// parameters with the codelet's slice parameters (Codelet::slice_params) set to slice k's
// values, which follow the others in `params`: for k = 1 .. slices - 1, one value each. It costs
// one record on the host, and each slice keeps the cycles of a vertex of its own.
struct Vertex {
  std::string codelet;
  unsigned tile = 0;
  std::vector<std::vector<Tensor>> fields;  // in the codelet's field order
  std::vector<double> params;               // scalar parameters (sizes, flags, factors)
  std::size_t slices = 1;                   // worker slices
};

// One region of a vertex field as the graph keeps it: elements [offset, offset + elements) of
// a variable, whose dtype it has.
struct FieldRegion {
  std::uint32_t offset = 0;  // a variable holds fewer than 2^32 elements (see add_variable)
  VariableId var = 0;
  std::uint32_t elements = 0;
};

// An entry of a compute set's region table (12 bytes): a FieldRegion, or the first of a field's
// consecutive regions of one variable and one size at a constant distance (a channel's rows,
// a block's planes: most regions of an elementwise or normalising vertex come so), which the
// entry after it counts: `count` regions, region i at offset + i * stride.
struct RegionEntry {
  static constexpr VariableId kRepeated = VariableId{1} << 31;  // a repeat entry follows
  std::uint32_t offset = 0;
  VariableId var = 0;  // | kRepeated
  std::uint32_t elements = 0;
};
static_assert(sizeof(RegionEntry) == 12);

// A vertex as the graph keeps it, in the spirit of Poplar's compact vertex state: a record of
// a few tens of bytes; its fields' regions and its parameters live in the compute set's shared
// tables, so a full-size model's millions of vertices allocate nothing each.
struct VertexRecord {
  // Its worker's busy cycles (the codelet's estimate); with several slices, where the slices'
  // cycles start in ComputeSet::slice_cycles.
  std::uint64_t cycles = 0;
  std::uint32_t tile = 0;
  // Its field f ends at ComputeSet::field_ends[first_field + f]; in a graph without regions
  // (Graph::drop_vertex_regions), its vertex-state region count (see
  // Graph::add_vertex).
  std::uint32_t first_field = 0;
  std::uint32_t first_param = 0;  // into ComputeSet::params
  std::uint32_t params = 0;
  std::uint32_t slices = 1;   // worker slices (see Vertex)
  std::uint16_t codelet = 0;  // the codelet's index in the registry (Codelet::index)
  std::uint8_t fields = 0;
  // Its parameters are the `params` at first_param with its codelet's shared head
  // (ComputeSet::heads) put in at the codelet's shared_from.
  static constexpr std::uint8_t kHeaded = 1;
  // Its worker slices' parameters step evenly (slice k's value of slice parameter j is slice
  // 0's plus k times a step: a MultiVertex's pieces one after another): its list ends with the
  // codelet's slice_params.size() steps instead of every slice's values (see Vertex).
  static constexpr std::uint8_t kStepped = 2;
  std::uint8_t flags = 0;
};
static_assert(sizeof(VertexRecord) == 32);

// A compute set's vertex parameters, in the narrowest of three widths that holds every value
// bit for bit: 16-bit while every value is an integer from 0 to 65535 (sizes, offsets, flags:
// a convolution's are all so), float32 while every value is one (most factors are), float64
// from the first that is not. A table only widens.
class ParamTable {
 public:
  enum class Width : std::uint8_t { u16, f32, f64 };
  std::size_t size() const {
    return width_ == Width::u16   ? u16_.size()
           : width_ == Width::f32 ? floats_.size()
                                  : doubles_.size();
  }
  double operator[](std::size_t i) const {
    return width_ == Width::u16 ? u16_[i] : width_ == Width::f32 ? floats_[i] : doubles_[i];
  }
  Width width() const { return width_; }
  bool is_float() const { return width_ != Width::f64; }  // held as float32 values or narrower
  std::size_t bytes() const {
    return u16_.capacity() * 2 + floats_.capacity() * 4 + doubles_.capacity() * 8;
  }
  const std::vector<double>& doubles() const { return doubles_; }  // once Width::f64
  void append(std::span<const double> values);
  // Whether values [at, at + values.size()) hold `values`, bit for bit.
  bool holds(std::size_t at, std::span<const double> values) const;
  void shrink_to_fit() {
    u16_.shrink_to_fit();
    floats_.shrink_to_fit();
    doubles_.shrink_to_fit();
  }
  void clear() { *this = ParamTable(); }

 private:
  void widen(Width to);
  std::vector<std::uint16_t> u16_;
  std::vector<float> floats_;
  std::vector<double> doubles_;
  Width width_ = Width::u16;
};

struct ComputeSet {
  std::string name;
  std::vector<VertexRecord> vertices;
  // Field k (over the whole compute set) holds the regions of entries[field_ends[k - 1] ..
  // field_ends[k]) (see RegionEntry).
  std::vector<std::uint32_t> field_ends;
  std::vector<RegionEntry> entries;
  ParamTable params;
  // The parameters a codelet's vertices share (Codelet::shared_params), as the first of its
  // vertices with that many has them (a convolution's geometry): kept once, `length` values at
  // `begin`, for the vertices whose lists hold them alike (at the codelet's shared_from).
  struct Head {
    std::uint16_t codelet = 0;
    std::uint16_t length = 0;
    std::uint32_t begin = 0;
  };
  std::vector<Head> heads;
  std::vector<std::uint32_t> slice_cycles;  // of the worker slices of vertices with several
  // In a graph that drops its vertices' regions (Graph::drop_vertex_regions): what the vertices
  // read and write, as the memory plan sees it (a variable read at all; the ranges written by
  // output fields, touching ones merged (by settle)), and how many regions they had (in all, and
  // each vertex in its record's first_field: there are no field ends).
  struct Access {
    VariableId var = 0;
    std::uint32_t begin = 0, end = 0;
    bool write = false;
  };
  std::vector<Access> accesses;
  std::size_t region_count = 0;
  // The vertex-state regions of each vertex (see Graph::add_vertex), in a graph that keeps its
  // regions (see regions_of).
  std::vector<std::uint32_t> vertex_state_regions;
  bool released = false;  // the vertex tables were freed (see Graph::release_vertex_tables)

  std::uint64_t cycles_of(const VertexRecord& v, std::size_t slice) const {
    return v.slices == 1 ? v.cycles : slice_cycles[v.cycles + slice];
  }

  // Calls fn(FieldRegion) for each region of the vertex's field f, in order.
  template <class F>
  void for_each_region(const VertexRecord& v, std::size_t f, F&& fn) const {
    const std::size_t k = v.first_field + f;
    for (std::size_t e = k == 0 ? 0 : field_ends[k - 1]; e < field_ends[k]; ++e) {
      const RegionEntry& entry = entries[e];
      FieldRegion r{entry.offset, entry.var & ~RegionEntry::kRepeated, entry.elements};
      if ((entry.var & RegionEntry::kRepeated) == 0) {
        fn(r);
        continue;
      }
      const RegionEntry& repeat = entries[++e];  // count, stride (as int32)
      const auto stride = static_cast<std::int32_t>(repeat.var);
      for (std::uint32_t i = 0; i < repeat.offset;
           ++i, r.offset += static_cast<std::uint32_t>(stride))
        fn(r);
    }
  }
  // Its vertex-state regions (see Graph::add_vertex).
  std::size_t regions_of(const VertexRecord& v) const {
    if (field_ends.empty()) return v.first_field;  // without regions: their count (see Access)
    return vertex_state_regions[static_cast<std::size_t>(&v - vertices.data())];
  }
};

class Graph {
 public:
  explicit Graph(const ArchPreset& arch);

  const ArchPreset& arch() const { return arch_; }
  unsigned tiles() const { return arch_.tiles; }
  // The share of each tile's memory the op planners may plan one op's data for (Poplar's
  // availableMemoryProportion); in (0, 1].
  double available_memory_proportion() const { return available_memory_proportion_; }
  void set_available_memory_proportion(double proportion);
  // Whether the matrix unit keeps float16 products' partial sums in float16 (PopTorch's
  // Precision.setPartialsType(torch.half)): the AMP's faster FP16.16 rate in the cycle
  // estimates. Sums are still accumulated in float32 here (see MatMulBlock and ConvForward).
  bool half_partials() const { return half_partials_; }
  void set_half_partials(bool half) { half_partials_ = half; }

  Tensor add_variable(DType dtype, std::vector<std::size_t> shape, std::string name,
                      MemoryCategory category = MemoryCategory::activation);
  void set_tile_mapping(const Tensor& t, unsigned tile);
  // Grows the one-dimensional variable `var` by a piece of `shape` at its end, mapped to
  // `tile`, and returns the piece (see ops::TilePieces): tensors of earlier pieces stay valid.
  Tensor append_piece(VariableId var, std::vector<std::size_t> shape, unsigned tile);
  // Lets the host read and write the tensor's variable between program runs (like Poplar's
  // createHostRead/createHostWrite); such a variable keeps its bytes for the whole run.
  void set_host_access(const Tensor& t);
  // Spread the tensor over tiles [first_tile, first_tile + tile_count) in pieces that are
  // whole multiples of grain elements, as evenly as possible.
  void map_linearly(const Tensor& t, std::size_t grain = 1, unsigned first_tile = 0,
                    unsigned tile_count = 0);
  std::vector<TileInterval> tile_mapping(const Tensor& t) const;  // in the tensor's elements
  // In the view's elements (logical order), adjacent same-tile runs merged.
  std::vector<TileInterval> tile_mapping(const View& v) const;
  // The single tile holding every element of t, or throws naming the tensor and the tiles.
  unsigned tile_of(const Tensor& t) const;

  // For a graph that will only be planned, never run (ipupod compile): vertices keep no
  // parameters once their cycles are estimated (an engine that can run refuses such a graph).
  void drop_vertex_params() { keep_vertex_params_ = false; }
  bool keeps_vertex_params() const { return keep_vertex_params_; }
  // The same for the vertices' field regions: each vertex is checked against its tile when it
  // is added (its regions must lie on its tile, each contiguous in tile memory), and a compute
  // set keeps only what the memory plan needs of them (ComputeSet::accesses) and their count.
  void drop_vertex_regions() { keep_vertex_regions_ = false; }
  bool keeps_vertex_regions() const { return keep_vertex_regions_; }

  ComputeSetId add_compute_set(std::string name);
  // Frees the compute set's vertex records, field regions and parameters, keeping its name
  // (an engine keeps its own copy of what it runs): an engine built with
  // Engine::ReleaseGraphTables does this once it has compiled the compute set, so that a
  // training rank does not hold every vertex twice. The compute set cannot be compiled again.
  void release_vertex_tables(ComputeSetId cs);
  // Frees the variable's tile mapping: such an engine does this, once built, for the variables
  // the host cannot access (their tile addresses are in its compiled programs). The variable
  // cannot be mapped, compiled or resolved again.
  void release_mapping(VariableId var);
  // Gives back what the compute sets' tables reserved for growth (call when lowering is done).
  void shrink_to_fit();
  // The same for the compute sets and variables made since the last call (call between ops: a
  // full-size model's lowering would otherwise hold a third more than its tables need).
  void settle();
  // Checks the vertex against its codelet (known, its field count, every region of one
  // variable's dtype), estimates its cycles and packs it; std::invalid_argument or
  // std::logic_error naming the vertex otherwise. Counts its vertex-state regions: a field's
  // consecutive regions of one variable that follow each other in the tile's memory (they
  // touch, overlap, or continue in the variable's next interval on the tile: a variable's
  // elements on a tile are one block in element order) count as one region, as PopLibs' vertices
  // take a tile's contiguous regions (Graph::getSortedContiguousRegions) and share them out
  // between workers by offsets.
  void add_vertex(ComputeSetId cs, const Vertex& vertex);

  // How many tensors the graph has made: its variables, each piece a variable grew by after
  // its first counting as one more (what spreads an op's small outputs over the tiles, so that
  // the layout does not depend on how the op libraries group their temporaries).
  std::size_t tensors_made() const { return tensors_made_; }
  const Variable& variable(VariableId id) const { return variables_.at(id); }
  const std::deque<Variable>& variables() const { return variables_; }
  const std::vector<ComputeSet>& compute_sets() const { return compute_sets_; }
  // A vertex field's region as a flat tensor of its variable.
  Tensor tensor(const FieldRegion& r) const {
    return Tensor(r.var, r.offset, {r.elements}, variables_.at(r.var).dtype);
  }
  std::string describe(const Tensor& t) const;  // "name[offset:offset+n]" for messages
  std::string describe(const View& v) const;    // its regions, for messages

 private:
  double available_memory_proportion_ = kDefaultAvailableMemoryProportion;
  bool half_partials_ = false;
  const ArchPreset& arch_;
  std::deque<Variable> variables_;  // grows without moving: millions at full size
  std::size_t tensors_made_ = 0;
  // Without regions: checks one region of field `field` of a vertex on `tile` and adds it to
  // the compute set's accesses.
  void add_access(ComputeSetId cs, const Codelet& codelet, std::size_t field, unsigned tile,
                  const Tensor& region, const std::function<std::string()>& where);

  // Whether elements [.., end) and [begin, ..) of variable `var` follow each other in `tile`'s
  // memory: end closes one of its intervals on the tile and begin opens the next.
  bool next_in_tile_memory(VariableId var, unsigned tile, std::size_t end, std::size_t begin);
  // The first interval of var's mapping that ends after element x (the mapping's size when
  // none does). A vertex's regions mostly come in element order: the search starts from the
  // interval found last, before halving the whole mapping.
  std::size_t interval_after(VariableId var, std::size_t x);
  VariableId hint_var_ = ~VariableId{0};
  std::size_t hint_ = 0;
  // Adds a region of a vertex field to the compute set's entries, as a repeat of the field's
  // last entry (index `last`, kNoEntry when the field has none yet) when it continues one.
  static constexpr std::size_t kNoEntry = ~std::size_t{0};
  static void add_region_entry(ComputeSet& cs, std::size_t& last, const Tensor& region);
  // Where compute set cs_id's params hold `params`: an equal list already there, or appended.
  std::uint32_t shared_params(ComputeSetId cs_id, std::span<const double> params);
  // Per interval of a variable, how many of its intervals on the same tile precede it (for
  // next_in_tile_memory; a few variables at a time, as one op's vertices use a few).
  struct IntervalOrdinals {
    VariableId var = ~VariableId{0};
    std::size_t intervals = 0;
    std::vector<std::uint32_t> ordinal;
  };
  std::array<IntervalOrdinals, 8> ordinals_;
  std::size_t next_ordinals_ = 0;

  bool keep_vertex_params_ = true;
  bool keep_vertex_regions_ = true;
  // Without regions: the last access of each (compute set, variable, write) since the last
  // settle(), so that a run of adjacent regions becomes one access.
  std::unordered_map<std::uint64_t, std::size_t> last_access_;
  // The parameter lists of the compute set being filled, by hash, to where ComputeSet::params
  // holds them: vertices with the same parameters (one geometry on many tiles) share one copy.
  std::unordered_map<std::uint64_t, std::uint32_t> param_lists_;
  ComputeSetId param_lists_of_ = ~ComputeSetId{0};
  std::vector<ComputeSet> compute_sets_;
  std::size_t settled_compute_sets_ = 0, settled_variables_ = 0;  // see settle()
};

}  // namespace ipupod::ipu

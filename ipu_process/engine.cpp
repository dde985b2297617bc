// Engine: compile (checks, memory, exchange plans, cycle estimates) and BSP execution.
#include "ipu_process/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <sstream>

#include "fabric/half.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ipupod::ipu {

CycleBreakdown& CycleBreakdown::operator+=(const CycleBreakdown& o) {
  compute += o.compute;
  exchange += o.exchange;
  sync += o.sync;
  host += o.host;
  fabric += o.fabric;
  return *this;
}

CycleBreakdown CycleBreakdown::operator-(const CycleBreakdown& o) const {
  return {compute - o.compute, exchange - o.exchange, sync - o.sync, host - o.host,
          fabric - o.fabric};
}

std::size_t MemoryReport::total_bytes() const {
  return std::accumulate(tiles.begin(), tiles.end(), std::size_t{0},
                         [](std::size_t s, const TileMemory& t) { return s + t.total(); });
}

const TileMemory& MemoryReport::busiest() const {
  return *std::max_element(tiles.begin(), tiles.end(),
                           [](auto& a, auto& b) { return a.total() < b.total(); });
}

std::size_t MemoryReport::tiles_over() const {
  return std::count_if(tiles.begin(), tiles.end(),
                       [&](const TileMemory& t) { return t.total() > bytes_per_tile; });
}

struct Engine::CompiledComputeSet {
  struct VertexRuntime {
    const Codelet* codelet;
    unsigned tile;
    std::size_t field_begin, field_count, param_begin, param_count;
    bool widens_float16 = false;  // has float16 regions and sees them as float32
  };
  std::vector<Region> regions;
  std::vector<std::size_t> region_bytes;  // of each region
  std::vector<std::span<const Region>> fields;
  std::vector<double> params;
  std::vector<VertexRuntime> vertices;
  // The vertices of tile t are by_tile[tile_begin[t] .. tile_begin[t + 1]), in graph order.
  std::vector<std::size_t> tile_begin, by_tile;
  std::uint64_t cycles = 0;  // max over tiles of the busiest worker

  // Vertex i of the compute set's `run`-th execution in the engine's life (keys stochastic
  // rounding, so draws differ from run to run but not with the thread count).
  void run_vertex(std::size_t i, const Float16Stores& stores, std::uint64_t run) const {
    const VertexRuntime& v = vertices[i];
    const auto vertex_fields = std::span(fields).subspan(v.field_begin, v.field_count);
    const auto vertex_params = std::span(params).subspan(v.param_begin, v.param_count);
    if (v.widens_float16)
      run_widened(v, vertex_fields, vertex_params, stores.rounding,
                  counter_hash(counter_hash(stores.seed ^ counter_hash(run)) + i));
    else
      v.codelet->compute(VertexContext(vertex_fields, vertex_params));
  }

 private:
  // Gives the codelet float32 copies of its float16 regions, then stores back, rounded, each
  // element the codelet changed (untouched inputs are never written, so vertices that share an
  // input on a tile do not race).
  static void run_widened(const VertexRuntime& v, std::span<const std::span<const Region>> in,
                          std::span<const double> vertex_params, Rounding rounding,
                          std::uint64_t key) {
    struct Scratch {
      std::vector<float> values, before;
      std::vector<Region> regions;
      std::vector<std::span<const Region>> fields;
    };
    thread_local Scratch s;
    // Every float16 widened once, in a table: widening is most of the work of a float16 vertex.
    static const std::vector<float> widened = [] {
      std::vector<float> table(1U << 16);
      for (std::uint32_t b = 0; b < table.size(); ++b)
        table[b] = fabric::to_float(fabric::Half{static_cast<std::uint16_t>(b)});
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
    v.codelet->compute(VertexContext(s.fields, vertex_params));
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
        for (std::size_t j = 0; j < r.elements; ++j) {
          if (std::memcmp(now + j, was + j, sizeof(float)) == 0) continue;
          out[j] = (rounding == Rounding::stochastic
                        ? fabric::to_half_stochastic(now[j], counter_hash(region_key + j))
                        : fabric::to_half(now[j]))
                       .bits;
        }
      }
  }
};

struct Engine::CompiledExchange {
  struct Transfer {
    const std::byte* src;
    std::byte* dst;
    std::size_t bytes;
  };
  // When no transfer reads bytes that a transfer writes, the transfers are grouped by
  // destination tile (program order within a tile): those of tile t are
  // transfers[tile_begin[t] .. tile_begin[t + 1]), and tiles can be filled in any order or at
  // once, with the same result. Otherwise tile_begin is empty and they run in program order.
  std::vector<Transfer> transfers;
  std::vector<std::size_t> tile_begin;
  std::uint64_t cycles = 0;
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

namespace {
constexpr std::size_t kAlignment = 8;
// Host-side choice, not a hardware figure: a run of exchanges and compute sets goes group by
// group of tiles only if no group holds more than 1/kTilesPerGroupDivisor of the tiles.
constexpr unsigned kTilesPerGroupDivisor = 8;
std::size_t align_up(std::size_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

std::string format_bytes(std::size_t b) {
  std::ostringstream os;
  os << b << " B";
  return os.str();
}

// A set of byte ranges of tile memory, for the compile-time checks that decide whether data
// movements may run out of program order: add ranges, seal, then ask about overlaps.
class ByteRanges {
 public:
  void add(const std::byte* data, std::size_t bytes) {
    if (data != nullptr && bytes > 0) ranges_.emplace_back(address(data), address(data) + bytes);
  }
  void seal() {  // sorts (they often come in order) and merges, so that ends increase too
    if (!std::is_sorted(ranges_.begin(), ranges_.end())) std::sort(ranges_.begin(), ranges_.end());
    std::size_t out = 0;
    for (const auto& r : ranges_)
      if (out > 0 && r.first <= ranges_[out - 1].second)
        ranges_[out - 1].second = std::max(ranges_[out - 1].second, r.second);
      else
        ranges_[out++] = r;
    ranges_.resize(out);
  }
  bool overlaps(const std::byte* data, std::size_t bytes) const {
    if (data == nullptr || bytes == 0) return false;
    const std::uintptr_t b = address(data), e = b + bytes;
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), b,
                               [](std::uintptr_t x, const auto& r) { return x < r.second; });
    return it != ranges_.end() && it->first < e;
  }

 private:
  static std::uintptr_t address(const std::byte* p) { return reinterpret_cast<std::uintptr_t>(p); }
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges_;
};

// Offsets of each key's run in a stable counting sort of keys in [0, buckets): the items of
// key t go to positions begin[t] .. begin[t + 1]; fills order with the items' new order.
std::vector<std::size_t> group_by(const std::vector<unsigned>& keys, unsigned buckets,
                                  std::vector<std::size_t>& order) {
  std::vector<std::size_t> begin(buckets + 1, 0);
  for (unsigned k : keys) ++begin[k + 1];
  std::partial_sum(begin.begin(), begin.end(), begin.begin());
  std::vector<std::size_t> next(begin.begin(), begin.end() - 1);
  order.assign(keys.size(), 0);
  for (std::size_t i = 0; i < keys.size(); ++i) order[next[keys[i]]++] = i;
  return begin;
}
}  // namespace

Engine::Engine(const Graph& graph, std::map<std::string, Program> programs, EngineOptions options)
    : graph_(graph), options_(options), pool_(std::make_unique<ThreadPool>(options.threads)) {
  allocate_memory(programs);
  for (auto& [name, program] : programs)
    programs_.emplace(name, std::make_unique<Node>(compile(program)));
}

Engine::~Engine() = default;

namespace {

// Live range of a variable in the order program steps run: [first, last] step positions, made
// of segments with holes between them where its value is dead (after its last read, before a
// step that overwrites it whole); other variables may use its bytes in a hole.
struct LiveRange {
  std::size_t first = SIZE_MAX, last = 0;
  int program = -1;
  bool whole_run = false;  // used by several programs or by none: live throughout
  std::vector<std::pair<std::size_t, std::size_t>> segments;  // [begin, end], in order
};

// Walks the program trees, numbering every step that touches tile memory. A loop body runs
// again after its last step, so a variable whose value may carry from one iteration to the
// next (its first touch in the body can read it) stays live over the whole loop; one the body
// overwrites whole before any read (a copy's destination, a stream or receive buffer, a
// codelet's output field) needs its bytes only from that write to its last use.
class LivenessWalk {
 public:
  LivenessWalk(const Graph& graph, std::vector<LiveRange>& ranges)
      : graph_(graph),
        ranges_(ranges),
        last_touch_(ranges.size(), kNever),
        step_slot_(ranges.size(), kNone),
        killed_(ranges.size(), 0) {}

  void walk_program(const Program& p, int program) {
    program_ = program;
    walk(p);
  }

 private:
  static constexpr std::size_t kNever = SIZE_MAX;
  static constexpr std::uint32_t kNone = UINT32_MAX;
  struct Loop {
    std::size_t begin;
    std::vector<VariableId> carried;  // first touched in the body by a step that may read
    std::vector<VariableId> killed;   // first met in the body by a WriteUndef of all of it
  };
  // What one step does to one variable: reads it (or may), and which elements it overwrites.
  struct StepAccess {
    VariableId var = 0;
    bool read = false;
    std::vector<std::pair<std::size_t, std::size_t>> written;
  };

  void access(const Tensor& t, bool write_only) {
    access(t.variable(), t.offset(), t.offset() + t.elements(), write_only);
  }
  void access(VariableId id, std::size_t begin, std::size_t end, bool write_only) {
    std::uint32_t& slot = step_slot_[id];
    if (slot == kNone) {
      slot = static_cast<std::uint32_t>(step_used_);
      if (step_used_ == step_.size()) step_.emplace_back();
      StepAccess& a = step_[step_used_++];
      a.var = id;
      a.read = false;
      a.written.clear();
    }
    StepAccess& a = step_[slot];
    if (write_only)
      a.written.emplace_back(begin, end);
    else
      a.read = true;
  }
  bool writes_whole(StepAccess& a) const {
    if (a.read || a.written.empty()) return false;
    std::sort(a.written.begin(), a.written.end());
    std::size_t covered = 0;
    for (const auto& [b, e] : a.written) {
      if (b > covered) return false;
      covered = std::max(covered, e);
    }
    return covered >= graph_.variable(a.var).elements;
  }
  // Closes the step at position_: live ranges grow to it (a step that overwrites a variable
  // whole, unconditionally, starts a new segment of it), and each open loop in whose body this
  // is the variable's first touch learns whether the value may come from an earlier iteration.
  void end_step() {
    for (std::size_t i = 0; i < step_used_; ++i) {
      StepAccess& a = step_[i];
      step_slot_[a.var] = kNone;
      const std::size_t last = last_touch_[a.var];
      const bool whole = writes_whole(a);
      for (Loop& loop : loops_) {
        if (last != kNever && last >= loop.begin) continue;  // touched earlier in this body
        if (!loop.killed.empty() &&
            std::find(loop.killed.begin(), loop.killed.end(), a.var) != loop.killed.end())
          continue;
        if (!whole) loop.carried.push_back(a.var);
      }
      last_touch_[a.var] = position_;
      LiveRange& r = ranges_.at(a.var);
      if (r.program >= 0 && r.program != program_) r.whole_run = true;
      r.program = program_;
      r.first = std::min(r.first, position_);
      r.last = std::max(r.last, position_);
      // A write in a branch that may not run leaves the old value possibly live; after a
      // WriteUndef of the whole variable there is no old value.
      if (r.segments.empty() || (whole && conditional_ == 0) || killed_[a.var])
        r.segments.emplace_back(position_, position_);
      else
        r.segments.back().second = position_;
      killed_[a.var] = 0;
    }
    step_used_ = 0;
    ++position_;
  }
  // A variable carried around a loop is live over the whole loop, from the value that enters
  // it: its segments from the last one begun before the loop are merged into one.
  void carry(LiveRange& r, std::size_t begin, std::size_t end) {
    r.first = std::min(r.first, begin);
    r.last = std::max(r.last, end);
    auto& segments = r.segments;
    while (!segments.empty() && segments.back().first >= begin) segments.pop_back();
    std::size_t from = begin;
    if (!segments.empty()) {
      from = segments.back().first;
      segments.pop_back();
    }
    segments.emplace_back(from, end);
  }
  // A WriteUndef kills each variable it covers whole: for liveness it is a write of the whole
  // variable that needs no bytes, so the next touch starts a new segment, and in a loop body
  // whose first touch of the variable this is, the value does not carry over. In code that may
  // not run it ends no segment (on the path that skips it the value lives on) and speaks only
  // for loops from loops_[kill_floor_] on, which run it whenever they iterate. (The variable is
  // the unit of allocation: a WriteUndef of part of one frees nothing.)
  void write_undef(const View& v) {
    std::map<VariableId, std::vector<std::pair<std::size_t, std::size_t>>> parts;
    for (const auto& r : v.view_regions()) parts[r.var].emplace_back(r.begin, r.end);
    for (auto& [id, runs] : parts) {
      std::sort(runs.begin(), runs.end());
      std::size_t covered = 0;
      for (const auto& [b, e] : runs)
        if (b <= covered) covered = std::max(covered, e);
      if (covered < graph_.variable(id).elements) continue;
      for (std::size_t i = kill_floor_; i < loops_.size(); ++i) {
        const std::size_t last = last_touch_[id];
        if (last == kNever || last < loops_[i].begin) loops_[i].killed.push_back(id);
      }
      if (conditional_ == 0) killed_[id] = 1;
    }
  }
  void reads(const std::vector<Tensor>& tensors) {
    for (const auto& t : tensors) access(t, false);
  }
  void walk(const Program& p) {
    switch (p.kind()) {
      case Program::Kind::sequence:
        for (const auto& c : p.children()) walk(c);
        return;
      case Program::Kind::repeat:
      case Program::Kind::repeat_while_true: {
        // A while loop's body may not run at all; a repeat's runs at least once (count >= 1).
        const bool may_skip = p.kind() == Program::Kind::repeat_while_true || p.count() == 0;
        loops_.push_back({position_, {}, {}});
        reads(p.tensors());
        end_step();
        const std::size_t kill_floor = kill_floor_;
        if (may_skip) kill_floor_ = loops_.size() - 1;
        conditional_ += may_skip ? 1 : 0;
        for (const auto& c : p.children()) walk(c);
        conditional_ -= may_skip ? 1 : 0;
        kill_floor_ = kill_floor;
        Loop loop = std::move(loops_.back());
        loops_.pop_back();
        const std::size_t end = position_;  // the step that jumps back to the top
        for (VariableId id : loop.carried) carry(ranges_.at(id), loop.begin, end);
        break;
      }
      case Program::Kind::if_else:
        reads({p.tensors()[0]});
        end_step();
        {
          const std::size_t kill_floor = kill_floor_;
          kill_floor_ = loops_.size();
          ++conditional_;
          for (const auto& c : p.children()) walk(c);
          --conditional_;
          kill_floor_ = kill_floor;
        }
        return;
      case Program::Kind::execute: {
        const auto& registry = CodeletRegistry::builtin();
        const Codelet* codelet = nullptr;
        for (const auto& v : graph_.compute_sets().at(p.compute_set()).vertices) {
          if (!codelet || codelet->name != v.codelet) codelet = &registry.get(v.codelet);
          for (std::size_t f = 0; f < v.fields.size(); ++f) {
            const bool output = f < codelet->fields.size() &&
                                std::find(codelet->outputs.begin(), codelet->outputs.end(),
                                          codelet->fields[f]) != codelet->outputs.end();
            for (const auto& t : v.fields[f]) access(t, output);
          }
        }
        break;
      }
      case Program::Kind::copy:
        for (const auto& [src, dst] : p.pairs()) access(src, false);
        for (const auto& [src, dst] : p.view_pairs())
          for (const auto& r : src.view_regions()) access(r.var, r.begin, r.end, false);
        for (const auto& [src, dst] : p.pairs()) access(dst, true);
        for (const auto& [src, dst] : p.view_pairs())
          for (const auto& r : dst.view_regions()) access(r.var, r.begin, r.end, true);
        break;
      case Program::Kind::write_undef:
        for (const View& v : p.views()) write_undef(v);
        break;
      case Program::Kind::sync:
        break;
      case Program::Kind::stream_to_device:
      case Program::Kind::receive:
        for (const auto& t : p.tensors()) access(t, true);
        break;
      case Program::Kind::stream_from_device:
      case Program::Kind::all_reduce:
      case Program::Kind::send:
        reads(p.tensors());
        break;
      case Program::Kind::reduce_scatter:
      case Program::Kind::all_gather:
        reads(p.tensors());
        for (const auto& t : p.outputs()) access(t, true);
        break;
    }
    end_step();
  }

  const Graph& graph_;
  std::vector<LiveRange>& ranges_;
  std::vector<std::size_t> last_touch_;   // per variable: position of its latest step
  std::vector<std::uint32_t> step_slot_;  // per variable: its entry in step_, or kNone
  std::vector<StepAccess> step_;          // the accesses of the step being walked
  std::size_t step_used_ = 0;
  std::vector<Loop> loops_;  // open loops, outermost first
  std::size_t position_ = 0;
  int program_ = -1;
  int conditional_ = 0;         // depth of branches and loops that may be skipped around this step
  std::size_t kill_floor_ = 0;  // the outermost open loop a WriteUndef here speaks for
  std::vector<char> killed_;    // per variable: whole WriteUndef since its last touch
};

struct Placement {
  std::size_t offset, bytes;
  const LiveRange* range;
};

// Per tile: places variables one by one, in the order they come to life, at the lowest offset
// not used by any placed variable whose live range meets theirs. The placed variables still
// alive are kept sorted by offset; a search walks them upwards from the floor and stops at the
// first gap that fits, so it costs about the number of variables below the answer, and a
// variable whose last step has passed leaves for good (no later one can meet it).
class TileLayout {
 public:
  explicit TileLayout(std::size_t floor) : floor_(floor) {}

  // Places a variable of `bytes` bytes with live range `range` (which must outlive the layout).
  // Variables live for the whole run come first, then by first step.
  std::size_t place(const LiveRange& range, std::size_t bytes) {
    if (!range.whole_run) retire_before(range.first);
    std::size_t offset = floor_;
    for (const Entry& e : alive_) {
      if (e.begin >= offset + bytes) break;
      if (e.end <= offset || e.range == nullptr || !meet(range, *e.range)) continue;
      offset = align_up(e.end);
    }
    const Entry entry{offset, offset + bytes, &range};
    alive_.insert(
        std::upper_bound(alive_.begin(), alive_.end(), entry,
                         [](const Entry& x, const Entry& y) { return x.begin < y.begin; }),
        entry);
    if (!range.whole_run) leaving_.push({range.last, offset, &range});
    return offset;
  }

 private:
  struct Entry {
    std::size_t begin, end;
    const LiveRange* range;  // null once retired
  };
  struct Leaving {
    std::size_t last, begin;
    const LiveRange* range;
    bool operator>(const Leaving& o) const { return last > o.last; }
  };

  static bool meet(const LiveRange& a, const LiveRange& b) {
    if (a.whole_run || b.whole_run) return true;
    if (a.last < b.first || b.last < a.first) return false;
    auto i = a.segments.begin(), j = b.segments.begin();
    while (i != a.segments.end() && j != b.segments.end()) {
      if (i->second < j->first) {
        ++i;
      } else if (j->second < i->first) {
        ++j;
      } else {
        return true;
      }
    }
    return false;
  }

  // Drops the variables whose last step is before `step`; compacts once half are dropped.
  void retire_before(std::size_t step) {
    while (!leaving_.empty() && leaving_.top().last < step) {
      const Leaving& l = leaving_.top();
      auto it = std::lower_bound(alive_.begin(), alive_.end(), l.begin,
                                 [](const Entry& e, std::size_t b) { return e.begin < b; });
      while (it->range != l.range) ++it;
      it->range = nullptr;
      ++retired_;
      leaving_.pop();
    }
    if (2 * retired_ > alive_.size()) {
      std::erase_if(alive_, [](const Entry& e) { return e.range == nullptr; });
      retired_ = 0;
    }
  }

  std::size_t floor_;
  std::vector<Entry> alive_;  // by offset
  std::priority_queue<Leaving, std::vector<Leaving>, std::greater<>> leaving_;
  std::size_t retired_ = 0;
};

}  // namespace

void Engine::allocate_memory(const std::map<std::string, Program>& programs) {
  const ArchPreset& arch = graph_.arch();
  memory_.arch = arch.name;
  memory_.bytes_per_tile = arch.bytes_per_tile;
  memory_.tiles.resize(arch.tiles);
  for (unsigned t = 0; t < arch.tiles; ++t) memory_.tiles[t].tile = t;

  const auto& vars = graph_.variables();
  std::vector<LiveRange> ranges(vars.size());
  {
    LivenessWalk walk(graph_, ranges);
    int index = 0;
    for (const auto& [name, program] : programs) walk.walk_program(program, index++);
  }
  struct Item {
    VariableId var;
    std::size_t interval, bytes;
  };
  std::vector<std::vector<Item>> per_tile(arch.tiles);
  for (VariableId id = 0; id < vars.size(); ++id) {
    const Variable& v = vars[id];
    if (always_live(v.category) || v.host_access || ranges[id].program < 0)
      ranges[id].whole_run = true;
    std::size_t mapped = 0;
    for (std::size_t k = 0; k < v.mapping.size(); ++k) {
      const auto& iv = v.mapping[k];
      per_tile[iv.tile].push_back({id, k, (iv.end - iv.begin) * dtype_size(v.dtype)});
      mapped += iv.end - iv.begin;
    }
    if (mapped != v.elements)
      throw std::logic_error(
          "variable '" + v.name + "' has " + std::to_string(v.elements - mapped) + " of its " +
          std::to_string(v.elements) + " elements unmapped; every element needs a tile");
    interval_offsets_.emplace_back(v.mapping.size(), 0);
  }

  // Per tile: always-live data at the bottom, then the rest in the order it comes to life, each
  // at the lowest free offset, its bytes free again after its last step (a linear scan over
  // the step positions): variables never live at the same time share bytes.
  std::vector<std::size_t> used(arch.tiles, 0);
  for (unsigned t = 0; t < arch.tiles; ++t) {
    TileMemory& tm = memory_.tiles[t];
    auto& items = per_tile[t];
    std::map<VariableId, std::size_t> var_bytes;
    std::size_t top = 0;
    for (const Item& it : items) {
      const Variable& v = vars[it.var];
      var_bytes[it.var] += it.bytes;
      tm.by_category[v.category] += it.bytes;
      if (!always_live(v.category)) continue;
      interval_offsets_[it.var][it.interval] = align_up(top);
      top = align_up(top) + it.bytes;
      tm.always_live += it.bytes;
    }
    const std::size_t floor = align_up(top);
    std::vector<const Item*> rest;
    for (const Item& it : items)
      if (!always_live(vars[it.var].category)) rest.push_back(&it);
    // Live for the whole run first, then by first step, the larger first among equals.
    const auto born = [&](const Item* it) {
      const LiveRange& r = ranges[it->var];
      return r.whole_run ? std::size_t{0} : r.first + 1;
    };
    std::stable_sort(rest.begin(), rest.end(), [&](const Item* a, const Item* b) {
      const std::size_t ba = born(a), bb = born(b);
      return ba != bb ? ba < bb : a->bytes > b->bytes;
    });
    TileLayout layout(floor);
    std::vector<Placement> placed;
    placed.reserve(rest.size());
    std::size_t high = floor;
    for (std::uint32_t k = 0; k < rest.size(); ++k) {
      const Item* it = rest[k];
      const LiveRange& range = ranges[it->var];
      const std::size_t offset = layout.place(range, align_up(it->bytes));
      interval_offsets_[it->var][it->interval] = offset;
      placed.push_back({offset, it->bytes, &range});
      high = std::max(high, offset + it->bytes);
    }
    tm.not_always_live = rest.empty() ? 0 : high - top;
    // Peak of simultaneously live bytes, to tell sharing apart from fragmentation.
    std::vector<std::pair<std::size_t, std::ptrdiff_t>> changes;
    std::size_t whole = 0;
    for (const auto& p : placed) {
      if (p.range->whole_run) {
        whole += p.bytes;
        continue;
      }
      for (const auto& [begin, end] : p.range->segments) {
        changes.emplace_back(begin, static_cast<std::ptrdiff_t>(p.bytes));
        changes.emplace_back(end + 1, -static_cast<std::ptrdiff_t>(p.bytes));
      }
    }
    std::sort(changes.begin(), changes.end());
    std::ptrdiff_t live = 0, peak = 0;
    for (const auto& [pos, delta] : changes) peak = std::max(peak, live += delta);
    tm.peak_live = std::min(tm.not_always_live, whole + static_cast<std::size_t>(peak));
    used[t] = high;
    for (const auto& [id, bytes] : var_bytes)
      tm.largest.push_back({vars[id].name, vars[id].category, bytes});
    std::sort(tm.largest.begin(), tm.largest.end(),
              [](auto& a, auto& b) { return a.bytes > b.bytes; });
    if (tm.largest.size() > 5) tm.largest.resize(5);
  }
  // Vertex state and code take their share of each tile, as on hardware.
  std::vector<std::set<std::string>> codelets_on_tile(arch.tiles);
  for (const auto& cs : graph_.compute_sets())
    for (const auto& v : cs.vertices) {
      std::size_t regions = 0;
      for (const auto& f : v.fields) regions += f.size();
      memory_.tiles.at(v.tile).vertex_state += regions * arch.vertex_state_bytes_per_region;
      codelets_on_tile[v.tile].insert(v.codelet);
    }
  for (unsigned t = 0; t < arch.tiles; ++t)
    memory_.tiles[t].code = codelets_on_tile[t].size() * arch.codelet_code_bytes;

  const std::size_t over = memory_.tiles_over();
  if (over > 0 && !options_.allow_out_of_memory) {
    std::vector<const TileMemory*> worst;
    for (const auto& tm : memory_.tiles)
      if (tm.total() > arch.bytes_per_tile) worst.push_back(&tm);
    std::sort(worst.begin(), worst.end(), [](auto* a, auto* b) { return a->total() > b->total(); });
    std::ostringstream os;
    os << "Out of memory: Cannot fit all variable data onto one or more tiles. " << over << " of "
       << arch.tiles << " tiles of '" << arch.name << "' exceed their "
       << format_bytes(arch.bytes_per_tile) << ". Worst:";
    for (std::size_t i = 0; i < std::min<std::size_t>(worst.size(), 3); ++i) {
      const TileMemory& tm = *worst[i];
      os << "\n  tile " << tm.tile << ": " << format_bytes(tm.total()) << " (+"
         << format_bytes(tm.total() - arch.bytes_per_tile) << " over); largest tensors:";
      for (const auto& tensor : tm.largest)
        os << " '" << tensor.name << "' " << format_bytes(tensor.bytes) << " ("
           << category_name(tensor.category) << ")";
    }
    os << "\nTry: more pipeline stages or a different split, a smaller micro-batch, "
          "recomputing activations instead of stashing them, or an architecture with more memory "
          "per tile; allow-out-of-memory writes the full memory report instead.";
    throw OutOfMemoryError(os.str(), memory_);
  }
  arenas_.assign(arch.tiles, nullptr);
  if (over > 0) return;
  // Every tile's memory in one zeroed block, each tile's from a cache-line boundary, so that
  // the host can back it with large pages: the tiles of an IPU hold hundreds of MB, and with
  // 4 KiB pages a run would pay a page-table walk for most pages it touches.
  constexpr std::size_t kLine = 64;
  std::size_t total = 0;
  for (unsigned t = 0; t < arch.tiles; ++t) total += (used[t] + kLine - 1) / kLine * kLine;
  if (total == 0) return;
  tile_memory_ = TileMemoryBlock(total);
  std::byte* next = tile_memory_.data();
  for (unsigned t = 0; t < arch.tiles; ++t)
    if (used[t] > 0) {
      arenas_[t] = next;
      next += (used[t] + kLine - 1) / kLine * kLine;
    }
}

Engine::TileMemoryBlock::TileMemoryBlock(std::size_t bytes) : bytes_(bytes) {
#if defined(__linux__)
  // Anonymous pages are zero until written, and only pages written take host memory.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without transparent huge pages, small ones
  data_ = static_cast<std::byte*>(p);
#else
  data_ = static_cast<std::byte*>(std::calloc(bytes, 1));
  if (data_ == nullptr) throw std::bad_alloc();
#endif
}

Engine::TileMemoryBlock::~TileMemoryBlock() {
  if (data_ == nullptr) return;
#if defined(__linux__)
  munmap(data_, bytes_);
#else
  std::free(data_);
#endif
}

Engine::TileMemoryBlock& Engine::TileMemoryBlock::operator=(TileMemoryBlock&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

std::vector<Engine::Piece> Engine::resolve(const View& v) const {
  std::vector<Piece> out;
  for (const auto& r : v.view_regions()) resolve_into(r.var, r.begin, r.end, out);
  return out;
}

std::vector<Engine::Piece> Engine::resolve(const Tensor& t) const {
  std::vector<Piece> out;
  resolve_into(t.variable(), t.offset(), t.offset() + t.elements(), out);
  return out;
}

void Engine::resolve_into(VariableId var, std::size_t b, std::size_t e,
                          std::vector<Piece>& out) const {
  const Variable& v = graph_.variable(var);
  const std::size_t esize = dtype_size(v.dtype);
  const auto& m = v.mapping;
  auto it = std::upper_bound(m.begin(), m.end(), b,
                             [](std::size_t x, const TileInterval& iv) { return x < iv.end; });
  for (; it != m.end() && it->begin < e; ++it) {
    const std::size_t k = static_cast<std::size_t>(it - m.begin());
    const std::size_t lo = std::max(it->begin, b), hi = std::min(it->end, e);
    std::byte* base = arenas_[it->tile];
    out.push_back({it->tile,
                   base ? base + interval_offsets_[var][k] + (lo - it->begin) * esize : nullptr,
                   hi - lo});
  }
}

Engine::Node Engine::compile(const Program& p) {
  const ArchPreset& arch = graph_.arch();
  Node node;
  node.kind = p.kind();
  switch (p.kind()) {
    case Program::Kind::sequence:
    case Program::Kind::repeat:
    case Program::Kind::repeat_while_true:
    case Program::Kind::if_else:
      node.count = p.count();
      for (const auto& c : p.children()) node.children.push_back(compile(c));
      if (node.kind == Program::Kind::sequence) {
        fuse_exchanges(node);
        chain_tile_steps(node);
      }
      if (!p.tensors().empty()) {
        node.pieces = resolve(p.tensors()[0]);
        node.dtype = p.tensors()[0].dtype();
      }
      break;
    case Program::Kind::execute: {
      const ComputeSet& cs = graph_.compute_sets().at(p.compute_set());
      node.name = cs.name;
      if (auto it = compiled_compute_sets_.find(p.compute_set());
          it != compiled_compute_sets_.end()) {
        node.index = it->second;
        break;
      }
      auto ccs = std::make_unique<CompiledComputeSet>();
      const auto& registry = CodeletRegistry::builtin();
      std::map<unsigned, std::vector<std::uint64_t>> worker_loads;
      std::size_t vi = 0, fields_so_far = 0;
      for (const Vertex& v : cs.vertices) {
        const Codelet& codelet = registry.get(v.codelet);
        if (v.fields.size() != codelet.fields.size())
          throw std::logic_error("vertex " + std::to_string(vi) + " (" + v.codelet +
                                 ") of compute set '" + cs.name + "' connects " +
                                 std::to_string(v.fields.size()) + " fields, the codelet has " +
                                 std::to_string(codelet.fields.size()));
        CompiledComputeSet::VertexRuntime rt{
            &codelet, v.tile, fields_so_far, v.fields.size(), ccs->params.size(), v.params.size()};
        for (std::size_t f = 0; f < v.fields.size(); ++f) {
          for (const Tensor& region : v.fields[f]) {
            auto pieces = resolve(region);
            for (const auto& piece : pieces)
              if (piece.tile != v.tile)
                throw std::logic_error(
                    "vertex " + std::to_string(vi) + " (" + v.codelet + ") on tile " +
                    std::to_string(v.tile) + " in compute set '" + cs.name + "': field '" +
                    codelet.fields[f] + "' is connected to " + graph_.describe(region) +
                    " which lives on tile " + std::to_string(piece.tile) +
                    "; a vertex may only touch its own tile's memory (copy the data first)");
            if (pieces.size() > 1)
              throw std::logic_error("vertex " + std::to_string(vi) + " (" + v.codelet +
                                     "): field '" + codelet.fields[f] + "' region " +
                                     graph_.describe(region) +
                                     " is not contiguous in tile memory; split it into regions");
            ccs->regions.push_back(pieces.empty()
                                       ? Region{nullptr, 0, region.dtype()}
                                       : Region{pieces[0].data, region.elements(), region.dtype()});
            rt.widens_float16 = rt.widens_float16 ||
                                (region.dtype() == DType::f16 && !codelet.reads_float16_storage);
            ccs->region_bytes.push_back(region.elements() * dtype_size(region.dtype()));
          }
        }
        ccs->params.insert(ccs->params.end(), v.params.begin(), v.params.end());
        ccs->vertices.push_back(rt);
        fields_so_far += v.fields.size();
        // Greedy: each vertex goes to the least-loaded of the tile's worker contexts.
        auto& loads = worker_loads[v.tile];
        if (loads.empty()) loads.assign(arch.workers_per_tile, 0);
        *std::min_element(loads.begin(), loads.end()) += codelet.cycles(v, arch);
        ++vi;
      }
      // Spans into the region table are made once it has stopped growing.
      std::size_t cursor = 0;
      for (const Vertex& v : cs.vertices)
        for (const auto& f : v.fields) {
          ccs->fields.emplace_back(ccs->regions.data() + cursor, f.size());
          cursor += f.size();
        }
      for (const auto& [tile, loads] : worker_loads)
        ccs->cycles = std::max(ccs->cycles, *std::max_element(loads.begin(), loads.end()));
      {
        std::vector<unsigned> tiles;
        tiles.reserve(ccs->vertices.size());
        for (const auto& rt : ccs->vertices) tiles.push_back(rt.tile);
        ccs->tile_begin = group_by(tiles, arch.tiles, ccs->by_tile);
      }
      node.index = compute_sets_.size();
      compiled_compute_sets_.emplace(p.compute_set(), node.index);
      compute_sets_.push_back(std::move(ccs));
      break;
    }
    case Program::Kind::copy: {
      node.name = "exchange";
      if (auto it = compiled_exchanges_.find(p.identity()); it != compiled_exchanges_.end()) {
        node.index = it->second;
        break;
      }
      auto ex = std::make_unique<CompiledExchange>();
      std::map<unsigned, std::size_t> bytes_out, bytes_in;
      std::vector<unsigned> dst_tiles;
      const auto plan = [&](const std::vector<Piece>& s, const std::vector<Piece>& d,
                            std::size_t esize) {
        std::size_t si = 0, di = 0, soff = 0, doff = 0;
        while (si < s.size() && di < d.size()) {
          const std::size_t n = std::min(s[si].elements - soff, d[di].elements - doff);
          ex->transfers.push_back(
              {s[si].data + soff * esize, d[di].data + doff * esize, n * esize});
          dst_tiles.push_back(d[di].tile);
          bytes_out[s[si].tile] += n * esize;
          bytes_in[d[di].tile] += n * esize;
          soff += n;
          doff += n;
          if (soff == s[si].elements) ++si, soff = 0;
          if (doff == d[di].elements) ++di, doff = 0;
        }
      };
      for (const auto& [src, dst] : p.pairs())
        plan(resolve(src), resolve(dst), dtype_size(src.dtype()));
      // Views: each element of the source to the same logical element of the destination,
      // piece by piece (a transposed source moves element by element).
      for (const auto& [src, dst] : p.view_pairs())
        plan(resolve(src), resolve(dst), dtype_size(src.dtype()));
      std::size_t worst = 0;
      for (auto& [t, b] : bytes_out) worst = std::max(worst, b);
      for (auto& [t, b] : bytes_in) worst = std::max(worst, b);
      ex->cycles = arch.exchange_latency_cycles +
                   static_cast<std::uint64_t>(std::ceil(static_cast<double>(worst) /
                                                        arch.exchange_bytes_per_cycle_per_tile));
      // On hardware every tile's receives happen at once; here the transfers may run grouped
      // by destination tile unless one reads what another writes (then program order decides).
      ByteRanges written;
      for (const auto& tr : ex->transfers) written.add(tr.dst, tr.bytes);
      written.seal();
      if (std::none_of(ex->transfers.begin(), ex->transfers.end(),
                       [&](const auto& tr) { return written.overlaps(tr.src, tr.bytes); })) {
        std::vector<std::size_t> order;
        ex->tile_begin = group_by(dst_tiles, arch.tiles, order);
        if (!std::is_sorted(dst_tiles.begin(), dst_tiles.end())) {  // else already grouped
          std::vector<CompiledExchange::Transfer> grouped;
          grouped.reserve(order.size());
          for (std::size_t i : order) grouped.push_back(ex->transfers[i]);
          ex->transfers = std::move(grouped);
        }
      }
      node.index = exchanges_.size();
      compiled_exchanges_.emplace(p.identity(), node.index);
      exchanges_.push_back(std::move(ex));
      break;
    }
    case Program::Kind::sync:
      node.sync = p.sync_kind();
      break;
    case Program::Kind::write_undef:  // liveness only: at run time nothing, at no cost
      node.kind = Program::Kind::sequence;
      break;
    case Program::Kind::stream_to_device:
    case Program::Kind::stream_from_device:
    case Program::Kind::all_reduce:
    case Program::Kind::reduce_scatter:
    case Program::Kind::all_gather:
    case Program::Kind::send:
    case Program::Kind::receive:
      node.stream = p.stream();
      node.name = p.kind() == Program::Kind::all_reduce       ? "all_reduce"
                  : p.kind() == Program::Kind::reduce_scatter ? "reduce_scatter"
                  : p.kind() == Program::Kind::all_gather     ? "all_gather"
                                                              : p.stream();
      if (p.kind() == Program::Kind::send || p.kind() == Program::Kind::receive) {
        node.peer = p.peer();
        node.tag = p.tag();
        node.name =
            std::string(p.kind() == Program::Kind::send ? "send to IPU " : "receive from IPU ") +
            std::to_string(p.peer());
      }
      node.op = p.collective_op();
      if (!p.tensors().empty()) node.dtype = p.tensors()[0].dtype();  // one dtype per node
      for (const Tensor& t : p.tensors()) {
        auto pieces = resolve(t);
        node.pieces.insert(node.pieces.end(), pieces.begin(), pieces.end());
        node.bytes += t.elements() * dtype_size(t.dtype());
      }
      for (const Tensor& t : p.outputs()) {
        auto pieces = resolve(t);
        node.out_pieces.insert(node.out_pieces.end(), pieces.begin(), pieces.end());
        node.out_bytes += t.elements() * dtype_size(t.dtype());
      }
      break;
  }
  return node;
}

void Engine::fuse_exchanges(Node& sequence) const {
  auto& steps = sequence.children;
  // Steps that do nothing at run time (empty sequences, WriteUndef) do not keep an exchange
  // from the compute set after it.
  std::erase_if(steps, [](const Node& n) {
    return n.kind == Program::Kind::sequence && n.children.empty() && !n.exchange;
  });
  for (std::size_t i = 0; i + 1 < steps.size(); ++i) {
    if (steps[i].kind != Program::Kind::copy || steps[i + 1].kind != Program::Kind::execute)
      continue;
    const CompiledExchange& ex = *exchanges_[steps[i].index];
    const CompiledComputeSet& cs = *compute_sets_[steps[i + 1].index];
    if (ex.tile_begin.empty()) continue;
    // A vertex touches only its own tile, so once a tile's transfers are in, its vertices see
    // what they would after the whole exchange. What no vertex may do is change bytes that a
    // transfer to a later tile still has to read: no vertex region may overlap a source.
    ByteRanges touched;
    for (std::size_t r = 0; r < cs.regions.size(); ++r)
      touched.add(cs.regions[r].data, cs.region_bytes[r]);
    touched.seal();
    if (std::any_of(ex.transfers.begin(), ex.transfers.end(),
                    [&](const auto& tr) { return touched.overlaps(tr.src, tr.bytes); }))
      continue;
    steps[i + 1].exchange = steps[i].index;
    steps[i].kind = Program::Kind::sequence;  // now empty: dropped below
  }
  std::erase_if(steps, [](const Node& n) {
    return n.kind == Program::Kind::sequence && n.children.empty() && !n.exchange;
  });
}

namespace {
// Union-find over tiles, for the groups a run of exchanges connects.
class TileGroups {
 public:
  explicit TileGroups(unsigned tiles) : parent_(tiles), size_(tiles, 1) {
    std::iota(parent_.begin(), parent_.end(), 0U);
  }
  unsigned find(unsigned t) {
    while (parent_[t] != t) t = parent_[t] = parent_[parent_[t]];
    return t;
  }
  void join(unsigned a, unsigned b) {
    a = find(a), b = find(b);
    if (a == b) return;
    if (size_[a] < size_[b]) std::swap(a, b);
    parent_[b] = a;
    size_[a] += size_[b];
    largest_ = std::max(largest_, size_[a]);
  }
  unsigned largest() const { return largest_; }

 private:
  std::vector<unsigned> parent_, size_;
  unsigned largest_ = 1;
};
}  // namespace

// A run of executes that each go tile by tile after their exchange (see fuse_exchanges) can go
// group by group of tiles instead: all the steps of one group, then the next group, so that
// what a step leaves on a group's tiles is still in the host's cache when the next step reads
// it (a split matmul's partial sums when they are added up). The groups are the tiles that the
// later steps' exchanges connect, so a group's exchanges only read its own tiles, which have
// finished the steps before; the result is the same as step by step over every tile.
void Engine::chain_tile_steps(Node& sequence) const {
  const unsigned tiles = graph_.arch().tiles;
  // A group may hold at most this many tiles: enough groups to share out between threads, each
  // small enough that its data stays in the host's caches from one step to the next.
  const unsigned max_group = std::max(1U, tiles / kTilesPerGroupDivisor);
  const auto tile_step = [](const Node& n) {
    return n.kind == Program::Kind::execute && n.exchange.has_value();
  };
  // The tile whose memory holds an address (arenas_ are in tile order, empty tiles null).
  std::vector<std::pair<const std::byte*, unsigned>> arena_starts;
  for (unsigned t = 0; t < tiles; ++t)
    if (arenas_[t] != nullptr) arena_starts.emplace_back(arenas_[t], t);
  const auto tile_at = [&](const std::byte* p) {
    auto it = std::upper_bound(arena_starts.begin(), arena_starts.end(), p,
                               [](const std::byte* x, const auto& a) { return x < a.first; });
    return std::prev(it)->second;
  };
  auto& steps = sequence.children;
  std::vector<Node> out;
  for (std::size_t i = 0; i < steps.size();) {
    std::size_t j = i + 1;
    if (tile_step(steps[i]) && !arena_starts.empty()) {
      TileGroups groups(tiles);
      ByteRanges read;  // what the exchanges of the chain so far read, once it has two steps
      for (; j < steps.size() && tile_step(steps[j]); ++j) {
        const CompiledExchange& ex = *exchanges_[*steps[j].exchange];
        const CompiledComputeSet& cs = *compute_sets_[steps[j].index];
        // Each transfer joins its source's tile to its destination's.
        TileGroups joined = groups;
        for (std::size_t t = 0; t < tiles && joined.largest() <= max_group; ++t)
          for (std::size_t k = ex.tile_begin[t]; k < ex.tile_begin[t + 1]; ++k)
            joined.join(tile_at(ex.transfers[k].src), static_cast<unsigned>(t));
        if (joined.largest() > max_group) break;
        if (j == i + 1) {
          for (const auto& tr : exchanges_[*steps[i].exchange]->transfers)
            read.add(tr.src, tr.bytes);
          read.seal();
        }
        // A group runs all its steps before the next group starts, so no later step may write
        // what an earlier exchange still reads for another group (vertex regions count as
        // written: a codelet does not say which of its fields it changes).
        if (std::any_of(ex.transfers.begin(), ex.transfers.end(),
                        [&](const auto& tr) { return read.overlaps(tr.dst, tr.bytes); }))
          break;
        bool clash = false;
        for (std::size_t r = 0; r < cs.regions.size() && !clash; ++r)
          clash = read.overlaps(cs.regions[r].data, cs.region_bytes[r]);
        if (clash) break;
        groups = std::move(joined);
        for (const auto& tr : ex.transfers) read.add(tr.src, tr.bytes);
        read.seal();
      }
      if (j - i >= 2) {
        Node chain;
        std::vector<unsigned> roots(tiles);
        for (unsigned t = 0; t < tiles; ++t) roots[t] = groups.find(t);
        std::vector<std::size_t> order;
        const std::vector<std::size_t> begin = group_by(roots, tiles, order);
        // Tiles with nothing to do in any step are left out, so that the threads' equal shares
        // of the groups are equal shares of the work.
        std::vector<bool> busy(tiles, false);
        for (std::size_t k = i; k < j; ++k) {
          const CompiledExchange& ex = *exchanges_[*steps[k].exchange];
          const CompiledComputeSet& cs = *compute_sets_[steps[k].index];
          for (unsigned t = 0; t < tiles; ++t)
            if (ex.tile_begin[t + 1] > ex.tile_begin[t] || cs.tile_begin[t + 1] > cs.tile_begin[t])
              busy[t] = true;
        }
        // Groups in the order of their first tile, each group's tiles in tile order.
        std::vector<bool> placed(tiles, false);
        for (unsigned t = 0; t < tiles; ++t) {
          const unsigned root = roots[t];
          if (!busy[t] || placed[root]) continue;
          placed[root] = true;
          chain.group_begin.push_back(chain.group_tiles.size());
          for (std::size_t k = begin[root]; k < begin[root + 1]; ++k)
            if (busy[order[k]]) chain.group_tiles.push_back(static_cast<unsigned>(order[k]));
        }
        chain.group_begin.push_back(chain.group_tiles.size());
        for (std::size_t k = i; k < j; ++k) chain.children.push_back(std::move(steps[k]));
        out.push_back(std::move(chain));
        i = j;
        continue;
      }
    }
    out.push_back(std::move(steps[i]));
    i = i + 1;
  }
  steps = std::move(out);
}

void Engine::account(const char* category, std::uint64_t CycleBreakdown::*field,
                     std::uint64_t cycles, const std::string& name) {
  if (trace_.size() < options_.trace_events)
    trace_.push_back({name, category, cycles_.total(), cycles});
  cycles_.*field += cycles;
}

bool Engine::predicate(const Node& node) const {
  const std::byte* p = node.pieces.at(0).data;
  switch (node.dtype) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return v != 0.f;
    }
    default: {
      std::uint32_t v;
      std::memcpy(&v, p, sizeof v);
      return v != 0;
    }
  }
}

void Engine::run_tile(const Node& step, std::size_t tile, std::uint64_t run) const {
  const CompiledExchange& ex = *exchanges_[*step.exchange];
  const CompiledComputeSet& cs = *compute_sets_[step.index];
  for (std::size_t i = ex.tile_begin[tile]; i < ex.tile_begin[tile + 1]; ++i)
    std::memcpy(ex.transfers[i].dst, ex.transfers[i].src, ex.transfers[i].bytes);
  for (std::size_t i = cs.tile_begin[tile]; i < cs.tile_begin[tile + 1]; ++i)
    cs.run_vertex(cs.by_tile[i], options_.float16_stores, run);
}

void Engine::execute_tile_groups(const Node& node) {
  const auto& steps = node.children;
  std::vector<std::uint64_t> runs(steps.size());
  for (auto& run : runs) run = compute_set_runs_++;
  pool_->parallel_for(node.group_begin.size() - 1, [&](std::size_t b, std::size_t e) {
    for (std::size_t g = b; g < e; ++g)
      for (std::size_t s = 0; s < steps.size(); ++s)
        for (std::size_t i = node.group_begin[g]; i < node.group_begin[g + 1]; ++i)
          run_tile(steps[s], node.group_tiles[i], runs[s]);
  });
  for (const Node& step : steps) account_tile_step(step);
}

void Engine::account_tile_step(const Node& step) {
  const ArchPreset& arch = graph_.arch();
  account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
  account("exchange", &CycleBreakdown::exchange, exchanges_[*step.exchange]->cycles, "exchange");
  account("compute", &CycleBreakdown::compute, compute_sets_[step.index]->cycles, step.name);
  account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
}

void Engine::execute(const Node& node) {
  const ArchPreset& arch = graph_.arch();
  switch (node.kind) {
    case Program::Kind::sequence:
      if (!node.group_begin.empty()) {
        execute_tile_groups(node);
        break;
      }
      for (const auto& c : node.children) execute(c);
      break;
    case Program::Kind::repeat:
      for (std::uint64_t i = 0; i < node.count; ++i) execute(node.children[0]);
      break;
    case Program::Kind::repeat_while_true:
      // Each test of the predicate is a sync: every tile must agree on the branch.
      for (;;) {
        execute(node.children[0]);
        account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "predicate");
        if (!predicate(node)) break;
        execute(node.children[1]);
      }
      break;
    case Program::Kind::if_else:
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "predicate");
      execute(node.children[predicate(node) ? 0 : 1]);
      break;
    case Program::Kind::execute: {
      const CompiledComputeSet& cs = *compute_sets_[node.index];
      const std::uint64_t run = compute_set_runs_++;
      if (node.exchange) {
        // The exchange before it and the compute set, tile by tile: a tile's operands are still
        // in the host's cache when its vertices read them.
        pool_->parallel_for(arch.tiles, [&](std::size_t b, std::size_t e) {
          for (std::size_t t = b; t < e; ++t) run_tile(node, t, run);
        });
        account_tile_step(node);
        break;
      }
      // Vertices of a compute set write disjoint memory, so any split of them is exact.
      pool_->parallel_for(cs.vertices.size(), [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) cs.run_vertex(i, options_.float16_stores, run);
      });
      account("compute", &CycleBreakdown::compute, cs.cycles, node.name);
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
      break;
    }
    case Program::Kind::copy: {
      const CompiledExchange& ex = *exchanges_[node.index];
      if (ex.tile_begin.empty()) {
        for (const auto& tr : ex.transfers) std::memmove(tr.dst, tr.src, tr.bytes);
      } else {  // no transfer reads what another writes: the tiles fill at once
        pool_->parallel_for(arch.tiles, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = ex.tile_begin[b]; i < ex.tile_begin[e]; ++i)
            std::memcpy(ex.transfers[i].dst, ex.transfers[i].src, ex.transfers[i].bytes);
        });
      }
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
      account("exchange", &CycleBreakdown::exchange, ex.cycles, node.name);
      break;
    }
    case Program::Kind::write_undef:
      break;
    case Program::Kind::sync:
      if (node.sync == SyncKind::internal) {
        account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
      } else {
        account("sync", &CycleBreakdown::sync, arch.sync_cycles_external, "external sync");
        if (collectives_.external_sync) {
          const std::uint64_t now = cycles_.total();
          const std::uint64_t latest = collectives_.external_sync(now);
          if (latest > now) account("sync", &CycleBreakdown::sync, latest - now, "wait for peers");
        }
      }
      break;
    case Program::Kind::send:
    case Program::Kind::receive: {
      if (!collectives_.send || !collectives_.receive)
        throw std::logic_error("send/receive program run without a fabric binding");
      staging_.resize(node.bytes);
      const std::size_t esize = dtype_size(node.dtype);
      if (node.kind == Program::Kind::send) {
        gather_pieces(node.pieces, esize, staging_);
        collectives_.send(node.peer, node.tag, staging_);
      } else {
        collectives_.receive(node.peer, node.tag, staging_);
        scatter_pieces(node.pieces, esize, staging_);
        const double seconds = collectives_.predict_transfer_seconds
                                   ? collectives_.predict_transfer_seconds(node.peer, node.bytes)
                                   : 0.0;
        account("fabric", &CycleBreakdown::fabric,
                static_cast<std::uint64_t>(std::ceil(seconds * arch.clock_hz)), node.name);
      }
      break;
    }
    case Program::Kind::reduce_scatter:
    case Program::Kind::all_gather: {
      const bool scatter = node.kind == Program::Kind::reduce_scatter;
      if (scatter ? !collectives_.reduce_scatter : !collectives_.all_gather)
        throw std::logic_error(node.name + " program run without a fabric binding");
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_external, "external sync");
      staging_.resize(node.bytes);
      std::vector<float> out(node.out_bytes / sizeof(float));
      gather_pieces(node.pieces, sizeof(float), staging_);
      const std::span<const float> in(reinterpret_cast<const float*>(staging_.data()),
                                      node.bytes / sizeof(float));
      if (scatter)
        collectives_.reduce_scatter(in, out, node.op);
      else
        collectives_.all_gather(in, out);
      scatter_pieces(node.out_pieces, sizeof(float), std::as_bytes(std::span(out)));
      // Both are charged for the whole buffer: reduce_scatter's input, all_gather's output.
      const auto& predict = scatter ? collectives_.predict_reduce_scatter_seconds
                                    : collectives_.predict_all_gather_seconds;
      const double seconds = predict ? predict(scatter ? node.bytes : node.out_bytes) : 0.0;
      account("fabric", &CycleBreakdown::fabric,
              static_cast<std::uint64_t>(std::ceil(seconds * arch.clock_hz)), node.name);
      break;
    }
    case Program::Kind::stream_to_device:
    case Program::Kind::stream_from_device:
    case Program::Kind::all_reduce: {
      staging_.resize(node.bytes);
      const std::size_t esize = dtype_size(node.dtype);
      const auto scatter = [&] { scatter_pieces(node.pieces, esize, staging_); };
      const auto gather = [&] { gather_pieces(node.pieces, esize, staging_); };
      // Host and fabric transfers start with a sync across the IPU and its peers.
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_external, "external sync");
      if (node.kind == Program::Kind::all_reduce) {
        if (!collectives_.all_reduce)
          throw std::logic_error("all_reduce program run without a fabric binding");
        gather();
        collectives_.all_reduce(
            std::span(reinterpret_cast<float*>(staging_.data()), node.bytes / sizeof(float)),
            node.op);
        scatter();
        account("fabric", &CycleBreakdown::fabric,
                static_cast<std::uint64_t>(
                    std::ceil(collectives_.predict_seconds(node.bytes) * arch.clock_hz)),
                node.name);
        break;
      }
      if (node.kind == Program::Kind::stream_to_device) {
        auto it = inputs_.find(node.stream);
        if (it == inputs_.end())
          throw std::logic_error("host-to-device stream '" + node.stream + "' is not connected");
        it->second(staging_);
        scatter();
      } else {
        auto it = outputs_.find(node.stream);
        if (it == outputs_.end())
          throw std::logic_error("device-to-host stream '" + node.stream + "' is not connected");
        gather();
        it->second(staging_);
      }
      account("host", &CycleBreakdown::host,
              static_cast<std::uint64_t>(std::ceil(static_cast<double>(node.bytes) /
                                                   arch.host_link_bytes_per_s * arch.clock_hz)),
              node.name);
      break;
    }
  }
}

void Engine::connect_input_stream(const std::string& name,
                                  std::function<void(std::span<std::byte>)> fill) {
  inputs_[name] = std::move(fill);
}

void Engine::connect_output_stream(const std::string& name,
                                   std::function<void(std::span<const std::byte>)> consume) {
  outputs_[name] = std::move(consume);
}

void Engine::run(const std::string& program) {
  if (memory_.tiles_over() > 0)
    throw std::logic_error(
        "cannot run: the graph was compiled with allow-out-of-memory and does "
        "not fit on the IPU (see the memory report)");
  auto it = programs_.find(program);
  if (it == programs_.end()) throw std::invalid_argument("no program named '" + program + "'");
  execute(*it->second);
}

double Engine::seconds(const CycleBreakdown& c) const {
  return static_cast<double>(c.total()) / graph_.arch().clock_hz;
}

void Engine::check_host_access(const Tensor& t) const {
  const Variable& v = graph_.variable(t.variable());
  if (!v.host_access && !always_live(v.category))
    throw std::logic_error("the host cannot access " + graph_.describe(t) +
                           ": its bytes are shared with other tensors when it is not live; "
                           "call Graph::set_host_access on it before building the engine");
}

void Engine::gather_pieces(const std::vector<Piece>& pieces, std::size_t element_bytes,
                           std::span<std::byte> out) {
  std::size_t off = 0;
  for (const auto& piece : pieces) {
    std::memcpy(out.data() + off, piece.data, piece.elements * element_bytes);
    off += piece.elements * element_bytes;
  }
}

void Engine::scatter_pieces(const std::vector<Piece>& pieces, std::size_t element_bytes,
                            std::span<const std::byte> in) {
  std::size_t off = 0;
  for (const auto& piece : pieces) {
    std::memcpy(piece.data, in.data() + off, piece.elements * element_bytes);
    off += piece.elements * element_bytes;
  }
}

void Engine::write(const Tensor& t, std::span<const std::byte> bytes) {
  check_host_access(t);
  const std::size_t esize = dtype_size(t.dtype());
  if (bytes.size() != t.elements() * esize)
    throw std::invalid_argument("write of " + std::to_string(bytes.size()) + " bytes to " +
                                graph_.describe(t) + " of " + std::to_string(t.elements() * esize) +
                                " bytes");
  scatter_pieces(resolve(t), esize, bytes);
}

std::vector<std::byte> Engine::read(const Tensor& t) const {
  check_host_access(t);
  const std::size_t esize = dtype_size(t.dtype());
  std::vector<std::byte> out(t.elements() * esize);
  gather_pieces(resolve(t), esize, out);
  return out;
}

namespace {
void check_float(const Graph& graph, const Tensor& t, const char* what) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::f16)
    throw std::invalid_argument(std::string(what) + " of " + graph.describe(t) +
                                ": float32 values for a tensor of " + dtype_name(t.dtype()) +
                                "; use write/read with its bytes");
}
}  // namespace

void Engine::write_values(const Tensor& t, std::span<const float> values) {
  check_float(graph_, t, "write_values");
  if (t.dtype() == DType::f32) return write(t, std::as_bytes(values));
  std::vector<fabric::Half> halves(values.size());
  fabric::narrow(values, halves);
  write(t, std::as_bytes(std::span(halves)));
}

std::vector<float> Engine::read_values(const Tensor& t) const {
  check_float(graph_, t, "read_values");
  const std::vector<std::byte> bytes = read(t);
  std::vector<float> out(t.elements());
  if (t.dtype() == DType::f32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    std::vector<fabric::Half> halves(t.elements());
    std::memcpy(halves.data(), bytes.data(), bytes.size());
    fabric::widen(halves, out);
  }
  return out;
}

}  // namespace ipupod::ipu

// Engine: compile (checks, memory, exchange plans, cycle estimates) and BSP execution.
#include "ipu_process/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <sstream>

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
    std::size_t field_begin, field_count, param_begin, param_count;
  };
  std::vector<Region> regions;
  std::vector<std::span<const Region>> fields;
  std::vector<double> params;
  std::vector<VertexRuntime> vertices;
  std::uint64_t cycles = 0;  // max over tiles of the busiest worker
};

struct Engine::CompiledExchange {
  struct Transfer {
    const std::byte* src;
    std::byte* dst;
    std::size_t bytes;
  };
  std::vector<Transfer> transfers;
  std::uint64_t cycles = 0;
};

struct Engine::Node {
  Program::Kind kind = Program::Kind::sequence;
  std::vector<Node> children;
  std::size_t index = 0;    // compute set or exchange
  std::uint64_t count = 0;  // repeat count
  SyncKind sync = SyncKind::internal;
  CollectiveOp op = CollectiveOp::sum;
  std::string stream;
  std::vector<Piece> pieces;  // stream and collective data or the predicate, in element order
  std::size_t bytes = 0;
  DType dtype = DType::f32;
  std::string name;            // for the trace
  unsigned peer = 0, tag = 0;  // send and receive
};

namespace {
constexpr std::size_t kAlignment = 8;
std::size_t align_up(std::size_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

std::string format_bytes(std::size_t b) {
  std::ostringstream os;
  os << b << " B";
  return os.str();
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

// Live range of a variable in the order program steps run: [first, last] step positions.
struct LiveRange {
  std::size_t first = SIZE_MAX, last = 0;
  int program = -1;
  bool whole_run = false;  // used by several programs or by none: live throughout
  bool overlaps(const LiveRange& o) const {
    return whole_run || o.whole_run || (first <= o.last && o.first <= last);
  }
};

// Walks the program trees, numbering every step that touches tile memory, and extends the
// range of anything touched inside a loop to the whole loop (values may cross iterations).
class LivenessWalk {
 public:
  LivenessWalk(const Graph& graph, std::vector<LiveRange>& ranges)
      : graph_(graph), ranges_(ranges) {}

  void walk_program(const Program& p, int program) {
    program_ = program;
    walk(p);
    for (const auto& [b, e] : loops_)
      for (auto& r : ranges_)
        if (!r.whole_run && r.program >= 0 && r.first <= e && b <= r.last) {
          r.first = std::min(r.first, b);
          r.last = std::max(r.last, e);
        }
    loops_.clear();
  }

 private:
  void touch(const Tensor& t) {
    LiveRange& r = ranges_.at(t.variable());
    if (r.program >= 0 && r.program != program_) r.whole_run = true;
    r.program = program_;
    r.first = std::min(r.first, position_);
    r.last = std::max(r.last, position_);
  }
  void walk(const Program& p) {
    switch (p.kind()) {
      case Program::Kind::sequence:
        for (const auto& c : p.children()) walk(c);
        return;
      case Program::Kind::repeat:
      case Program::Kind::repeat_while_true: {
        const std::size_t begin = position_;
        for (const auto& t : p.tensors()) touch(t);
        for (const auto& c : p.children()) walk(c);
        loops_.emplace_back(begin, position_);
        ++position_;
        return;
      }
      case Program::Kind::if_else:
        touch(p.tensors()[0]);
        for (const auto& c : p.children()) walk(c);
        break;
      case Program::Kind::execute:
        for (const auto& v : graph_.compute_sets().at(p.compute_set()).vertices)
          for (const auto& f : v.fields)
            for (const auto& t : f) touch(t);
        break;
      case Program::Kind::copy:
        for (const auto& [src, dst] : p.pairs()) touch(src), touch(dst);
        break;
      case Program::Kind::sync:
        break;
      case Program::Kind::stream_to_device:
      case Program::Kind::stream_from_device:
      case Program::Kind::all_reduce:
      case Program::Kind::send:
      case Program::Kind::receive:
        for (const auto& t : p.tensors()) touch(t);
        break;
    }
    ++position_;
  }

  const Graph& graph_;
  std::vector<LiveRange>& ranges_;
  std::vector<std::pair<std::size_t, std::size_t>> loops_;
  std::size_t position_ = 0;
  int program_ = -1;
};

struct Placement {
  std::size_t offset, bytes;
  const LiveRange* range;
};

// Lowest offset at or above `floor` where `bytes` fit beside everything live at the same time.
std::size_t first_fit(std::vector<Placement>& placed, const LiveRange& range, std::size_t bytes,
                      std::size_t floor) {
  std::vector<std::pair<std::size_t, std::size_t>> busy;
  for (const auto& p : placed)
    if (p.range->overlaps(range)) busy.emplace_back(p.offset, p.offset + p.bytes);
  std::sort(busy.begin(), busy.end());
  std::size_t offset = align_up(floor);
  for (const auto& [b, e] : busy) {
    if (offset + bytes <= b) break;
    offset = std::max(offset, align_up(e));
  }
  return offset;
}

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

  // Per tile: always-live data at the bottom, then everything else first-fit by size, sharing
  // bytes between variables that are never live at the same time.
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
    std::stable_sort(rest.begin(), rest.end(),
                     [](auto* a, auto* b) { return a->bytes > b->bytes; });
    std::vector<Placement> placed;
    std::size_t high = floor;
    for (const Item* it : rest) {
      const std::size_t offset = first_fit(placed, ranges[it->var], it->bytes, floor);
      interval_offsets_[it->var][it->interval] = offset;
      placed.push_back({offset, it->bytes, &ranges[it->var]});
      high = std::max(high, offset + it->bytes);
    }
    tm.not_always_live = rest.empty() ? 0 : high - top;
    // Peak of simultaneously live bytes, to tell sharing apart from fragmentation.
    std::vector<std::pair<std::size_t, std::ptrdiff_t>> events;
    std::size_t whole = 0;
    for (const auto& p : placed) {
      if (p.range->whole_run) {
        whole += p.bytes;
        continue;
      }
      events.emplace_back(p.range->first, static_cast<std::ptrdiff_t>(p.bytes));
      events.emplace_back(p.range->last + 1, -static_cast<std::ptrdiff_t>(p.bytes));
    }
    std::sort(events.begin(), events.end());
    std::ptrdiff_t live = 0, peak = 0;
    for (const auto& [pos, delta] : events) peak = std::max(peak, live += delta);
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
    os << "\nTry: more pipeline stages, a smaller micro-batch, or an architecture with more "
          "memory per tile; allow-out-of-memory writes the full memory report instead.";
    throw OutOfMemoryError(os.str(), memory_);
  }
  arenas_.resize(arch.tiles);
  if (over == 0)
    for (unsigned t = 0; t < arch.tiles; ++t)
      if (used[t] > 0) arenas_[t] = std::make_unique<std::byte[]>(used[t]);  // zeroed, lazily sized
}

std::vector<Engine::Piece> Engine::resolve(const Tensor& t) const {
  const Variable& v = graph_.variable(t.variable());
  const std::size_t esize = dtype_size(v.dtype);
  const std::size_t b = t.offset(), e = t.offset() + t.elements();
  std::vector<Piece> out;
  const auto& m = v.mapping;
  auto it = std::upper_bound(m.begin(), m.end(), b,
                             [](std::size_t x, const TileInterval& iv) { return x < iv.end; });
  for (; it != m.end() && it->begin < e; ++it) {
    const std::size_t k = static_cast<std::size_t>(it - m.begin());
    const std::size_t lo = std::max(it->begin, b), hi = std::min(it->end, e);
    std::byte* base = arenas_[it->tile].get();
    out.push_back(
        {it->tile,
         base ? base + interval_offsets_[t.variable()][k] + (lo - it->begin) * esize : nullptr,
         hi - lo});
  }
  return out;
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
      if (!p.tensors().empty()) {
        node.pieces = resolve(p.tensors()[0]);
        node.dtype = p.tensors()[0].dtype();
      }
      break;
    case Program::Kind::execute: {
      const ComputeSet& cs = graph_.compute_sets().at(p.compute_set());
      node.name = cs.name;
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
        CompiledComputeSet::VertexRuntime rt{&codelet, fields_so_far, v.fields.size(),
                                             ccs->params.size(), v.params.size()};
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
            ccs->regions.push_back(pieces.empty() ? Region{}
                                                  : Region{pieces[0].data, region.elements()});
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
      node.index = compute_sets_.size();
      compute_sets_.push_back(std::move(ccs));
      break;
    }
    case Program::Kind::copy: {
      node.name = "exchange";
      auto ex = std::make_unique<CompiledExchange>();
      std::map<unsigned, std::size_t> bytes_out, bytes_in;
      for (const auto& [src, dst] : p.pairs()) {
        const auto s = resolve(src), d = resolve(dst);
        const std::size_t esize = dtype_size(src.dtype());
        std::size_t si = 0, di = 0, soff = 0, doff = 0;
        while (si < s.size() && di < d.size()) {
          const std::size_t n = std::min(s[si].elements - soff, d[di].elements - doff);
          ex->transfers.push_back(
              {s[si].data + soff * esize, d[di].data + doff * esize, n * esize});
          bytes_out[s[si].tile] += n * esize;
          bytes_in[d[di].tile] += n * esize;
          soff += n;
          doff += n;
          if (soff == s[si].elements) ++si, soff = 0;
          if (doff == d[di].elements) ++di, doff = 0;
        }
      }
      std::size_t worst = 0;
      for (auto& [t, b] : bytes_out) worst = std::max(worst, b);
      for (auto& [t, b] : bytes_in) worst = std::max(worst, b);
      ex->cycles = arch.exchange_latency_cycles +
                   static_cast<std::uint64_t>(std::ceil(static_cast<double>(worst) /
                                                        arch.exchange_bytes_per_cycle_per_tile));
      node.index = exchanges_.size();
      exchanges_.push_back(std::move(ex));
      break;
    }
    case Program::Kind::sync:
      node.sync = p.sync_kind();
      break;
    case Program::Kind::stream_to_device:
    case Program::Kind::stream_from_device:
    case Program::Kind::all_reduce:
    case Program::Kind::send:
    case Program::Kind::receive:
      node.stream = p.stream();
      node.name = p.kind() == Program::Kind::all_reduce ? "all_reduce" : p.stream();
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
      break;
  }
  return node;
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

void Engine::execute(const Node& node) {
  const ArchPreset& arch = graph_.arch();
  switch (node.kind) {
    case Program::Kind::sequence:
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
      // Vertices of a compute set write disjoint memory, so any split of them is exact.
      pool_->parallel_for(cs.vertices.size(), [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) {
          const auto& v = cs.vertices[i];
          VertexContext ctx(std::span(cs.fields).subspan(v.field_begin, v.field_count),
                            std::span(cs.params).subspan(v.param_begin, v.param_count));
          v.codelet->compute(ctx);
        }
      });
      account("compute", &CycleBreakdown::compute, cs.cycles, node.name);
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
      break;
    }
    case Program::Kind::copy: {
      const CompiledExchange& ex = *exchanges_[node.index];
      for (const auto& tr : ex.transfers) std::memmove(tr.dst, tr.src, tr.bytes);
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
      account("exchange", &CycleBreakdown::exchange, ex.cycles, node.name);
      break;
    }
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

}  // namespace ipupod::ipu

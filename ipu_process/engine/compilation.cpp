// Engine compilation: each program becomes a tree of nodes (compute sets with their vertices'
// regions and cycles, exchanges with their transfers), exchanges fused with the steps after them.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <unordered_map>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "ipu_process/engine.hpp"
#include "ipu_process/engine/engine_internal.hpp"

namespace ipupod::ipu {

namespace {
// Host-side choice, not a hardware figure: a run of exchanges and compute sets goes group by
// group of tiles only if no group holds more than 1/kTilesPerGroupDivisor of the tiles.
constexpr unsigned kTilesPerGroupDivisor = 8;

// A set of byte ranges of tile memory, for the compile-time checks that decide whether data
// movements may run out of program order: add ranges, seal, then ask about overlaps.
class ByteRanges {
 public:
  void add(const std::byte* data, std::size_t bytes) {
    if (data == nullptr || bytes == 0) return;
    ranges_.emplace_back(address(data), address(data) + bytes);
    // Merged as they come once they double, so that millions of adjacent ranges (a compute
    // set's regions) take the memory of the few they merge into.
    if (ranges_.size() >= 2 * sealed_ + 4096) seal();
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
    sealed_ = out;
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
  std::size_t sealed_ = 0;  // ranges after the last seal
};

// Offsets of each key's run in a stable counting sort of keys in [0, buckets): the items of
// key t go to positions begin[t] .. begin[t + 1]; fills order with the items' new order.
std::vector<std::uint32_t> group_by(const std::vector<unsigned>& keys, unsigned buckets,
                                    std::vector<std::uint32_t>& order) {
  if (keys.size() > UINT32_MAX)
    throw std::length_error("more than 2^32 vertices or transfers in one program step");
  std::vector<std::uint32_t> begin(buckets + 1, 0);
  for (unsigned k : keys) ++begin[k + 1];
  std::partial_sum(begin.begin(), begin.end(), begin.begin());
  std::vector<std::uint32_t> next(begin.begin(), begin.end() - 1);
  order.assign(keys.size(), 0);
  for (std::size_t i = 0; i < keys.size(); ++i)
    order[next[keys[i]]++] = static_cast<std::uint32_t>(i);
  return begin;
}

// Whether an exchange reads any of the ranges, and adding what it reads to them.
template <class Exchange>
bool reads_any(const Exchange& ex, const ByteRanges& ranges) {
  bool found = false;
  for (const auto& tr : ex.transfers) {
    ex.for_each_read(tr, [&](const std::byte* src, std::size_t bytes) {
      found = found || ranges.overlaps(src, bytes);
    });
    if (found) return true;
  }
  return false;
}
template <class Exchange>
void add_reads(const Exchange& ex, ByteRanges& ranges) {
  for (const auto& tr : ex.transfers)
    ex.for_each_read(tr, [&](const std::byte* src, std::size_t bytes) { ranges.add(src, bytes); });
}

// A gather takes a run of transfers of up to this many rows each (4 bytes a row, against a
// transfer's 24 bytes).
constexpr std::uint32_t kMaxGatheredRows = 8;
}  // namespace

void Engine::CompiledExchange::compact(std::vector<std::uint32_t> tile_starts) {
  // Each pass rewrites the transfers in place (a transfer is written no earlier than it is
  // read); when they are grouped by tile, a merged transfer stays within its tile's group.
  // merge(i, e) looks at transfers[i .. e) and returns how many it merged into transfers[w]
  // (0: none, transfers[i] is kept as it is).
  const auto pass = [&](auto&& merge) {
    const std::size_t segments = tile_starts.empty() ? 1 : tile_starts.size() - 1;
    std::size_t w = 0;
    for (std::size_t seg = 0; seg < segments; ++seg) {
      const std::size_t b = tile_starts.empty() ? 0 : tile_starts[seg],
                        e = tile_starts.empty() ? transfers.size() : tile_starts[seg + 1];
      if (!tile_starts.empty()) tile_starts[seg] = w;
      for (std::size_t i = b; i < e;) {
        const std::size_t merged = merge(i, e, w);
        if (merged == 0) transfers[w] = transfers[i++];
        i += merged;
        ++w;
      }
    }
    if (!tile_starts.empty()) tile_starts.back() = w;
    transfers.resize(w);
  };
  // Gathers: rows of one size (transfers of up to kMaxGatheredRows rows) that continue the
  // destination before them.
  const auto gatherable = [](const Transfer& t) {
    return t.strided() && t.count <= kMaxGatheredRows && (t.count == 1 || t.dst_stride == t.bytes);
  };
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::size_t>> kept;  // at, rows
  pass([&](std::size_t i, std::size_t e, std::size_t w) -> std::size_t {
    if (!gatherable(transfers[i])) return 0;
    std::size_t j = i + 1;
    std::uint64_t n = transfers[i].count;
    for (; j < e && gatherable(transfers[j]) && transfers[j].bytes == transfers[i].bytes &&
           transfers[j].dst == transfers[j - 1].dst +
                                   std::size_t{transfers[j - 1].count} * transfers[j - 1].bytes &&
           n + transfers[j].count <= UINT32_MAX;
         ++j)
      n += transfers[j].count;
    if (j - i < 2 || sources.size() + n > UINT32_MAX) return 0;
    const Transfer first = transfers[i];
    std::size_t at = sources.size();
    for (std::size_t k = i; k < j; ++k)
      for (std::uint32_t r = 0; r < transfers[k].count; ++r)
        sources.push_back(transfers[k].src + r * transfers[k].src_stride);
    // The same sources as a list kept before, shifted (the next block of the same planes):
    // the gather reuses that list. Lists are found by the hash of their offsets from their
    // first source.
    std::uint64_t key = n;
    for (std::size_t k = 1; k < n; ++k) key = counter_hash(key ^ (sources[at + k] - sources[at]));
    std::uint32_t shift = 0;
    if (auto it = kept.find(key); it != kept.end() && it->second.second == n) {
      const std::size_t before = it->second.first;
      shift = sources[at] - sources[before];
      bool same = true;
      for (std::size_t k = 1; k < n && same; ++k)
        same = sources[at + k] - sources[before + k] == shift;
      if (same) {
        sources.resize(at);
        at = before;
      } else {
        shift = 0;
      }
    } else {
      kept.emplace(key, std::make_pair(at, n));
    }
    transfers[w] = {Transfer::kGather,
                    first.dst,
                    first.bytes,
                    static_cast<std::uint32_t>(n),
                    static_cast<std::uint32_t>(at),
                    shift};
    return j - i;
  });
  // Lists: the single rows left, when several come together.
  const auto single = [](const Transfer& t) { return t.strided() && t.count == 1; };
  pass([&](std::size_t i, std::size_t e, std::size_t w) -> std::size_t {
    std::size_t j = i;
    while (j < e && single(transfers[j]) && j - i < UINT32_MAX) ++j;
    if (j - i < 2 || rows.size() + (j - i) > UINT32_MAX) return 0;
    const std::size_t at = rows.size();
    for (std::size_t k = i; k < j; ++k)
      rows.push_back({transfers[k].src, transfers[k].dst, transfers[k].bytes});
    transfers[w] = {Transfer::kList,
                    0,
                    0,
                    static_cast<std::uint32_t>(j - i),
                    static_cast<std::uint32_t>(at),
                    0};
    return j - i;
  });
  transfers.shrink_to_fit();
  sources.shrink_to_fit();
  rows.shrink_to_fit();
  tile_begin = TileStarts(tile_starts);
}

namespace {

void give_back_free_pages() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace

Engine::Engine(const Graph& graph, std::map<std::string, Program> programs, EngineOptions options)
    : Engine(graph, nullptr, std::move(programs), options) {}

Engine::Engine(Graph& graph, std::map<std::string, Program> programs, EngineOptions options,
               ReleaseGraphTables)
    : Engine(graph, &graph, std::move(programs), options) {}

Engine::Engine(const Graph& graph, Graph* releasable, std::map<std::string, Program> programs,
               EngineOptions options)
    : graph_(graph),
      releasable_(releasable),
      options_(options),
      pool_(std::make_unique<ThreadPool>(options.threads)) {
  if (options_.executable && !graph.keeps_vertex_regions())
    throw std::logic_error(
        "an engine that can run needs the vertices' regions, which this graph dropped "
        "(Graph::drop_vertex_regions): build it with executable = false, or keep them");
  if (options_.executable && !graph.keeps_vertex_params())
    throw std::logic_error(
        "an engine that can run needs the vertices' parameters, which this graph dropped "
        "(Graph::drop_vertex_params): build it with executable = false, or keep them");
  allocate_memory(programs);
  if (releasable_ != nullptr) give_back_free_pages();  // the plan's working sets
  for (auto& [name, program] : programs)
    programs_.emplace(name, std::make_unique<Node>(compile(program)));
  if (releasable_ != nullptr && options_.executable) {
    programs.clear();  // the copy runs, where the caller gave the engine the only copy
    release_mappings();
  }
}

void Engine::release_mappings() {
  // The compiled programs hold their tile addresses; the host reads and writes only the
  // variables check_host_access allows, so only theirs are kept.
  const auto& vars = graph_.variables();
  std::vector<std::size_t> begin(vars.size() + 1, 0);
  std::vector<std::uint32_t> offsets;
  for (VariableId id = 0; id < vars.size(); ++id) {
    begin[id] = offsets.size();
    if (vars[id].host_access || always_live(vars[id].category)) {
      offsets.insert(
          offsets.end(),
          interval_offsets_.begin() + static_cast<std::ptrdiff_t>(interval_offset_begin_[id]),
          interval_offsets_.begin() + static_cast<std::ptrdiff_t>(interval_offset_begin_[id + 1]));
    } else {
      releasable_->release_mapping(id);
    }
  }
  begin[vars.size()] = offsets.size();
  interval_offset_begin_ = std::move(begin);
  interval_offsets_ = std::move(offsets);
}

Engine::~Engine() = default;

void Engine::release_compiled(ComputeSetId id) {
  const ComputeSet& cs = graph_.compute_sets()[id];
  const std::size_t bytes =
      cs.vertices.capacity() * sizeof(VertexRecord) + cs.entries.capacity() * sizeof(RegionEntry) +
      (cs.field_ends.capacity() + cs.vertex_state_regions.capacity()) * sizeof(std::uint32_t) +
      cs.params.bytes();
  releasable_->release_vertex_tables(id);
  freed(bytes);
}

void Engine::release_compiled(const Program& copy) {
  const std::size_t bytes = copy.runs().capacity() * sizeof(CopyRun);
  copy.release_copy_data();
  freed(bytes);
}

void Engine::freed(std::size_t bytes) {
  // glibc keeps freed memory resident in its free lists, where the engine's tables, built
  // meanwhile, reuse only part of it (the pieces are of other sizes): give the pages back now
  // and then, so that a full-size stage's rank never holds both the graph's tables and the
  // engine's.
  constexpr std::size_t kTrimEvery = std::size_t{64} << 20;
  freed_since_trim_ += bytes;
  if (freed_since_trim_ < kTrimEvery) return;
  freed_since_trim_ = 0;
  give_back_free_pages();
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
      if (node.kind == Program::Kind::sequence && options_.executable) {
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
      if (cs.released)
        throw std::logic_error("compute set '" + cs.name +
                               "': its vertex tables were released by an earlier engine");
      auto ccs = std::make_unique<CompiledComputeSet>();
      // A plan keeps only the cycles (the tiles' checks are made all the same).
      const bool tables = options_.executable;
      if (tables) {
        ccs->regions.reserve(cs.entries.size());
        ccs->base = tile_memory_.data();
        ccs->vertices.reserve(cs.vertices.size());
      }
      const auto& registry = CodeletRegistry::builtin();
      // The busy cycles of each worker context of each tile (tile t's are at t * workers).
      const std::size_t workers = arch.workers_per_tile;
      std::vector<std::uint64_t> worker_loads(std::size_t{arch.tiles} * workers, 0);
      std::vector<Piece> pieces;
      std::vector<unsigned> vertex_tiles;
      std::size_t vi = 0;
      const auto pack = [&](const std::byte* data, std::size_t elements, DType dtype) {
        CompiledComputeSet::PackedRegion packed;
        if (elements >= (std::size_t{1} << 28))
          throw std::length_error("a vertex region of " + std::to_string(elements) +
                                  " elements: the run table holds fewer than 2^28 a region");
        packed.elements_and_dtype =
            static_cast<std::uint32_t>(elements << 4 | static_cast<std::uint32_t>(dtype));
        if (data != nullptr) packed.offset = static_cast<std::uint32_t>(data - tile_memory_.data());
        return packed;
      };
      for (const VertexRecord& v : cs.vertices) {
        const Codelet& codelet = registry.at(v.codelet);
        CompiledComputeSet::VertexRuntime rt{static_cast<std::uint32_t>(ccs->field_ends.size()),
                                             v.first_param, v.params, v.codelet, v.fields};
        const std::size_t first_entry = ccs->regions.size();
        bool one_entry_a_field = v.fields > 0;
        if (tables) ccs->field_ends.push_back(static_cast<std::uint32_t>(first_entry));
        if (v.slices > 1) rt.flags |= CompiledComputeSet::VertexRuntime::kSliced;
        if ((v.flags & VertexRecord::kHeaded) != 0)
          rt.flags |= CompiledComputeSet::VertexRuntime::kHeaded;
        if ((v.flags & VertexRecord::kStepped) != 0)
          rt.flags |= CompiledComputeSet::VertexRuntime::kStepped;
        // (A graph without regions checked them as they came: Graph::drop_vertex_regions.)
        for (std::size_t f = 0; f < v.fields && graph_.keeps_vertex_regions(); ++f) {
          std::size_t last = CompiledComputeSet::kNoEntry;
          cs.for_each_region(v, f, [&](const FieldRegion& field_region) {
            pieces.clear();
            resolve_into(field_region.var, field_region.offset,
                         field_region.offset + field_region.elements, pieces);
            const auto region = [&] { return graph_.tensor(field_region); };
            const DType dtype = graph_.variable(field_region.var).dtype;
            for (const auto& piece : pieces)
              if (piece.tile != v.tile)
                throw std::logic_error(
                    "vertex " + std::to_string(vi) + " (" + codelet.name + ") on tile " +
                    std::to_string(v.tile) + " in compute set '" + cs.name + "': field '" +
                    codelet.fields[f] + "' is connected to " + graph_.describe(region()) +
                    " which lives on tile " + std::to_string(piece.tile) +
                    "; a vertex may only touch its own tile's memory (copy the data first)");
            if (pieces.size() > 1)
              throw std::logic_error("vertex " + std::to_string(vi) + " (" + codelet.name +
                                     "): field '" + codelet.fields[f] + "' region " +
                                     graph_.describe(region()) +
                                     " is not contiguous in tile memory; split it into regions");
            if (!tables) return;
            CompiledComputeSet::add_region(
                ccs->regions, last,
                pack(pieces.empty() ? nullptr : pieces[0].data, field_region.elements, dtype));
            if (dtype == DType::f16 && !codelet.reads_float16_storage)
              rt.flags |= CompiledComputeSet::VertexRuntime::kWidensFloat16;
          });
          if (!tables) continue;
          const std::size_t field_begin = ccs->field_ends.back();
          const std::size_t entries = ccs->regions.size() - field_begin;
          one_entry_a_field &=
              entries == 1 || (entries == 2 && (ccs->regions[field_begin].elements_and_dtype &
                                                CompiledComputeSet::PackedRegion::kRepeated) != 0);
          ccs->field_ends.push_back(static_cast<std::uint32_t>(ccs->regions.size()));
        }
        if (tables && one_entry_a_field) {  // no field ends needed
          ccs->field_ends.resize(rt.field_begin);
          rt.field_begin = static_cast<std::uint32_t>(first_entry);
          rt.flags |= CompiledComputeSet::VertexRuntime::kOneEntryAField;
        }
        if (tables) ccs->vertices.push_back(rt), vertex_tiles.push_back(v.tile);
        // Greedy: each vertex (each worker slice of one) goes to the least-loaded of the tile's
        // worker contexts.
        const auto loads = worker_loads.begin() + static_cast<std::ptrdiff_t>(v.tile * workers);
        for (std::size_t k = 0; k < v.slices; ++k)
          *std::min_element(loads, loads + static_cast<std::ptrdiff_t>(workers)) +=
              cs.cycles_of(v, k);
        ++vi;
      }
      ccs->cycles =
          worker_loads.empty() ? 0 : *std::max_element(worker_loads.begin(), worker_loads.end());
      if (tables) {  // (a plan keeps only the cycles)
        ccs->params = cs.params;
        ccs->field_ends.shrink_to_fit();
        ccs->heads = cs.heads;
        // The vertices in tile order (graph order within a tile): those of tile t are
        // vertices[tile_begin[t] .. tile_begin[t + 1]).
        std::vector<std::uint32_t> order;
        ccs->tile_begin = TileStarts(group_by(vertex_tiles, arch.tiles, order));
        std::vector<CompiledComputeSet::VertexRuntime> sorted;
        sorted.reserve(order.size());
        for (std::uint32_t k : order) sorted.push_back(ccs->vertices[k]);
        ccs->vertices = std::move(sorted);
      }
      node.index = compute_sets_.size();
      compiled_compute_sets_.emplace(p.compute_set(), node.index);
      compute_sets_.push_back(std::move(ccs));
      if (releasable_ != nullptr) release_compiled(p.compute_set());
      break;
    }
    case Program::Kind::copy: {
      node.name = "exchange";
      if (auto it = compiled_exchanges_.find(p.identity()); it != compiled_exchanges_.end()) {
        node.index = it->second;
        break;
      }
      auto ex = std::make_unique<CompiledExchange>();
      ex->base = tile_memory_.data();
      std::vector<std::size_t> bytes_out(arch.tiles, 0), bytes_in(arch.tiles, 0);
      std::vector<unsigned> dst_tiles;  // of each transfer
      // The transfer each (source tile, destination tile) pair of the current copy run last
      // made. The rows of one run write disjoint bytes and read none that the run writes (two
      // different variables, both live), so a row may join its tiles' transfer even if other
      // transfers came in between; across runs only the last transfer is joined, keeping
      // program order.
      std::unordered_map<std::uint64_t, std::size_t> open;
      unsigned last_src_tile = 0;
      const auto joins = [](CompiledExchange::Transfer& t, std::uint32_t src, std::uint32_t dst,
                            std::size_t bytes) {
        if (t.bytes != bytes) return false;
        if (t.count == 1) {
          if (src < t.src || dst < t.dst + bytes) return false;
          t.src_stride = src - t.src;
          t.dst_stride = dst - t.dst;
          t.count = 2;
          return true;
        }
        if (t.count == UINT32_MAX || src != t.src + std::uint64_t{t.count} * t.src_stride ||
            dst != t.dst + std::uint64_t{t.count} * t.dst_stride)
          return false;
        ++t.count;
        return true;
      };
      // One row of bytes from tile s to tile d: the next row of a transfer between the same
      // tiles at the same strides, else a new transfer.
      const auto emit = [&](unsigned s, const std::byte* src_data, unsigned d,
                            const std::byte* dst_data, std::size_t bytes, bool within_run) {
        bytes_out[s] += bytes;
        bytes_in[d] += bytes;
        if (src_data == nullptr || dst_data == nullptr)
          return;  // out of memory: no tile memory to move
        const auto src = static_cast<std::uint32_t>(src_data - ex->base),
                   dst = static_cast<std::uint32_t>(dst_data - ex->base);
        const std::uint64_t key = std::uint64_t{s} << 32 | d;
        if (within_run) {
          if (auto it = open.find(key);
              it != open.end() && joins(ex->transfers[it->second], src, dst, bytes))
            return;
        } else if (!ex->transfers.empty() && last_src_tile == s && dst_tiles.back() == d &&
                   joins(ex->transfers.back(), src, dst, bytes)) {
          open[key] = ex->transfers.size() - 1;  // the run's later rows may join it too
          return;
        }
        ex->transfers.push_back({src, dst, static_cast<std::uint32_t>(bytes), 1, 0, 0});
        dst_tiles.push_back(d);
        last_src_tile = s;
        open[key] = ex->transfers.size() - 1;
      };
      std::vector<Piece> s, d;
      const auto plan = [&](std::size_t esize, bool within_run) {
        std::size_t si = 0, di = 0, soff = 0, doff = 0;
        while (si < s.size() && di < d.size()) {
          const std::size_t n = std::min(s[si].elements - soff, d[di].elements - doff);
          // A row of a transfer holds at most 2^32 - 1 bytes.
          for (std::size_t done = 0; done < n;) {
            const std::size_t m = std::min<std::size_t>(n - done, UINT32_MAX / esize);
            emit(s[si].tile, s[si].data + (soff + done) * esize, d[di].tile,
                 d[di].data + (doff + done) * esize, m * esize, within_run);
            done += m;
          }
          soff += n;
          doff += n;
          if (soff == s[si].elements) ++si, soff = 0;
          if (doff == d[di].elements) ++di, doff = 0;
        }
      };
      // Without tile memory (a plan, or a graph that does not fit) nothing moves and the cycles
      // need only each tile's bytes out and in: each side's counted on its own.
      const bool counting_only = tile_memory_.data() == nullptr;
      // A run's rows, each `elements` long from `first` + row x `stride`, on one side: the
      // bytes each tile holds. Rows mostly fall in the mapping interval of the row before or
      // the next ones, so the search starts there.
      const auto count = [&](VariableId var, std::size_t first, std::size_t stride,
                             std::uint64_t rows, std::size_t elements, std::size_t esize,
                             std::vector<std::size_t>& per_tile) {
        const auto& m = graph_.variable(var).mapping;
        if (m.empty() || rows == 0 || elements == 0) return;
        const std::size_t last_end = first + (rows - 1) * stride + elements;
        std::size_t k = static_cast<std::size_t>(
            std::upper_bound(m.begin(), m.end(), first,
                             [](std::size_t x, const TileInterval& iv) { return x < iv.end; }) -
            m.begin());
        if (k < m.size() && m[k].begin <= first && last_end <= m[k].end) {
          per_tile[m[k].tile] += rows * elements * esize;  // every row in one interval
          return;
        }
        for (std::uint64_t row = 0; row < rows; ++row) {
          const std::size_t b = first + row * stride, e = b + elements;
          if (k >= m.size() || b < m[k].begin) {
            k = static_cast<std::size_t>(
                std::upper_bound(m.begin(), m.end(), b,
                                 [](std::size_t x, const TileInterval& iv) { return x < iv.end; }) -
                m.begin());
          } else {
            for (std::size_t step = 0; k < m.size() && m[k].end <= b; ++step, ++k)
              if (step == 8) {
                k = static_cast<std::size_t>(
                    std::upper_bound(
                        m.begin() + static_cast<std::ptrdiff_t>(k), m.end(), b,
                        [](std::size_t x, const TileInterval& iv) { return x < iv.end; }) -
                    m.begin());
                break;
              }
          }
          for (std::size_t i = k; i < m.size() && m[i].begin < e; ++i)
            per_tile[m[i].tile] +=
                (std::min<std::size_t>(m[i].end, e) - std::max<std::size_t>(m[i].begin, b)) * esize;
        }
      };
      for (const CopyRun& r : p.runs()) {
        open.clear();
        if (counting_only) {
          const std::size_t esize = dtype_size(r.dtype);
          count(r.src, r.src_offset, r.src_stride, r.rows, r.elements, esize, bytes_out);
          count(r.dst, r.dst_offset, r.dst_stride, r.rows, r.elements, esize, bytes_in);
          continue;
        }
        for (std::uint64_t row = 0; row < r.rows; ++row) {
          s.clear();
          d.clear();
          resolve_into(r.src, r.src_offset + row * r.src_stride,
                       r.src_offset + row * r.src_stride + r.elements, s);
          resolve_into(r.dst, r.dst_offset + row * r.dst_stride,
                       r.dst_offset + row * r.dst_stride + r.elements, d);
          // The first row keeps program order with the runs before it.
          plan(dtype_size(r.dtype), row > 0);
        }
      }
      // Views: each element of the source to the same logical element of the destination,
      // piece by piece (a transposed source moves element by element).
      for (const auto& [src, dst] : p.view_pairs()) {
        s = resolve(src);
        d = resolve(dst);
        plan(dtype_size(src.dtype()), false);
      }
      ex->transfers.shrink_to_fit();
      const std::size_t worst = std::max(*std::max_element(bytes_out.begin(), bytes_out.end()),
                                         *std::max_element(bytes_in.begin(), bytes_in.end()));
      ex->cycles = arch.exchange_latency_cycles +
                   static_cast<std::uint64_t>(std::ceil(static_cast<double>(worst) /
                                                        arch.exchange_bytes_per_cycle_per_tile));
      // On hardware every tile's receives happen at once; here the transfers may run grouped
      // by destination tile unless one reads what another writes (then program order decides).
      // A transfer of several rows counts as reading and writing all its span.
      ByteRanges written;
      for (const auto& tr : ex->transfers) written.add(ex->base + tr.dst, tr.dst_span());
      written.seal();
      std::vector<std::uint32_t> tile_starts;
      if (!reads_any(*ex, written)) {
        std::vector<std::uint32_t> order;
        tile_starts = group_by(dst_tiles, arch.tiles, order);
        if (!std::is_sorted(dst_tiles.begin(), dst_tiles.end())) {  // else already grouped
          std::vector<CompiledExchange::Transfer> grouped;
          grouped.reserve(order.size());
          for (std::size_t i : order) grouped.push_back(ex->transfers[i]);
          ex->transfers = std::move(grouped);
        }
      }
      ex->compact(std::move(tile_starts));
      node.index = exchanges_.size();
      compiled_exchanges_.emplace(p.identity(), node.index);
      exchanges_.push_back(std::move(ex));
      if (releasable_ != nullptr) release_compiled(p);
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
    cs.for_each_region([&](const std::byte* data, std::size_t bytes) { touched.add(data, bytes); });
    touched.seal();
    if (reads_any(ex, touched)) continue;
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
            ex.for_each_read(ex.transfers[k], [&](const std::byte* src, std::size_t) {
              joined.join(tile_at(src), static_cast<unsigned>(t));
            });
        if (joined.largest() > max_group) break;
        if (j == i + 1) {
          add_reads(*exchanges_[*steps[i].exchange], read);
          read.seal();
        }
        // A group runs all its steps before the next group starts, so no later step may write
        // what an earlier exchange still reads for another group (vertex regions count as
        // written: a codelet does not say which of its fields it changes).
        bool overwrites = false;
        for (const auto& tr : ex.transfers)
          ex.for_each_write(tr, [&](const std::byte* data, std::size_t bytes) {
            overwrites = overwrites || read.overlaps(data, bytes);
          });
        if (overwrites) break;
        bool clash = false;
        cs.for_each_region([&](const std::byte* data, std::size_t bytes) {
          clash = clash || read.overlaps(data, bytes);
        });
        if (clash) break;
        groups = std::move(joined);
        add_reads(ex, read);
        read.seal();
      }
      if (j - i >= 2) {
        Node chain;
        std::vector<unsigned> roots(tiles);
        for (unsigned t = 0; t < tiles; ++t) roots[t] = groups.find(t);
        std::vector<std::uint32_t> order;
        const std::vector<std::uint32_t> begin = group_by(roots, tiles, order);
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

}  // namespace ipupod::ipu

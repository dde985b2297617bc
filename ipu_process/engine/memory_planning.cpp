// Engine memory planning: each variable's live range over the programs, a liveness-aware static
// layout per tile and the memory report; the tile memory block; where a tensor's elements live.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <span>
#include <sstream>

#include "ipu_process/engine.hpp"
#include "ipu_process/engine/engine_internal.hpp"
#include "ipu_process/engine/liveness.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ipupod::ipu {

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

using liveness::LivenessWalk;
using liveness::LiveRange;

struct Placement {
  std::size_t offset, bytes;
  const LiveRange* range;
  VariableId var;
};

// Per tile: places variables one by one, in the order they come to life, at the lowest offset
// not used by any placed variable whose live range meets theirs. The placed variables still
// alive are kept sorted by offset; a search walks them upwards from the floor and stops at the
// first gap that fits, so it costs about the number of entries below the answer, and a
// variable whose last step has passed leaves for good (no later one can meet it).
// Variables that never meet stack up at the same bytes (a layer's small temporaries, live for a
// step in each micro-batch, share one offset): those of the same bytes [begin, end) are one
// entry, a column, which keeps the steps its members are live as a bitmap, so that the search
// tests a column at once. That finds the same offsets as testing its members one by one: after
// the first that meets, the others end below the search's offset.
// A column also keeps its steps folded modulo `period` (a micro-batch's slot of the pipeline,
// which most ranges repeat at): a range whose folded steps miss the column's cannot meet it,
// which a few words tell where the full bitmaps take one or two words per micro-batch.
class TileLayout {
 public:
  // `steps`: past the last step position of any range placed; `period`: the fold (0: none).
  TileLayout(std::size_t floor, std::size_t steps, std::size_t period)
      : floor_(floor),
        solid_(floor),
        words_((steps + 63) / 64),
        period_(period),
        fold_words_((period + 63) / 64) {}

  // Places a variable of `bytes` bytes with live range `range` (which must outlive the layout).
  // Variables live for the whole run come first, then by first step.
  std::size_t place(const LiveRange& range, std::size_t bytes) {
    // Variables live for the whole run come first and meet every other: they stack up from
    // the floor, which rises past them (no later search need walk them).
    if (range.whole_run && alive_.empty()) {
      const std::size_t offset = floor_;
      floor_ = align_up(offset + bytes);
      solid_ = floor_;
      return offset;
    }
    if (!range.whole_run) retire_before(range.first);
    // No offset below solid_ fits (see solid_), so the search starts there; an entry that
    // begins more than the largest block alive below it ends below it (retired entries are
    // skipped anyway).
    std::size_t offset = solid_;
    const std::size_t largest = sizes_.empty() ? 0 : *sizes_.rbegin();
    auto it = first_at_or_above(solid_ - std::min(solid_, largest));
    const Run only = only_run(range);
    query_.clear();  // the range's steps as bitmap words, made at the first column met
    folded_query_.clear();
    for (; it != alive_.end(); ++it) {
      const Entry& e = *it;
      if (e.begin >= offset + bytes) break;
      if (e.end <= offset || e.members == 0) continue;
      if (!meets(range, only, e)) continue;
      offset = align_up(e.end);
    }
    sizes_.insert(bytes);
    if (!range.whole_run) leaving_.push({range.last, offset, offset + bytes, &range});
    const bool is_sure = range.solid();
    if (Entry* column = alive_at(offset, offset + bytes);
        column != nullptr && !range.whole_run && !column->range->whole_run) {
      join(*column, range);
      column->sure += is_sure ? 1 : 0;
    } else {
      const Entry entry{offset, offset + bytes, &range, only, 1, is_sure ? 1U : 0U, -1};
      alive_.insert(
          std::upper_bound(alive_.begin(), alive_.end(), entry,
                           [](const Entry& x, const Entry& y) { return x.begin < y.begin; }),
          entry);
    }
    if (offset == solid_) extend_solid();
    return offset;
  }

 private:
  using Run = LiveRange::Run;
  struct Entry {
    std::size_t begin, end;
    const LiveRange* range;    // its first member's
    Run only;                  // that range's only run, or count 0 (see only_run)
    std::uint32_t members;     // alive; 0 once all left
    std::uint32_t sure;        // members that are sure (see sure())
    std::int32_t column = -1;  // its bitmap in columns_ once it has had two members
  };
  // A range's only run, or one of count 0 when it has several or is live throughout: the search
  // compares a run in hand, not each range's runs.
  static Run only_run(const LiveRange& r) {
    return !r.whole_run && r.runs.size() == 1 ? r.runs.front() : Run{0, 0, 0, 0};
  }
  struct Leaving {
    std::size_t last, begin, end;
    const LiveRange* range;
    bool operator>(const Leaving& o) const { return last > o.last; }
  };

  std::vector<Entry>::iterator first_at_or_above(std::size_t begin) {
    return std::lower_bound(alive_.begin(), alive_.end(), begin,
                            [](const Entry& e, std::size_t b) { return e.begin < b; });
  }
  // The entry with members at exactly [begin, end), if any.
  Entry* alive_at(std::size_t begin, std::size_t end) {
    for (auto it = first_at_or_above(begin); it != alive_.end() && it->begin == begin; ++it)
      if (it->end == end && it->members != 0) return &*it;
    return nullptr;
  }

  // Whether range r (whose only run is `only`) meets a member of entry e.
  bool meets(const LiveRange& r, const Run& only, const Entry& e) {
    if (e.column >= 0) {
      if (r.whole_run) return true;
      if (period_ != 0) {
        if (folded_query_.empty()) folded_query(r);
        const std::uint64_t* folded = &folds_[e.column * fold_words_];
        if (std::none_of(folded_query_.begin(), folded_query_.end(),
                         [&](const auto& q) { return (folded[q.first] & q.second) != 0; }))
          return false;
      }
      if (query_.empty()) query(r);
      const std::vector<std::uint64_t>& bits = columns_[e.column];
      return std::any_of(query_.begin(), query_.end(),
                         [&](const auto& q) { return (bits[q.first] & q.second) != 0; });
    }
    // Most ranges are one run: those compare on the copies in hand.
    return only.count != 0 && e.only.count != 0 ? meet(only, e.only) : meet(r, *e.range);
  }
  // Adds a member to an entry: its steps go into the entry's bitmap (made at the second).
  // Those of members that have left stay: they are before any step of a range placed later.
  void join(Entry& e, const LiveRange& r) {
    if (e.column < 0) {
      if (free_columns_.empty()) {
        columns_.emplace_back(words_, 0);
        folds_.resize(folds_.size() + fold_words_, 0);
        e.column = static_cast<std::int32_t>(columns_.size() - 1);
      } else {
        e.column = free_columns_.back();
        free_columns_.pop_back();
        std::fill(columns_[e.column].begin(), columns_[e.column].end(), 0);
        std::fill_n(folds_.begin() + e.column * fold_words_, fold_words_, 0);
      }
      add_steps(e.column, *e.range);
    }
    add_steps(e.column, r);
    ++e.members;
  }
  void add_steps(std::int32_t column, const LiveRange& r) {
    set_steps(columns_[column], r);
    if (period_ != 0)
      set_folded(std::span<std::uint64_t>(folds_).subspan(column * fold_words_, fold_words_), r);
  }
  // Sets the bits of r's steps modulo period_.
  void set_folded(std::span<std::uint64_t> bits, const LiveRange& r) const {
    const auto set = [&](std::size_t a, std::size_t b) {  // [a, b] within a period
      for (std::size_t w = a / 64; w <= b / 64; ++w) bits[w] |= word_mask(w, a, b);
    };
    for (const Run& run : r.runs)
      for (std::size_t k = 0; k < run.count; ++k) {
        if (run.length + 1 >= period_) {
          std::fill(bits.begin(), bits.end(), ~std::uint64_t{0});
          return;
        }
        const std::size_t a = run.segment(k) % period_, b = (run.segment(k) + run.length) % period_;
        if (a <= b) {
          set(a, b);
        } else {
          set(a, period_ - 1);
          set(0, b);
        }
      }
  }
  // Calls f(w, mask) with the bits of word w of a step bitmap that each segment of r covers.
  template <typename F>
  static void for_each_word(const LiveRange& r, F f) {
    for (const Run& run : r.runs)
      for (std::size_t k = 0; k < run.count; ++k) {
        const std::size_t first = run.segment(k), last = first + run.length;
        for (std::size_t w = first / 64; w <= last / 64; ++w) f(w, word_mask(w, first, last));
      }
  }
  static void set_steps(std::vector<std::uint64_t>& bits, const LiveRange& r) {
    for_each_word(r, [&](std::size_t w, std::uint64_t mask) { bits[w] |= mask; });
  }
  // folded_query_ = the words of r's steps folded modulo period_ that have any.
  void folded_query(const LiveRange& r) {
    scratch_.assign(fold_words_, 0);
    set_folded(scratch_, r);
    for (std::size_t w = 0; w < fold_words_; ++w)
      if (scratch_[w] != 0) folded_query_.emplace_back(static_cast<std::uint32_t>(w), scratch_[w]);
  }
  // query_ = the words of r's steps, each word once.
  void query(const LiveRange& r) {
    for_each_word(r, [&](std::size_t w, std::uint64_t mask) {
      if (!query_.empty() && query_.back().first == w)
        query_.back().second |= mask;
      else
        query_.emplace_back(static_cast<std::uint32_t>(w), mask);
    });
  }
  // The bits of steps [a, b] in word w.
  static std::uint64_t word_mask(std::size_t w, std::size_t a, std::size_t b) {
    const std::size_t lo = std::max(a, w * 64) - w * 64, hi = std::min(b, w * 64 + 63) - w * 64;
    return (~std::uint64_t{0} >> (63 - hi)) & (~std::uint64_t{0} << lo);
  }

  static bool meet(const LiveRange& a, const LiveRange& b) {
    if (a.whole_run || b.whole_run) return true;
    if (a.last < b.first || b.last < a.first) return false;
    // Runs of a range cover disjoint stretches in order: the one that ends first meets no later
    // run of the other. Runs that end before the other range begins are skipped by search.
    const auto ends_before = [](const Run& r, std::size_t step) { return r.end() < step; };
    auto i = std::lower_bound(a.runs.begin(), a.runs.end(), b.first, ends_before);
    auto j = std::lower_bound(b.runs.begin(), b.runs.end(), a.first, ends_before);
    while (i != a.runs.end() && j != b.runs.end() && i->begin <= b.last && j->begin <= a.last) {
      const std::size_t ei = i->end(), ej = j->end();
      if (ei < j->begin) {
        ++i;
      } else if (ej < i->begin) {
        ++j;
      } else if (meet(*i, *j)) {
        return true;
      } else if (ei < ej) {
        ++i;
      } else {
        ++j;
      }
    }
    return false;
  }

  static std::int64_t floor_div(std::int64_t a, std::int64_t b) {  // b > 0
    return a >= 0 ? a / b : -((-a + b - 1) / b);
  }
  static std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return -floor_div(-a, b); }
  // Whether steps [x, y] meet a segment of run r.
  static bool meet(std::int64_t x, std::int64_t y, const Run& r) {
    const auto b = static_cast<std::int64_t>(r.begin), l = static_cast<std::int64_t>(r.length);
    if (r.count == 1) return b <= y && x <= b + l;
    const auto p = static_cast<std::int64_t>(r.period), c = static_cast<std::int64_t>(r.count);
    // Segment k meets [x, y] when b + k p <= y and x <= b + l + k p.
    const std::int64_t lo = std::max<std::int64_t>(0, ceil_div(x - b - l, p));
    const std::int64_t hi = std::min<std::int64_t>(c - 1, floor_div(y - b, p));
    return lo <= hi;
  }
  // Whether a segment of run r meets one of run s.
  static bool meet(const Run& r, const Run& s) {
    // Few segments (a loop of a few slots): walked in step order, without a division.
    if (r.count + s.count <= 16) {
      std::size_t i = 0, j = 0, ri = r.begin, sj = s.begin;
      while (i < r.count && j < s.count) {
        if (ri + r.length < sj) {
          ++i, ri += r.period;
        } else if (sj + s.length < ri) {
          ++j, sj += s.period;
        } else {
          return true;
        }
      }
      return false;
    }
    if (r.count == 1)
      return meet(static_cast<std::int64_t>(r.begin), static_cast<std::int64_t>(r.begin + r.length),
                  s);
    if (s.count == 1) return meet(s, r);
    const auto b1 = static_cast<std::int64_t>(r.begin), l1 = static_cast<std::int64_t>(r.length),
               c1 = static_cast<std::int64_t>(r.count);
    const auto b2 = static_cast<std::int64_t>(s.begin), l2 = static_cast<std::int64_t>(s.length),
               c2 = static_cast<std::int64_t>(s.count);
    if (r.period == s.period) {
      // Segment k of r meets segment k + d of s when b1 - b2 - l2 <= d p <= b1 + l1 - b2.
      const auto p = static_cast<std::int64_t>(r.period);
      const std::int64_t lo = std::max(-(c1 - 1), ceil_div(b1 - b2 - l2, p));
      const std::int64_t hi = std::min(c2 - 1, floor_div(b1 + l1 - b2, p));
      return lo <= hi;
    }
    // Different periods: each segment of the run with fewer of them in the other's stretch.
    const Run& few = c1 <= c2 ? r : s;
    const Run& many = c1 <= c2 ? s : r;
    const auto b = static_cast<std::int64_t>(few.begin), l = static_cast<std::int64_t>(few.length),
               p = static_cast<std::int64_t>(few.period);
    const std::int64_t k0 =
        std::max<std::int64_t>(0, ceil_div(static_cast<std::int64_t>(many.begin) - b - l, p));
    const std::int64_t k1 =
        std::min<std::int64_t>(static_cast<std::int64_t>(few.count) - 1,
                               floor_div(static_cast<std::int64_t>(many.end()) - b, p));
    for (std::int64_t k = k0; k <= k1; ++k)
      if (meet(b + k * p, b + l + k * p, many)) return true;
    return false;
  }

  // An entry that meets every variable placed after it while it is alive: one live over a
  // single stretch of steps. Variables come in order of first step, and an entry not yet
  // retired lasts at least to the new one's first step, so its stretch holds that step. Such
  // entries meet each other too, hence never share bytes.
  // An entry holds at most one sure member at a time.
  static bool sure(const Entry& e) { return e.sure != 0; }

  // Moves solid_ up over the sure entries that continue it without a gap.
  void extend_solid() {
    for (;;) {
      auto it = std::lower_bound(alive_.begin(), alive_.end(), solid_,
                                 [](const Entry& e, std::size_t b) { return e.begin < b; });
      while (it != alive_.end() && it->begin == solid_ && !sure(*it)) ++it;
      if (it == alive_.end() || it->begin != solid_) return;
      solid_ = it->end;
    }
  }

  // Drops the variables whose last step is before `step`; compacts once half are dropped.
  void retire_before(std::size_t step) {
    while (!leaving_.empty() && leaving_.top().last < step) {
      const Leaving& l = leaving_.top();
      Entry& e = *alive_at(l.begin, l.end);
      // Its bytes are free now: the solid stretch ends there if it was part of it.
      if (l.range->solid()) {
        --e.sure;
        if (e.begin < solid_) solid_ = e.begin;
      }
      sizes_.erase(sizes_.find(l.end - l.begin));
      if (--e.members == 0) {
        if (e.column >= 0) free_columns_.push_back(e.column);
        ++retired_;
      }
      leaving_.pop();
    }
    if (2 * retired_ > alive_.size()) {
      std::erase_if(alive_, [](const Entry& e) { return e.members == 0; });
      retired_ = 0;
    }
  }

  std::size_t floor_;
  // [floor_, solid_) is covered, without a gap, by sure entries (and the stack of whole-run
  // variables below floor_): no variable placed from now on can start below solid_.
  std::size_t solid_;
  std::multiset<std::size_t> sizes_;  // of the entries alive above the floor: the largest
  std::vector<Entry> alive_;          // by offset
  std::priority_queue<Leaving, std::vector<Leaving>, std::greater<>> leaving_;
  std::size_t retired_ = 0;  // entries without members
  std::size_t words_;        // of a column's bitmap
  std::vector<std::vector<std::uint64_t>> columns_;
  std::vector<std::int32_t> free_columns_;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> query_;
  std::size_t period_, fold_words_;
  std::vector<std::uint64_t> folds_;  // column c's folded steps: fold_words_ words from c * them
  std::vector<std::pair<std::uint32_t, std::uint64_t>> folded_query_;
  std::vector<std::uint64_t> scratch_;
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
    for (const auto& [name, program] : programs) {
      const auto& timed = options_.timing_only_programs;
      if (std::find(timed.begin(), timed.end(), name) != timed.end()) continue;
      walk.walk_program(program, index++);
    }
  }
  std::size_t steps = 0;  // past the last step position
  std::vector<LiveRange::Run> runs;
  {
    std::size_t most = 0;
    for (const LiveRange& r : ranges) most += r.runs_at_most();
    runs.reserve(most);  // not grown by doubling: a full-size stage has millions
    std::vector<std::size_t> begin(ranges.size() + 1, 0);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      ranges[i].finish(runs);
      begin[i + 1] = runs.size();
      if (ranges[i].program >= 0) steps = std::max(steps, ranges[i].last + 1);
    }
    for (std::size_t i = 0; i < ranges.size(); ++i)
      ranges[i].runs =
          std::span<const LiveRange::Run>(runs).subspan(begin[i], begin[i + 1] - begin[i]);
  }
  // The fold of the columns' steps: the period most runs repeat at.
  std::size_t period = 0;
  {
    std::map<std::size_t, std::size_t> repeats;  // period: runs
    for (const LiveRange::Run& r : runs)
      if (r.count > 1) ++repeats[r.period];
    std::size_t most = 0;
    for (const auto& [p, n] : repeats)
      if (n > most) most = n, period = p;
  }
  // A variable's elements on one tile take one block of its memory (as Poplar lays out a
  // variable's tile elements contiguously), each mapping interval from an aligned offset, so
  // that the rows of a block (channel planes) lie at regular strides.
  struct Item {  // 20 bytes: a full-size stage has tens of millions
    std::uint32_t var;
    std::uint32_t first, last;  // its intervals: [first, last) of its tile's list (executable)
    std::uint32_t bytes = 0;    // of its elements
    std::uint32_t block = 0;    // of tile memory, with each interval's alignment
  };
  const auto too_large = [&](unsigned t) {
    return std::length_error("tile " + std::to_string(t) +
                             " would need more than 4 GiB of memory: the model is far too large "
                             "for one IPU");
  };
  // Each tile's items counted first, so that the tiles can be laid out a batch at a time, each
  // batch's lists taking just the memory they need.
  std::vector<std::size_t> count(arch.tiles, 0);
  {
    std::vector<VariableId> last_var(arch.tiles, ~VariableId{0});
    for (VariableId id = 0; id < vars.size(); ++id) {
      const Variable& v = vars[id];
      if (always_live(v.category) || v.host_access || ranges[id].program < 0)
        ranges[id].whole_run = true;
      std::size_t mapped = 0;
      for (const auto& iv : v.mapping) {
        if (last_var[iv.tile] != id) last_var[iv.tile] = id, ++count[iv.tile];
        mapped += iv.end - iv.begin;
      }
      if (mapped != v.elements)
        throw std::logic_error(
            "variable '" + v.name + "' has " + std::to_string(v.elements - mapped) + " of its " +
            std::to_string(v.elements) + " elements unmapped; every element needs a tile");
    }
  }
  // Only an engine that runs needs each interval's address.
  const bool addresses = options_.executable;
  interval_offset_begin_.assign(addresses ? vars.size() + 1 : 0, 0);
  for (VariableId id = 0; addresses && id < vars.size(); ++id)
    interval_offset_begin_[id + 1] = interval_offset_begin_[id] + vars[id].mapping.size();
  interval_offsets_.assign(addresses ? interval_offset_begin_.back() : 0, 0);

  // Per tile: always-live data at the bottom, then the rest in the order it comes to life, each
  // at the lowest free offset, its bytes free again after its last step (a linear scan over
  // the step positions): variables never live at the same time share bytes.
  std::vector<std::size_t> used(arch.tiles, 0);
  // The five largest of (bytes, variable) pairs, named (a tile can hold thousands of variables).
  const auto largest_of = [&](std::vector<std::pair<std::size_t, VariableId>>& by_size) {
    const std::size_t named = std::min<std::size_t>(by_size.size(), 5);
    std::partial_sort(by_size.begin(), by_size.begin() + static_cast<std::ptrdiff_t>(named),
                      by_size.end(), [](auto& a, auto& b) {
                        return a.first != b.first ? a.first > b.first : a.second < b.second;
                      });
    std::vector<TensorMemory> out;
    for (std::size_t i = 0; i < named; ++i) {
      const Variable& v = vars[by_size[i].second];
      out.push_back({v.name, v.category, by_size[i].first});
    }
    return out;
  };
  // Lays out tile t's items (tile_intervals: their intervals' indices, in an engine that runs).
  // `change`: steps + 1 zeros, the tile's bytes that change at each step position (left zero).
  // Tiles are laid out on their own: what one writes (its TileMemory, used[t], its intervals'
  // offsets) no other reads or writes, so the engine's threads take tiles in any order.
  const auto lay_out_tile = [&](unsigned t, const std::vector<Item>& items,
                                std::span<const std::uint32_t> tile_intervals,
                                std::vector<std::ptrdiff_t>& change) {
    // The offsets of an item's intervals once its block is at `offset` of tile t (none where
    // the engine does not run: its items list no intervals).
    const auto place_intervals = [&](const Item& it, std::size_t offset) {
      const Variable& v = vars[it.var];
      for (std::uint32_t j = it.first; j < it.last; ++j) {
        const std::uint32_t k = tile_intervals[j];
        if (offset > UINT32_MAX) throw too_large(t);
        interval_offsets_[interval_offset_begin_[it.var] + k] = static_cast<std::uint32_t>(offset);
        offset += align_up((v.mapping[k].end - v.mapping[k].begin) * dtype_size(v.dtype));
      }
    };
    TileMemory& tm = memory_.tiles[t];
    std::size_t top = 0;
    for (const Item& it : items) {
      const Variable& v = vars[it.var];
      tm.by_category[v.category] += it.bytes;
      if (!always_live(v.category)) continue;
      tm.peak_by_category[v.category] += it.bytes;
      place_intervals(it, align_up(top));
      top = align_up(top) + it.block;
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
    TileLayout layout(floor, steps, period);
    std::vector<Placement> placed;
    placed.reserve(rest.size());
    std::size_t high = floor;
    for (std::uint32_t k = 0; k < rest.size(); ++k) {
      const Item* it = rest[k];
      const LiveRange& range = ranges[it->var];
      const std::size_t offset = layout.place(range, it->block);
      place_intervals(*it, offset);
      placed.push_back({offset, it->bytes, &range, it->var});
      high = std::max(high, offset + it->block);
    }
    tm.not_always_live = rest.empty() ? 0 : high - top;
    // Peak of simultaneously live bytes, to tell sharing apart from fragmentation: the bytes
    // that come to life and leave at each step, summed up in step order.
    std::size_t whole = 0, lowest = SIZE_MAX, highest = 0;
    for (const auto& p : placed) {
      if (p.range->whole_run) {
        whole += p.bytes;
        continue;
      }
      const auto bytes = static_cast<std::ptrdiff_t>(p.bytes);
      for (const LiveRange::Run& r : p.range->runs) {
        for (std::size_t k = 0, b = r.begin; k < r.count; ++k, b += r.period) {
          change[b] += bytes;
          change[b + r.length + 1] -= bytes;
        }
        lowest = std::min<std::size_t>(lowest, r.begin);
        highest = std::max(highest, r.end() + 1);
      }
    }
    std::ptrdiff_t live = 0, peak = 0;
    std::size_t peak_at = SIZE_MAX;
    for (std::size_t pos = lowest; pos <= highest && lowest != SIZE_MAX; ++pos) {
      if ((live += change[pos]) > peak) peak = live, peak_at = pos;
      change[pos] = 0;
    }
    tm.peak_live = std::min(tm.not_always_live, whole + static_cast<std::size_t>(peak));
    // What is live at that step: by category, and the largest tensors.
    std::vector<std::pair<std::size_t, VariableId>> at_peak;
    for (const auto& p : placed) {
      bool live_then = p.range->whole_run;
      for (const LiveRange::Run& r : p.range->runs) {
        if (live_then || peak_at == SIZE_MAX || peak_at < r.begin) break;
        if (peak_at > r.end()) continue;
        const std::size_t into = peak_at - r.begin;
        live_then = r.count == 1 ? into <= r.length : into % r.period <= r.length;
      }
      if (!live_then) continue;
      tm.peak_by_category[vars[p.var].category] += p.bytes;
      at_peak.emplace_back(p.bytes, p.var);
    }
    tm.live_at_peak = largest_of(at_peak);
    used[t] = high;
    std::vector<std::pair<std::size_t, VariableId>> by_size;  // an item per variable
    by_size.reserve(items.size());
    for (const Item& it : items) by_size.emplace_back(it.bytes, it.var);
    tm.largest = largest_of(by_size);
  };
  constexpr std::size_t kBatches = 8;
  const std::size_t all_items = std::accumulate(count.begin(), count.end(), std::size_t{0});
  const std::size_t batch_items = std::max<std::size_t>(1, all_items / kBatches);
  for (unsigned t0 = 0, t1 = 0; t0 < arch.tiles; t0 = t1) {
    for (std::size_t n = 0; t1 < arch.tiles && (n == 0 || n + count[t1] <= batch_items); ++t1)
      n += count[t1];
    // The batch's items, and (to address them) each tile's list of interval indices.
    std::vector<std::vector<Item>> per_tile(t1 - t0);
    std::vector<std::vector<std::uint32_t>> intervals(addresses ? t1 - t0 : 0);
    for (unsigned t = t0; t < t1; ++t) per_tile[t - t0].reserve(count[t]);
    for (VariableId id = 0; id < vars.size(); ++id) {
      const Variable& v = vars[id];
      for (std::uint32_t k = 0; k < v.mapping.size(); ++k) {
        const auto& iv = v.mapping[k];
        if (iv.tile < t0 || iv.tile >= t1) continue;
        const std::size_t bytes = (iv.end - iv.begin) * dtype_size(v.dtype);
        auto& items = per_tile[iv.tile - t0];
        if (items.empty() || items.back().var != id) {
          const auto at =
              static_cast<std::uint32_t>(addresses ? intervals[iv.tile - t0].size() : 0);
          items.push_back({static_cast<std::uint32_t>(id), at, at});
        }
        if (addresses) intervals[iv.tile - t0].push_back(k), ++items.back().last;
        if (items.back().block + align_up(bytes) > UINT32_MAX) throw too_large(iv.tile);
        items.back().bytes += static_cast<std::uint32_t>(bytes);
        items.back().block += static_cast<std::uint32_t>(align_up(bytes));
      }
    }
    // The engine's threads take the batch's tiles one at a time as they finish the last, the
    // calling thread reporting progress; the layouts do not depend on which thread made them.
    std::atomic<unsigned> next{t0}, done{t0};
    unsigned reported = t0;
    // One call per thread (index 0 on the calling thread), each taking tiles until none is left.
    pool_->parallel_for(pool_->threads(), [&](std::size_t first, std::size_t) {
      std::vector<std::ptrdiff_t> change(steps + 1, 0);
      for (unsigned t; (t = next.fetch_add(1)) < t1;) {
        try {
          lay_out_tile(t, per_tile[t - t0],
                       addresses ? std::span<const std::uint32_t>(intervals[t - t0])
                                 : std::span<const std::uint32_t>(),
                       change);
        } catch (...) {
          next = t1;  // the others stop at their tile: the plan has failed
          throw;
        }
        std::vector<Item>().swap(per_tile[t - t0]);  // done with this tile
        if (addresses) std::vector<std::uint32_t>().swap(intervals[t - t0]);
        const unsigned finished = done.fetch_add(1) + 1;
        if (first == 0 && options_.memory_plan_progress && finished > reported)
          options_.memory_plan_progress(reported = finished, arch.tiles);
      }
    });
    if (options_.memory_plan_progress && reported != t1)
      options_.memory_plan_progress(t1, arch.tiles);
  }
  // Vertex state and code take their share of each tile, as on hardware.
  std::vector<std::set<std::uint16_t>> codelets_on_tile(arch.tiles);
  for (const auto& cs : graph_.compute_sets())
    for (const VertexRecord& v : cs.vertices) {
      memory_.tiles.at(v.tile).vertex_state +=
          cs.regions_of(v) * arch.vertex_state_bytes_per_region;
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
  if (over > 0 || !options_.executable) return;
  // Every tile's memory in one zeroed block, each tile's from a cache-line boundary, so that
  // the host can back it with large pages: the tiles of an IPU hold hundreds of MB, and with
  // 4 KiB pages a run would pay a page-table walk for most pages it touches.
  constexpr std::size_t kLine = 64;
  std::size_t total = 0;
  for (unsigned t = 0; t < arch.tiles; ++t) total += (used[t] + kLine - 1) / kLine * kLine;
  if (total == 0) return;
  // The run tables address tile memory with 32-bit offsets (an IPU's tiles hold under 1 GiB).
  if (total > CompiledExchange::kMaxOffset)
    throw std::length_error("the tiles use " + std::to_string(total) +
                            " bytes in all; an engine that runs addresses at most 4 GiB of tile "
                            "memory per IPU: use an architecture with less memory");
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
    const std::size_t lo = std::max<std::size_t>(it->begin, b),
                      hi = std::min<std::size_t>(it->end, e);
    std::byte* base = arenas_[it->tile];
    out.push_back(
        {it->tile,
         base ? base + interval_offsets_[interval_offset_begin_[var] + k] + (lo - it->begin) * esize
              : nullptr,
         hi - lo});
  }
}

}  // namespace ipupod::ipu

// Liveness of the device's variables (memory_planning.cpp's first half): each variable's live
// range over the programs' steps, as runs of repeated segments, and the walk that finds them.
// Only the memory plan includes this.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/engine.hpp"
#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::liveness {

// Live range of a variable in the order program steps run: [first, last] step positions, made
// of segments with holes between them where its value is dead (after its last read, before a
// step that overwrites it whole); other variables may use its bytes in a hole.
struct LiveRange {
  std::size_t first = SIZE_MAX, last = 0;
  int program = -1;
  bool whole_run = false;  // used by several programs or by none: live throughout
  // The segments [begin, end], in order, as runs of translates: a loop unrolled over many slots
  // (gradient accumulation) gives a variable a segment of the same shape in each slot, and
  // ranges compare run by run, not segment by segment. How the segments fall into runs does not
  // matter to what they mean. The last segment stays open (it may still grow) until finish().
  // Step positions take 32 bits (close() checks): a full-size stage has millions of runs.
  struct Run {
    std::uint32_t begin, length;  // its first segment: [begin, begin + length]
    std::uint32_t period, count;  // segment k: [begin + k * period, begin + length + k * period]
    std::size_t end() const { return segment(count - 1) + length; }
    std::size_t segment(std::size_t k) const { return std::size_t{begin} + k * period; }
  };
  using Segment = std::pair<std::size_t, std::size_t>;
  std::span<const Run> runs;  // once finished: in order, disjoint

  bool empty() const { return !has_open_; }
  const Segment& back() const { return open_; }
  Segment& back() { return open_; }
  void push_back(Segment s) {
    if (has_open_) close(open_);
    open_ = s;
    has_open_ = true;
  }
  void pop_back() {
    has_open_ = !closed_.empty();
    if (!has_open_) return;
    Run& r = closed_.back();
    const std::size_t b = r.segment(r.count - 1);
    open_ = {b, b + r.length};
    if (--r.count == 0) closed_.pop_back();
  }
  // How many runs finish() gives at most (the open segment may join the last run).
  std::size_t runs_at_most() const { return closed_.size() + (has_open_ ? 1 : 0); }
  // Closes the last segment; `pool` takes the runs (the ranges' runs side by side).
  void finish(std::vector<Run>& pool) {
    if (has_open_) close(open_);
    has_open_ = false;
    pool.insert(pool.end(), closed_.begin(), closed_.end());
    std::vector<Run>().swap(closed_);
  }
  // One stretch of steps, without a hole.
  bool solid() const { return runs.size() == 1 && runs.front().count == 1; }

 private:
  // The segment extends the last run if it is that run's next translate (or its second
  // segment, of the same length), else begins a new run.
  void close(Segment s) {
    const auto [b, e] = s;
    if (e >= UINT32_MAX)
      throw std::length_error("the programs take more than 2^32 - 1 steps on one IPU");
    if (!closed_.empty()) {
      Run& r = closed_.back();
      if (e - b == r.length && (r.count == 1 || b == r.segment(r.count))) {
        if (r.count == 1) r.period = static_cast<std::uint32_t>(b - r.begin);
        ++r.count;
        return;
      }
    }
    closed_.push_back({static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(e - b), 0, 1});
  }
  std::vector<Run> closed_;
  Segment open_;
  bool has_open_ = false;
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
      if (r.empty() || (whole && conditional_ == 0) || killed_[a.var])
        r.push_back({position_, position_});
      else
        r.back().second = position_;
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
    while (!r.empty() && r.back().first >= begin) r.pop_back();
    std::size_t from = begin;
    if (!r.empty()) {
      from = r.back().first;
      r.pop_back();
    }
    r.push_back({from, end});
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
        const ComputeSet& cs = graph_.compute_sets().at(p.compute_set());
        for (const ComputeSet::Access& a : cs.accesses) access(a.var, a.begin, a.end, a.write);
        if (!graph_.keeps_vertex_regions()) break;
        for (const VertexRecord& v : cs.vertices) {
          const Codelet& codelet = registry.at(v.codelet);
          for (std::size_t f = 0; f < v.fields; ++f) {
            const bool output = codelet.is_output(f);
            cs.for_each_region(v, f, [&](const FieldRegion& r) {
              access(r.var, r.offset, r.offset + r.elements, output);
            });
          }
        }
        break;
      }
      case Program::Kind::copy:
        for (const CopyRun& r : p.runs())  // a read is a read, whichever elements
          access(r.src, r.src_offset, r.src_offset + r.elements, false);
        for (const auto& [src, dst] : p.view_pairs())
          for (const auto& r : src.view_regions()) access(r.var, r.begin, r.end, false);
        for (const CopyRun& r : p.runs()) {
          if (r.rows == 1 || r.dst_stride == r.elements) {  // one range of the destination
            access(r.dst, r.dst_offset, r.dst_offset + std::uint64_t{r.rows} * r.elements, true);
            continue;
          }
          for (std::uint64_t row = 0, at = r.dst_offset; row < r.rows; ++row, at += r.dst_stride)
            access(r.dst, at, at + r.elements, true);
        }
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

}  // namespace ipupod::ipu::liveness

// Engine execution: runs the compiled programs in BSP supersteps (compute sets, exchanges, syncs,
// host streams, collectives) on the host threads, counting each step's predicted cycles.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ipu_process/engine.hpp"
#include "ipu_process/engine/engine_internal.hpp"

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

void Engine::account(const char* category, std::uint64_t CycleBreakdown::*field,
                     std::uint64_t cycles, const std::string& name) {
  if (tracing_ && trace_.size() < options_.trace_events)
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
    ex.run_disjoint(ex.transfers[i]);
  for (std::size_t i = cs.tile_begin[tile]; i < cs.tile_begin[tile + 1]; ++i)
    cs.run_vertex(i, options_.float16_stores, run);
}

void Engine::execute_tile_groups(const Node& node) {
  const auto& steps = node.children;
  if (timing_only_) {
    for (const Node& step : steps) account_tile_step(step);
    return;
  }
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

// The predicted costs of a transfer from another IPU, an all-reduce and a host stream: the same
// whether the engine runs the program or only times it.
void Engine::account_transfer(const Node& node) {
  const double seconds = collectives_.predict_transfer_seconds
                             ? collectives_.predict_transfer_seconds(node.peer, node.bytes)
                             : 0.0;
  account("fabric", &CycleBreakdown::fabric,
          static_cast<std::uint64_t>(std::ceil(seconds * graph_.arch().clock_hz)), node.name);
}

void Engine::account_all_reduce(const Node& node) {
  if (!collectives_.predict_seconds)
    throw std::logic_error("all_reduce program run without a fabric binding");
  account("fabric", &CycleBreakdown::fabric,
          static_cast<std::uint64_t>(
              std::ceil(collectives_.predict_seconds(node.bytes) * graph_.arch().clock_hz)),
          node.name);
}

std::uint64_t Engine::external_sync_cycles() const {
  const ArchPreset& arch = graph_.arch();
  const auto topology =
      static_cast<std::uint64_t>(std::ceil(collectives_.external_sync_seconds * arch.clock_hz));
  return std::max(arch.sync_cycles_external, topology);
}

void Engine::account_host_stream(const Node& node) {
  const ArchPreset& arch = graph_.arch();
  account("host", &CycleBreakdown::host,
          static_cast<std::uint64_t>(std::ceil(static_cast<double>(node.bytes) /
                                               arch.host_link_bytes_per_s * arch.clock_hz)),
          node.name);
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
      if (timing_only_) throw std::logic_error("cannot time a loop that tests device data");
      // Each test of the predicate is a sync: every tile must agree on the branch.
      for (;;) {
        execute(node.children[0]);
        account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "predicate");
        if (!predicate(node)) break;
        execute(node.children[1]);
      }
      break;
    case Program::Kind::if_else:
      if (timing_only_) throw std::logic_error("cannot time a branch on device data");
      account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "predicate");
      execute(node.children[predicate(node) ? 0 : 1]);
      break;
    case Program::Kind::execute: {
      const CompiledComputeSet& cs = *compute_sets_[node.index];
      if (timing_only_) {
        if (node.exchange) {
          account_tile_step(node);
        } else {
          account("compute", &CycleBreakdown::compute, cs.cycles, node.name);
          account("sync", &CycleBreakdown::sync, arch.sync_cycles_internal, "sync");
        }
        break;
      }
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
      if (timing_only_) {
      } else if (ex.tile_begin.empty()) {
        for (const auto& tr : ex.transfers) ex.run(tr);
      } else {  // no transfer reads what another writes: the tiles fill at once
        pool_->parallel_for(arch.tiles, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = ex.tile_begin[b]; i < ex.tile_begin[e]; ++i)
            ex.run_disjoint(ex.transfers[i]);
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
        account("sync", &CycleBreakdown::sync, external_sync_cycles(), "external sync");
        if (collectives_.external_sync) {
          const std::uint64_t now = cycles_.total();
          const std::uint64_t latest = collectives_.external_sync(now);
          if (latest > now) account("sync", &CycleBreakdown::sync, latest - now, "wait for peers");
        }
      }
      break;
    case Program::Kind::send:
    case Program::Kind::receive: {
      if (timing_only_) {
        if (node.kind == Program::Kind::receive) account_transfer(node);
        break;
      }
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
        account_transfer(node);
      }
      break;
    }
    case Program::Kind::reduce_scatter:
    case Program::Kind::all_gather: {
      const bool scatter = node.kind == Program::Kind::reduce_scatter;
      if (!timing_only_ && (scatter ? !collectives_.reduce_scatter : !collectives_.all_gather))
        throw std::logic_error(node.name + " program run without a fabric binding");
      account("sync", &CycleBreakdown::sync, external_sync_cycles(), "external sync");
      if (!timing_only_) {
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
      }
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
      if (timing_only_) {
        account("sync", &CycleBreakdown::sync, external_sync_cycles(), "external sync");
        if (node.kind == Program::Kind::all_reduce)
          account_all_reduce(node);
        else
          account_host_stream(node);
        break;
      }
      staging_.resize(node.bytes);
      const std::size_t esize = dtype_size(node.dtype);
      const auto scatter = [&] { scatter_pieces(node.pieces, esize, staging_); };
      const auto gather = [&] { gather_pieces(node.pieces, esize, staging_); };
      // Host and fabric transfers start with a sync across the IPU and its peers.
      account("sync", &CycleBreakdown::sync, external_sync_cycles(), "external sync");
      if (node.kind == Program::Kind::all_reduce) {
        if (!collectives_.all_reduce)
          throw std::logic_error("all_reduce program run without a fabric binding");
        gather();
        collectives_.all_reduce(
            std::span(reinterpret_cast<float*>(staging_.data()), node.bytes / sizeof(float)),
            node.op);
        scatter();
        account_all_reduce(node);
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
      account_host_stream(node);
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
  if (!options_.executable)
    throw std::logic_error("cannot run: the engine was built to plan only (executable = false)");
  if (memory_.tiles_over() > 0)
    throw std::logic_error(
        "cannot run: the graph was compiled with allow-out-of-memory and does "
        "not fit on the IPU (see the memory report)");
  auto it = programs_.find(program);
  if (it == programs_.end()) throw std::invalid_argument("no program named '" + program + "'");
  const auto& timed = options_.timing_only_programs;
  if (std::find(timed.begin(), timed.end(), program) != timed.end())
    throw std::logic_error("cannot run '" + program + "': it was compiled to be timed only");
  execute(*it->second);
}

CycleBreakdown Engine::time(const std::string& program) {
  auto it = programs_.find(program);
  if (it == programs_.end()) throw std::invalid_argument("no program named '" + program + "'");
  const CycleBreakdown before = cycles_;
  timing_only_ = true;
  try {
    execute(*it->second);
  } catch (...) {
    timing_only_ = false;
    throw;
  }
  timing_only_ = false;
  return cycles_ - before;
}

double Engine::seconds(const CycleBreakdown& c) const {
  return static_cast<double>(c.total()) / graph_.arch().clock_hz;
}

}  // namespace ipupod::ipu

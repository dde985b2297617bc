// The engine: compiles a device graph and its programs (tile-locality checks, liveness-aware
// static memory allocation per tile, exchange plans), then runs programs in BSP supersteps
// counting predicted cycles, optionally on several host threads and recording a trace.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"
#include "ipu_process/thread_pool.hpp"

namespace ipupod::ipu {

struct CycleBreakdown {
  std::uint64_t compute = 0, exchange = 0, sync = 0, host = 0, fabric = 0;
  std::uint64_t total() const { return compute + exchange + sync + host + fabric; }
  CycleBreakdown& operator+=(const CycleBreakdown& o);
  CycleBreakdown operator-(const CycleBreakdown& o) const;
};

struct TensorMemory {
  std::string name;
  MemoryCategory category = MemoryCategory::activation;
  std::size_t bytes = 0;
};

struct TileMemory {
  unsigned tile = 0;
  std::size_t always_live = 0;      // weights and optimizer state: live for the whole run
  std::size_t not_always_live = 0;  // bytes the liveness-aware layout needs for everything else
  std::size_t peak_live = 0;        // the most not-always-live bytes live at one time
  std::size_t vertex_state = 0, code = 0;
  std::map<MemoryCategory, std::size_t> by_category;                // bytes before liveness sharing
  std::size_t gaps() const { return not_always_live - peak_live; }  // fragmentation
  std::vector<TensorMemory> largest;  // the biggest tensors on this tile, largest first
  // At the step where the most not-always-live bytes are live: those bytes by category (with
  // the always-live ones), and the biggest tensors live then.
  std::map<MemoryCategory, std::size_t> peak_by_category;
  std::vector<TensorMemory> live_at_peak;
  std::size_t total() const { return always_live + not_always_live + vertex_state + code; }
};

struct MemoryReport {
  std::string arch;
  std::size_t bytes_per_tile = 0;
  std::vector<TileMemory> tiles;
  std::size_t total_bytes() const;
  const TileMemory& busiest() const;
  std::size_t tiles_over() const;
};

class OutOfMemoryError : public std::runtime_error {
 public:
  OutOfMemoryError(const std::string& what, MemoryReport report)
      : std::runtime_error(what), report_(std::move(report)) {}
  const MemoryReport& report() const { return report_; }

 private:
  MemoryReport report_;
};

// How vertices store float32 results into float16 memory (like Poplar's stochastic-rounding
// floating-point behaviour, it applies to the whole device). Stochastic draws are keyed by the
// seed, the compute set's execution count, the vertex, the region and the element.
struct Float16Stores {
  Rounding rounding = Rounding::nearest_even;
  std::uint64_t seed = 0;
};

struct EngineOptions {
  bool allow_out_of_memory = false;  // finish the compile and keep the report instead of failing
  unsigned threads = 1;              // host threads executing vertices and laying out tiles
  std::size_t trace_events = 0;      // record the first N timeline events (0: no trace)
  Float16Stores float16_stores = {};
  // false: plan only, as `ipupod compile` needs: the memory plan and report, the tile checks
  // and every compute set's and exchange's cycles, but no tile memory and no runtime tables
  // (nothing can run, read or write).
  bool executable = true;
  // Programs compiled only to be timed (Engine::time), left out of the memory plan: variants of
  // another program (the same step with other loop counts, say) whose variables the plan of
  // the programs that run already lays out. run() refuses them.
  std::vector<std::string> timing_only_programs = {};
  // Called as the memory plan lays out the tiles (tiles done, rising to tiles in all), on the
  // calling thread, so that a long plan can say where it stands; empty: not called. The plan
  // lays out tiles on `threads` threads (the same layout on any number).
  std::function<void(std::size_t, std::size_t)> memory_plan_progress = {};
};

// One step of the predicted timeline, in cycles since the engine was built.
struct TraceEvent {
  std::string name;
  const char* category;  // compute, exchange, sync, host, fabric
  std::uint64_t start_cycles, cycles;
};

// How the device reaches its peers: the pod binds a fabric all-reduce over the replica group
// and the link model's predicted time for it. The device never sees MPI.
struct CollectiveBinding {
  std::function<void(std::span<float>, CollectiveOp)> all_reduce;
  std::function<double(std::size_t bytes)> predict_seconds;
  // Replicated tensor sharding: this replica's block of the reduction of `input` (the block's
  // size says which elements), and every replica's block gathered into `output`; with the
  // predicted time of each for the whole buffer's bytes.
  std::function<void(std::span<const float> input, std::span<float> block, CollectiveOp)>
      reduce_scatter;
  std::function<void(std::span<const float> block, std::span<float> output)> all_gather;
  std::function<double(std::size_t bytes)> predict_reduce_scatter_seconds,
      predict_all_gather_seconds;
  // Point-to-point transfers to another IPU (pipeline stages). send must not block on the
  // receiver (it copies the bytes and completes later); receive blocks until they arrive.
  std::function<void(unsigned peer, unsigned tag, std::span<const std::byte>)> send;
  std::function<void(unsigned peer, unsigned tag, std::span<std::byte>)> receive;
  std::function<double(unsigned peer, std::size_t bytes)> predict_transfer_seconds;
  // An external sync with the IPUs the device works with: given this device's clock (cycles
  // so far), returns the latest clock among them; the device waits until then, as on
  // hardware where a sync across IPUs releases when the slowest arrives.
  std::function<std::uint64_t(std::uint64_t cycles)> external_sync;
  // The predicted time of one such sync on the topology (its cost for the widest scope the
  // job's IPUs span); the device is charged at least the preset's sync_cycles_external.
  double external_sync_seconds = 0;
};

class Engine {
 public:
  Engine(const Graph& graph, std::map<std::string, Program> programs, EngineOptions options = {});
  // The same, freeing each compute set's vertex tables in the graph once compiled (see
  // Graph::release_vertex_tables), each copy's runs (Program::release_copy_data) and, once
  // built, the tile mappings of the variables the host cannot access (Graph::release_mapping):
  // for an engine that is the graph's only one, given the only copies of the programs.
  struct ReleaseGraphTables {};
  Engine(Graph& graph, std::map<std::string, Program> programs, EngineOptions options,
         ReleaseGraphTables);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const MemoryReport& memory() const { return memory_; }
  void connect_input_stream(const std::string& name,
                            std::function<void(std::span<std::byte>)> fill);
  void connect_output_stream(const std::string& name,
                             std::function<void(std::span<const std::byte>)> consume);
  void bind_collectives(CollectiveBinding binding) { collectives_ = std::move(binding); }

  void run(const std::string& program);
  // Times a program without running it: the same walk and the same cycles as run() (bound
  // collectives are asked only for their predicted times; the external sync is called as in a
  // run), with no codelet, copy or stream. Works on an engine built to plan only and on one
  // that does not fit; a program that branches on device data cannot be timed (logic_error).
  // Returns the program's cycles, which are also added to cycles().
  CycleBreakdown time(const std::string& program);
  const CycleBreakdown& cycles() const { return cycles_; }  // accumulated over every run
  const std::vector<TraceEvent>& trace() const { return trace_; }
  // Whether runs record trace events (on by default; at most EngineOptions::trace_events in
  // all): a caller keeps a window of its run, e.g. from a later step on.
  void set_tracing(bool on) { tracing_ = on; }
  double seconds(const CycleBreakdown& c) const;  // on the preset's clock

  // Host access between runs, to always-live tensors or those given Graph::set_host_access.
  void write(const Tensor& t, std::span<const std::byte> bytes);
  std::vector<std::byte> read(const Tensor& t) const;
  // The same for a float32 or float16 tensor, in float32 values: float16 is rounded to nearest
  // even on the way in and widened exactly on the way out.
  void write_values(const Tensor& t, std::span<const float> values);
  std::vector<float> read_values(const Tensor& t) const;

 private:
  struct Piece {
    unsigned tile;
    std::byte* data;
    std::size_t elements;
  };
  struct Node;
  struct CompiledComputeSet;
  struct CompiledExchange;

  void allocate_memory(const std::map<std::string, Program>& programs);
  void release_mappings();  // of the variables the host cannot access (see ReleaseGraphTables)
  void account(const char* category, std::uint64_t CycleBreakdown::*field, std::uint64_t cycles,
               const std::string& name);
  bool predicate(const Node& node) const;
  void check_host_access(const Tensor& t) const;
  std::vector<Piece> resolve(const Tensor& t) const;
  std::vector<Piece> resolve(const View& v) const;  // its regions' pieces, in element order
  void resolve_into(VariableId var, std::size_t begin, std::size_t end,
                    std::vector<Piece>& out) const;
  // Copy between tile pieces (in element order) and one contiguous host buffer.
  static void gather_pieces(const std::vector<Piece>& pieces, std::size_t element_bytes,
                            std::span<std::byte> out);
  static void scatter_pieces(const std::vector<Piece>& pieces, std::size_t element_bytes,
                             std::span<const std::byte> in);
  Node compile(const Program& p);
  void fuse_exchanges(Node& sequence) const;
  void chain_tile_steps(Node& sequence) const;
  void execute(const Node& node);
  void execute_tile_groups(const Node& node);
  void run_tile(const Node& step, std::size_t tile, std::uint64_t run) const;
  // The cycles of an exchange-and-compute step: sync, exchange, compute, sync.
  void account_tile_step(const Node& step);
  void account_transfer(const Node& node);
  void account_all_reduce(const Node& node);
  void account_host_stream(const Node& node);
  // One sync across IPUs: the topology's cost for the job's IPUs, at least the preset's.
  std::uint64_t external_sync_cycles() const;

  Engine(const Graph& graph, Graph* releasable, std::map<std::string, Program> programs,
         EngineOptions options);

  const Graph& graph_;
  Graph* releasable_ = nullptr;  // the graph whose vertex tables go once compiled
  // Bytes of the graph's tables and programs' copy runs freed since the heap last gave its free
  // pages back (see release_compiled).
  std::size_t freed_since_trim_ = 0;
  // With releasable_: frees what compiling compute set `cs` or copy `p` no longer needs.
  void release_compiled(ComputeSetId cs);
  void release_compiled(const Program& copy);
  void freed(std::size_t bytes);
  EngineOptions options_;
  MemoryReport memory_;
  // The memory of every tile, in one block of host memory (see allocate_memory).
  class TileMemoryBlock {
   public:
    TileMemoryBlock() = default;
    explicit TileMemoryBlock(std::size_t bytes);  // zeroed
    ~TileMemoryBlock();
    TileMemoryBlock(const TileMemoryBlock&) = delete;
    TileMemoryBlock& operator=(TileMemoryBlock&& o) noexcept;
    std::byte* data() const { return data_; }
    std::size_t size() const { return bytes_; }

   private:
    std::byte* data_ = nullptr;
    std::size_t bytes_ = 0;
  };

  TileMemoryBlock tile_memory_;
  std::vector<std::byte*> arenas_;  // each tile's memory in tile_memory_, sized to its use
  // The tile offset of mapping interval k of variable v: interval_offsets_[begin[v] + k].
  std::vector<std::size_t> interval_offset_begin_;
  std::vector<std::uint32_t> interval_offsets_;
  std::vector<std::unique_ptr<CompiledComputeSet>> compute_sets_;
  std::vector<std::unique_ptr<CompiledExchange>> exchanges_;
  // A compute set or a copy program that runs in several places (a micro-batch's passes in
  // every pipeline slot) is compiled once: compute set id or copy node -> its index above.
  std::map<ComputeSetId, std::size_t> compiled_compute_sets_;
  std::map<const void*, std::size_t> compiled_exchanges_;
  std::map<std::string, std::unique_ptr<Node>> programs_;
  std::map<std::string, std::function<void(std::span<std::byte>)>> inputs_;
  std::map<std::string, std::function<void(std::span<const std::byte>)>> outputs_;
  CollectiveBinding collectives_;
  CycleBreakdown cycles_;
  bool timing_only_ = false;            // inside time(): account, move no data
  std::uint64_t compute_set_runs_ = 0;  // executions so far, keys stochastic rounding
  std::vector<TraceEvent> trace_;
  bool tracing_ = true;
  std::vector<std::byte> staging_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace ipupod::ipu

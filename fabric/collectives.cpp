// Collectives written only against the Transport contract, so the same code runs over MPI and
// over the loopback fabric. Each collective makes a plan (stages of rings, one or two lanes),
// predicts its time on the topology, and runs it with the pipelined ring engine.
#include "fabric/collectives.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "fabric/ring_phases.hpp"

namespace ipupod::fabric {
namespace {

using impl::Lane;
using impl::Range;

int wrap(int value, int size) {
  return ((value % size) + size) % size;
}

std::size_t element_bytes(DataType type) {
  return type == DataType::float16 ? 2 : 4;
}

// Tags of the ring phases: one per (stage, phase kind, lane), above the broadcast/barrier ones.
constexpr int kReduceKind = 0;
constexpr int kGatherKind = 1;
int ring_tag(std::size_t stage, int kind, int lane) {
  return collective_tags::first_reserved + 16 + static_cast<int>(stage) * 4 + kind * 2 + lane;
}
constexpr int kScatterTag = collective_tags::first_reserved + 8;

// Without a topology, broadcast uses the tree below this size (log2(n) latencies) and scatter +
// ring all-gather above it (each link carries the message about once); a tuning choice, not
// hardware: the tree's extra copies start to cost more than the ring's extra steps near here.
constexpr std::size_t kRingBroadcastMinBytes = std::size_t{256} << 10;

// --- plans ----------------------------------------------------------------------------------

// A stage partitions the participants into rings (transport ranks in ring order) that run the
// same phase at once; the next stage works on the block the previous one left each rank.
struct Stage {
  std::vector<std::vector<int>> rings;
};

struct Plan {
  Algorithm algorithm = Algorithm::ring;
  std::vector<Stage> stages;
  int lanes = 1;
};

std::vector<int> resolve_ipus(const CollectiveOptions& options, int participants) {
  if (options.topology == nullptr) return {};
  std::vector<int> ipus = options.ipus;
  if (ipus.empty()) {
    for (int r = 0; r < participants; ++r) ipus.push_back(r);
  } else if (static_cast<int>(ipus.size()) != participants) {
    throw FabricError("collective options: " + std::to_string(ipus.size()) + " IPUs listed for " +
                      std::to_string(participants) +
                      " participants; list one IPU per transport rank (or none for 0..n-1)");
  }
  check_ipu_group(*options.topology, ipus, "collective options");
  return ipus;
}

Stage flat_ring(int participants) {
  Stage stage;
  stage.rings.emplace_back();
  for (int r = 0; r < participants; ++r) stage.rings.back().push_back(r);
  return stage;
}

// Groups ranks by key into rings ordered by `order`; empty if the rings differ in size.
template <typename Key, typename Order>
std::vector<std::vector<int>> group_rings(int participants, Key key, Order order, std::string& why,
                                          const char* level) {
  std::map<decltype(key(0)), std::vector<int>> groups;
  for (int r = 0; r < participants; ++r) groups[key(r)].push_back(r);
  std::vector<std::vector<int>> rings;
  for (auto& [k, ranks] : groups) {
    (void)k;
    std::sort(ranks.begin(), ranks.end(), [&](int a, int b) { return order(a) < order(b); });
    if (!rings.empty() && ranks.size() != rings.front().size()) {
      why = std::string("the ") + level + " groups differ in size (" +
            std::to_string(rings.front().size()) + " and " + std::to_string(ranks.size()) +
            " participants)";
      return {};
    }
    rings.push_back(ranks);
  }
  return rings;
}

// Machines, then machines of a pod, then pods; levels where every ring has one member vanish.
std::optional<std::vector<Stage>> hierarchical_stages(const Topology& topo,
                                                      const std::vector<int>& ipus,
                                                      std::string& why) {
  const int n = static_cast<int>(ipus.size());
  const auto ipu = [&](int r) { return ipus[static_cast<std::size_t>(r)]; };
  std::vector<int> position0(ipus.size());
  std::vector<int> position1(ipus.size());
  std::vector<Stage> stages;

  auto machines = group_rings(
      n, [&](int r) { return topo.machine_of(ipu(r)); }, ipu, why, "machine");
  if (machines.empty()) return std::nullopt;
  for (const auto& ring : machines) {
    for (std::size_t p = 0; p < ring.size(); ++p)
      position0[static_cast<std::size_t>(ring[p])] = static_cast<int>(p);
  }
  auto within_pods = group_rings(
      n,
      [&](int r) {
        return std::pair(topo.location(ipu(r)).pod, position0[static_cast<std::size_t>(r)]);
      },
      [&](int r) { return topo.machine_of(ipu(r)); }, why, "pod");
  if (within_pods.empty()) return std::nullopt;
  for (const auto& ring : within_pods) {
    for (std::size_t p = 0; p < ring.size(); ++p)
      position1[static_cast<std::size_t>(ring[p])] = static_cast<int>(p);
  }
  auto across_pods = group_rings(
      n,
      [&](int r) {
        return std::pair(position0[static_cast<std::size_t>(r)],
                         position1[static_cast<std::size_t>(r)]);
      },
      [&](int r) { return topo.location(ipu(r)).pod; }, why, "pod-to-pod");
  if (across_pods.empty()) return std::nullopt;
  for (auto* rings : {&machines, &within_pods, &across_pods}) {
    if (rings->front().size() > 1) stages.push_back(Stage{std::move(*rings)});
  }
  if (stages.empty()) stages.push_back(flat_ring(n));
  return stages;
}

bool allowed(Collective collective, Algorithm algorithm) {
  switch (collective) {
    case Collective::all_reduce:
      return algorithm == Algorithm::ring || algorithm == Algorithm::bidirectional_ring ||
             algorithm == Algorithm::hierarchical;
    case Collective::reduce_scatter:
    case Collective::all_gather:
      return algorithm == Algorithm::ring || algorithm == Algorithm::bidirectional_ring;
    case Collective::broadcast:
      return algorithm == Algorithm::tree || algorithm == Algorithm::ring;
    case Collective::barrier:
      return algorithm == Algorithm::dissemination;
  }
  return false;
}

std::vector<Algorithm> candidates(Collective collective) {
  switch (collective) {
    case Collective::all_reduce:
      return {Algorithm::ring, Algorithm::bidirectional_ring, Algorithm::hierarchical};
    case Collective::reduce_scatter:
    case Collective::all_gather:
      return {Algorithm::ring, Algorithm::bidirectional_ring};
    case Collective::broadcast:
      return {Algorithm::tree, Algorithm::ring};
    case Collective::barrier:
      return {Algorithm::dissemination};
  }
  return {};
}

// The plan of a (collective, algorithm) pair; nullopt (with why) if it cannot run here.
std::optional<Plan> make_plan(Algorithm algorithm, int participants,
                              const CollectiveOptions& options, const std::vector<int>& ipus,
                              std::string& why) {
  Plan plan;
  plan.algorithm = algorithm;
  if (algorithm == Algorithm::hierarchical) {
    if (options.topology == nullptr) {
      why = "it needs a topology in the collective options (where each rank's IPU sits)";
      return std::nullopt;
    }
    auto stages = hierarchical_stages(*options.topology, ipus, why);
    if (!stages) return std::nullopt;
    plan.stages = std::move(*stages);
  } else {
    plan.stages.push_back(flat_ring(participants));
    if (algorithm == Algorithm::bidirectional_ring) plan.lanes = 2;
  }
  return plan;
}

// --- cost model -----------------------------------------------------------------------------

// Slowest edge of any ring of the stage for a message of `bytes` (both directions when two
// lanes run: the link class is the same either way).
double slowest_edge_seconds(const Topology& topo, const std::vector<int>& ipus, const Stage& stage,
                            double bytes) {
  double slowest = 0.0;
  for (const auto& ring : stage.rings) {
    for (std::size_t p = 0; p < ring.size(); ++p) {
      const int a = ipus[static_cast<std::size_t>(ring[p])];
      const int b = ipus[static_cast<std::size_t>(ring[(p + 1) % ring.size()])];
      const LinkClass& link = topo.link(a, b);
      slowest = std::max(slowest, link.latency_s + bytes / link.bandwidth_bytes_per_s);
    }
  }
  return slowest;
}

// Each ring phase of a stage is (m-1) steps; in each step every ring edge carries one block
// (of the range the stage works on) per lane, all edges at once.
double predict_plan(const Plan& plan, Collective collective, DataType type, std::size_t elements,
                    const Topology& topo, const std::vector<int>& ipus) {
  double total = 0.0;
  double range_elements = static_cast<double>(elements);
  for (const Stage& stage : plan.stages) {
    const double m = static_cast<double>(stage.rings.front().size());
    if (m < 2) continue;
    const double block_elements = range_elements / m / static_cast<double>(plan.lanes);
    const double reduce_step = slowest_edge_seconds(topo, ipus, stage, block_elements * 4.0);
    const double gather_step = slowest_edge_seconds(
        topo, ipus, stage, block_elements * static_cast<double>(element_bytes(type)));
    if (collective != Collective::all_gather) total += (m - 1) * reduce_step;
    if (collective != Collective::reduce_scatter) total += (m - 1) * gather_step;
    range_elements /= m;
    if (collective != Collective::all_reduce) break;  // single-stage collectives
  }
  return total;
}

double predict_broadcast(Algorithm algorithm, std::size_t bytes, const Topology& topo,
                         const std::vector<int>& ipus) {
  const int n = static_cast<int>(ipus.size());
  if (n < 2 || bytes == 0) return 0.0;
  if (algorithm == Algorithm::ring) {
    // Scatter from the root (its sends share its links: n-1 blocks one after another), then a
    // ring all-gather of the blocks: 2(n-1) block steps, priced on the ring's slowest edge.
    const double block = static_cast<double>(bytes) / n;
    return 2.0 * (n - 1) * slowest_edge_seconds(topo, ipus, flat_ring(n), block);
  }
  // Binomial tree: ceil(log2 n) rounds, each the whole message over the slowest link in use.
  int rounds = 0;
  double slowest = 0.0;
  for (int mask = 1; mask < n; mask <<= 1, ++rounds) {
    for (int r = 0; r + mask < n; ++r) {
      const LinkClass& link =
          topo.link(ipus[static_cast<std::size_t>(r)], ipus[static_cast<std::size_t>(r + mask)]);
      slowest = std::max(slowest,
                         link.latency_s + static_cast<double>(bytes) / link.bandwidth_bytes_per_s);
    }
  }
  return rounds * slowest;
}

// What a collective will run: the plan, and the report it returns.
struct Prepared {
  Plan plan;
  CollectiveReport report;
};

Prepared prepare(Collective collective, DataType type, std::size_t elements, int participants,
                 const CollectiveOptions& options) {
  if (options.segment_bytes == 0) {
    throw FabricError(std::string(to_string(collective)) +
                      ": segment_bytes is 0; give the largest message size in bytes (> 0)");
  }
  if (options.algorithm != Algorithm::automatic && !allowed(collective, options.algorithm)) {
    std::string names;
    for (Algorithm a : candidates(collective))
      names += (names.empty() ? "" : ", ") + std::string(to_string(a));
    throw FabricError(std::string(to_string(collective)) + " has no '" +
                      to_string(options.algorithm) + "' algorithm; use one of: automatic, " +
                      names);
  }
  const std::vector<int> ipus = resolve_ipus(options, participants);
  const std::size_t bytes =
      collective == Collective::broadcast ? elements : elements * element_bytes(type);

  const auto predicted = [&](const Plan& plan) {
    if (options.topology == nullptr || participants < 2) return 0.0;
    if (collective == Collective::broadcast) {
      return predict_broadcast(plan.algorithm, bytes, *options.topology, ipus);
    }
    if (collective == Collective::barrier) return predict_barrier_seconds(*options.topology, ipus);
    return predict_plan(plan, collective, type, elements, *options.topology, ipus);
  };

  Prepared best;
  best.report.collective = collective;
  best.report.participants = participants;
  best.report.bytes = bytes;
  if (options.algorithm != Algorithm::automatic) {
    std::string why;
    auto plan = make_plan(options.algorithm, participants, options, ipus, why);
    if (!plan) {
      throw FabricError(std::string(to_string(collective)) + " cannot run the '" +
                        to_string(options.algorithm) + "' algorithm on " +
                        std::to_string(participants) + " participants: " + why +
                        "; use ring or bidirectional_ring");
    }
    best.plan = std::move(*plan);
    best.report.predicted_seconds = predicted(best.plan);
  } else if (options.topology != nullptr) {
    bool found = false;
    for (Algorithm algorithm : candidates(collective)) {
      std::string why;
      auto plan = make_plan(algorithm, participants, options, ipus, why);
      if (!plan) continue;
      const double seconds = predicted(*plan);
      if (!found || seconds < best.report.predicted_seconds) {
        best.plan = std::move(*plan);
        best.report.predicted_seconds = seconds;
        found = true;
      }
    }
  } else {
    // No topology: the choice this machine's measurements favour (see bench allreduce).
    Algorithm algorithm = Algorithm::ring;
    if (collective == Collective::broadcast) {
      algorithm =
          (bytes >= kRingBroadcastMinBytes && participants > 2) ? Algorithm::ring : Algorithm::tree;
    }
    if (collective == Collective::barrier) algorithm = Algorithm::dissemination;
    std::string why;
    best.plan = *make_plan(algorithm, participants, options, ipus, why);
  }
  best.report.algorithm = best.plan.algorithm;
  return best;
}

// --- execution ------------------------------------------------------------------------------

// This rank's lanes of one stage over `range`, and the block of the range it ends up owning.
std::vector<Lane> lanes_for(const Plan& plan, std::size_t stage_index, int rank, Range range,
                            int kind, Range& owned) {
  const Stage& stage = plan.stages[stage_index];
  const std::vector<int>* ring = nullptr;
  int position = 0;
  for (const auto& candidate : stage.rings) {
    auto it = std::find(candidate.begin(), candidate.end(), rank);
    if (it != candidate.end()) {
      ring = &candidate;
      position = static_cast<int>(it - candidate.begin());
    }
  }
  const int m = static_cast<int>(ring->size());
  std::vector<Range> blocks;
  for (int p = 0; p < m; ++p) {
    const RingChunk chunk = ring_chunk(range.size(), m, p);
    blocks.push_back({range.begin + chunk.begin, range.begin + chunk.end});
  }
  owned = blocks[static_cast<std::size_t>(position)];
  std::vector<Lane> lanes;
  if (plan.lanes == 1) {
    lanes.push_back({*ring, blocks, position, ring_tag(stage_index, kind, 0)});
    return lanes;
  }
  // Two lanes: first halves clockwise, second halves anticlockwise (the reversed ring).
  Lane clockwise{*ring, {}, position, ring_tag(stage_index, kind, 0)};
  Lane anticlockwise{
      {}, std::vector<Range>(blocks.size()), wrap(m - position, m), ring_tag(stage_index, kind, 1)};
  for (int p = 0; p < m; ++p) {
    const Range block = blocks[static_cast<std::size_t>(p)];
    const std::size_t middle = block.begin + block.size() / 2;
    clockwise.blocks.push_back({block.begin, middle});
    anticlockwise.members.push_back((*ring)[static_cast<std::size_t>(wrap(m - p, m))]);
    anticlockwise.blocks[static_cast<std::size_t>(wrap(m - p, m))] = {middle, block.end};
  }
  lanes.push_back(std::move(clockwise));
  lanes.push_back(std::move(anticlockwise));
  return lanes;
}

std::size_t segment_elements(const CollectiveOptions& options, std::size_t wire_bytes) {
  return std::max<std::size_t>(1, options.segment_bytes / wire_bytes);
}

void divide(std::span<float> values, int participants) {
  const auto divisor = static_cast<float>(participants);
  for (float& value : values) value = value / divisor;
}

template <typename T>
constexpr DataType data_type_of() {
  return std::is_same_v<T, float16::Half> ? DataType::float16 : DataType::float32;
}

// Stores the float32 results of `range` into the caller's buffer (rounding float16 once).
template <typename T>
void store(std::span<const float> from, std::span<T> to) {
  if constexpr (std::is_same_v<T, float16::Half>) {
    float16::narrow(from, to);
  } else if (from.data() != to.data() && !from.empty()) {
    std::memcpy(to.data(), from.data(), from.size_bytes());
  }
}

template <typename T>
CollectiveReport all_reduce_typed(Transport& t, std::span<T> data, ReduceOp op,
                                  const CollectiveOptions& options) {
  const int n = t.size();
  const Prepared prepared =
      prepare(Collective::all_reduce, data_type_of<T>(), data.size(), n, options);
  if (n > 1 && !data.empty()) {
    std::span<float> acc;
    if constexpr (std::is_same_v<T, float16::Half>) {
      acc = impl::scratch(impl::kWorkingCopySlot, data.size());
      float16::widen(data, acc);
    } else {
      acc = data;
    }
    const Plan& plan = prepared.plan;
    std::vector<std::vector<Lane>> stage_lanes;
    Range range{0, data.size()};
    for (std::size_t s = 0; s < plan.stages.size(); ++s) {
      Range owned;
      stage_lanes.push_back(lanes_for(plan, s, t.rank(), range, kReduceKind, owned));
      impl::reduce_phase(t, stage_lanes.back(), acc, op, segment_elements(options, sizeof(float)));
      range = owned;
    }
    auto mine = acc.subspan(range.begin, range.size());
    if (op == ReduceOp::mean) divide(mine, n);
    store<T>(mine, data.subspan(range.begin, range.size()));
    for (std::size_t s = plan.stages.size(); s-- > 0;) {
      for (Lane& lane : stage_lanes[s]) lane.tag += kGatherKind * 2;
      impl::gather_phase(t, stage_lanes[s], std::as_writable_bytes(data), sizeof(T),
                         segment_elements(options, sizeof(T)));
    }
  }
  t.advance_model_clock(prepared.report.predicted_seconds);
  return prepared.report;
}

template <typename T>
CollectiveReport reduce_scatter_typed(Transport& t, std::span<const T> input, std::span<T> block,
                                      ReduceOp op, const CollectiveOptions& options) {
  const int n = t.size();
  const RingChunk mine = ring_chunk(input.size(), n, t.rank());
  if (block.size() != mine.size()) {
    throw FabricError("reduce_scatter on " + std::to_string(t.rank()) + " of " + std::to_string(n) +
                      ": the output block has " + std::to_string(block.size()) +
                      " elements, expected " + std::to_string(mine.size()) +
                      " (ring_chunk of the input for this rank)");
  }
  const Prepared prepared =
      prepare(Collective::reduce_scatter, data_type_of<T>(), input.size(), n, options);
  const std::span<float> acc = impl::scratch(impl::kWorkingCopySlot, input.size());
  if constexpr (std::is_same_v<T, float16::Half>) {
    float16::widen(input, acc);
  } else if (!input.empty()) {
    std::memcpy(acc.data(), input.data(), input.size_bytes());
  }
  if (n > 1 && !input.empty()) {
    Range owned;
    const auto lanes = lanes_for(prepared.plan, 0, t.rank(), {0, input.size()}, kReduceKind, owned);
    impl::reduce_phase(t, lanes, acc, op, segment_elements(options, sizeof(float)));
  }
  auto result = acc.subspan(mine.begin, mine.size());
  if (op == ReduceOp::mean) divide(result, n);
  store<T>(result, block);
  t.advance_model_clock(prepared.report.predicted_seconds);
  return prepared.report;
}

template <typename T>
CollectiveReport all_gather_typed(Transport& t, std::span<const T> block, std::span<T> output,
                                  const CollectiveOptions& options) {
  const int n = t.size();
  const RingChunk mine = ring_chunk(output.size(), n, t.rank());
  if (block.size() != mine.size()) {
    throw FabricError("all_gather on " + std::to_string(t.rank()) + " of " + std::to_string(n) +
                      ": the input block has " + std::to_string(block.size()) +
                      " elements, expected " + std::to_string(mine.size()) +
                      " (ring_chunk of the output for this rank)");
  }
  const Prepared prepared =
      prepare(Collective::all_gather, data_type_of<T>(), output.size(), n, options);
  if (!block.empty()) std::memcpy(output.data() + mine.begin, block.data(), block.size_bytes());
  if (n > 1 && !output.empty()) {
    Range owned;
    const auto lanes =
        lanes_for(prepared.plan, 0, t.rank(), {0, output.size()}, kGatherKind, owned);
    impl::gather_phase(t, lanes, std::as_writable_bytes(output), sizeof(T),
                       segment_elements(options, sizeof(T)));
  }
  t.advance_model_clock(prepared.report.predicted_seconds);
  return prepared.report;
}

void broadcast_tree(Transport& t, std::span<std::byte> data, int root) {
  const int n = t.size();
  // Binomial tree over ranks renumbered so the root is 0: a rank receives from the rank that
  // differs in its lowest set bit, then sends to the ranks below that bit.
  const int relative = wrap(t.rank() - root, n);
  int mask = 1;
  while (mask < n) {
    if ((relative & mask) != 0) {
      Request request = t.irecv(wrap(relative - mask + root, n), data, collective_tags::broadcast);
      t.wait(request);
      break;
    }
    mask <<= 1;
  }
  std::vector<Request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask < n) {
      sends.push_back(t.isend(wrap(relative + mask + root, n), data, collective_tags::broadcast));
    }
  }
  t.wait_all(sends);
}

// Scatter of one block per rank from the root, then a ring all-gather: each link carries the
// message about once instead of log2(n) times.
void broadcast_ring(Transport& t, std::span<std::byte> data, int root,
                    const CollectiveOptions& options, const Plan& plan) {
  const int n = t.size();
  const std::size_t segment = options.segment_bytes;
  std::vector<Request> requests;
  for (int r = 0; r < n; ++r) {
    if (r == root || (t.rank() != root && t.rank() != r)) continue;
    const RingChunk block = ring_chunk(data.size(), n, r);
    for (std::size_t begin = block.begin; begin < block.end; begin += segment) {
      auto piece = data.subspan(begin, std::min(segment, block.end - begin));
      requests.push_back(t.rank() == root ? t.isend(r, piece, kScatterTag)
                                          : t.irecv(root, piece, kScatterTag));
    }
  }
  t.wait_all(requests);
  Range owned;
  const auto lanes = lanes_for(plan, 0, t.rank(), {0, data.size()}, kGatherKind, owned);
  impl::gather_phase(t, lanes, data, 1, segment);
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::mean:
      return "mean";
    case ReduceOp::max:
      return "max";
  }
  return "unknown";
}

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::automatic:
      return "automatic";
    case Algorithm::ring:
      return "ring";
    case Algorithm::bidirectional_ring:
      return "bidirectional_ring";
    case Algorithm::hierarchical:
      return "hierarchical";
    case Algorithm::tree:
      return "tree";
    case Algorithm::dissemination:
      return "dissemination";
  }
  return "unknown";
}

const char* to_string(Collective collective) {
  switch (collective) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_gather:
      return "all_gather";
    case Collective::broadcast:
      return "broadcast";
    case Collective::barrier:
      return "barrier";
  }
  return "unknown";
}

const char* to_string(DataType type) {
  return type == DataType::float16 ? "float16" : "float32";
}

Algorithm algorithm_from_string(std::string_view name) {
  constexpr std::array kAll{Algorithm::automatic,    Algorithm::ring, Algorithm::bidirectional_ring,
                            Algorithm::hierarchical, Algorithm::tree, Algorithm::dissemination};
  std::string names;
  for (Algorithm algorithm : kAll) {
    if (name == to_string(algorithm)) return algorithm;
    names += (names.empty() ? "" : ", ") + std::string(to_string(algorithm));
  }
  throw FabricError("unknown collective algorithm '" + std::string(name) + "'; known: " + names);
}

RingChunk ring_chunk(std::size_t length, int participants, int chunk) {
  if (participants < 1 || chunk < 0 || chunk >= participants) {
    throw FabricError("ring_chunk: chunk " + std::to_string(chunk) + " of " +
                      std::to_string(participants) + " participants is out of range");
  }
  const auto n = static_cast<std::size_t>(participants);
  const auto c = static_cast<std::size_t>(chunk);
  const std::size_t base = length / n;
  const std::size_t remainder = length % n;
  RingChunk result;
  result.begin = c * base + std::min(c, remainder);
  result.end = result.begin + base + (c < remainder ? 1 : 0);
  return result;
}

void release_collective_buffers() {
  impl::release_scratch();
}

CollectiveReport predict(Collective collective, DataType type, std::size_t elements,
                         int participants, const CollectiveOptions& options) {
  if (participants < 1) {
    throw FabricError("predict: " + std::to_string(participants) +
                      " participants, expected at least 1");
  }
  return prepare(collective, type, elements, participants, options).report;
}

CollectiveReport all_reduce(Transport& t, std::span<float> data, ReduceOp op,
                            const CollectiveOptions& options) {
  return all_reduce_typed(t, data, op, options);
}
CollectiveReport all_reduce(Transport& t, std::span<float16::Half> data, ReduceOp op,
                            const CollectiveOptions& options) {
  return all_reduce_typed(t, data, op, options);
}

CollectiveReport reduce_scatter(Transport& t, std::span<const float> input, std::span<float> block,
                                ReduceOp op, const CollectiveOptions& options) {
  return reduce_scatter_typed(t, input, block, op, options);
}
CollectiveReport reduce_scatter(Transport& t, std::span<const float16::Half> input,
                                std::span<float16::Half> block, ReduceOp op,
                                const CollectiveOptions& options) {
  return reduce_scatter_typed(t, input, block, op, options);
}

CollectiveReport all_gather(Transport& t, std::span<const float> block, std::span<float> output,
                            const CollectiveOptions& options) {
  return all_gather_typed(t, block, output, options);
}
CollectiveReport all_gather(Transport& t, std::span<const float16::Half> block,
                            std::span<float16::Half> output, const CollectiveOptions& options) {
  return all_gather_typed(t, block, output, options);
}

CollectiveReport broadcast(Transport& t, std::span<std::byte> data, int root,
                           const CollectiveOptions& options) {
  const int n = t.size();
  if (root < 0 || root >= n) {
    throw FabricError("broadcast on rank " + std::to_string(t.rank()) + ": root " +
                      std::to_string(root) + " is out of range, expected 0.." +
                      std::to_string(n - 1));
  }
  const Prepared prepared =
      prepare(Collective::broadcast, DataType::float32, data.size(), n, options);
  if (n > 1 && !data.empty()) {
    if (prepared.plan.algorithm == Algorithm::ring) {
      broadcast_ring(t, data, root, options, prepared.plan);
    } else {
      broadcast_tree(t, data, root);
    }
  }
  t.advance_model_clock(prepared.report.predicted_seconds);
  return prepared.report;
}

CollectiveReport barrier(Transport& t, const CollectiveOptions& options) {
  const int n = t.size();
  const int rank = t.rank();
  const Prepared prepared = prepare(Collective::barrier, DataType::float32, 0, n, options);
  // Dissemination: in round k every rank signals rank+2^k and hears from rank-2^k; after
  // ceil(log2 n) rounds every rank has (transitively) heard from every other.
  for (int distance = 1; distance < n; distance <<= 1) {
    const std::byte token_out{1};
    std::byte token_in{0};
    std::array<Request, 2> requests{
        t.isend(wrap(rank + distance, n), std::span(&token_out, 1), collective_tags::barrier),
        t.irecv(wrap(rank - distance, n), std::span(&token_in, 1), collective_tags::barrier)};
    t.wait_all(requests);
  }
  t.advance_model_clock(prepared.report.predicted_seconds);
  return prepared.report;
}

}  // namespace ipupod::fabric

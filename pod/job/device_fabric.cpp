// The device's collectives, pipeline transfers and cross-IPU syncs over fabric transports.
#include "pod/job/device_fabric.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

namespace ipupod::pod {
namespace {

fabric::ReduceOp reduce_op(ipu::CollectiveOp op) {
  return op == ipu::CollectiveOp::mean ? fabric::ReduceOp::mean : fabric::ReduceOp::sum;
}

// World ranks of this replica's stages, in stage order.
std::vector<int> pipeline_ranks(const TrainConfig& config, const IpuPlace& place) {
  std::vector<int> ranks;
  for (std::size_t s = 0; s < config.stages; ++s)
    ranks.push_back(ipu_rank(config, static_cast<std::size_t>(place.replica), s));
  return ranks;
}

}  // namespace

DeviceFabric::DeviceFabric(const TrainConfig& config, const IpuPlace& place, MPI_Comm world,
                           MPI_Comm replicas)
    : config_(config),
      costs_(config, place),
      replica_group_(replicas),
      world_(world),
      pipeline_(world_, pipeline_ranks(config, place)) {}

ipu::CollectiveBinding DeviceFabric::binding() {
  ipu::CollectiveBinding b;
  costs_.bind_predictions(b);
  b.all_reduce = [this](std::span<float> data, ipu::CollectiveOp op) { all_reduce(data, op); };
  // Replicated tensor sharding: block r of the buffer is replica r's (transport rank r).
  b.reduce_scatter = [this](std::span<const float> input, std::span<float> block,
                            ipu::CollectiveOp op) {
    fabric::reduce_scatter(replica_group_, input, block, reduce_op(op),
                           costs_.collective_options());
  };
  b.all_gather = [this](std::span<const float> block, std::span<float> output) {
    fabric::all_gather(replica_group_, block, output, costs_.collective_options());
  };
  b.send = [this](unsigned peer, unsigned tag, std::span<const std::byte> bytes) {
    send(peer, tag, bytes);
  };
  b.receive = [this](unsigned peer, unsigned tag, std::span<std::byte> bytes) {
    receive(peer, tag, bytes);
  };
  b.external_sync = [this](std::uint64_t cycles) { return external_sync(cycles); };
  return b;
}

void DeviceFabric::all_reduce(std::span<float> data, ipu::CollectiveOp op) {
  fabric::all_reduce(replica_group_, data, reduce_op(op), costs_.collective_options());
}

void DeviceFabric::complete_sends(bool all) {
  while (!pending_.empty()) {
    if (all)
      pipeline_.wait(pending_.front().request);
    else if (!pipeline_.test(pending_.front().request))
      break;
    pending_.pop_front();
  }
}

void DeviceFabric::send(unsigned peer, unsigned tag, std::span<const std::byte> bytes) {
  if (tag >= static_cast<unsigned>(kPipelineTagLimit))
    throw std::logic_error("pipeline transfer tag " + std::to_string(tag) + " is not below " +
                           std::to_string(kPipelineTagLimit));
  complete_sends(false);
  pending_.push_back({std::vector<std::byte>(bytes.begin(), bytes.end()), {}});
  pending_.back().request =
      pipeline_.isend(static_cast<int>(peer), pending_.back().bytes, static_cast<int>(tag));
}

void DeviceFabric::receive(unsigned peer, unsigned tag, std::span<std::byte> bytes) {
  fabric::Request request = pipeline_.irecv(static_cast<int>(peer), bytes, static_cast<int>(tag));
  try {
    pipeline_.wait(request);
  } catch (const fabric::FabricError& e) {
    throw std::runtime_error("pipeline transfer " + std::to_string(tag) + " from stage " +
                             std::to_string(peer) + ": " + e.what());
  }
}

// Each stage sends its clock to every other stage of the replica and takes the latest: the
// sync releases when the slowest arrives.
std::uint64_t DeviceFabric::external_sync(std::uint64_t cycles) {
  if (config_.stages < 2) return cycles;
  const int stages = pipeline_.size(), me = pipeline_.rank();
  std::vector<std::uint64_t> theirs(static_cast<std::size_t>(stages), cycles);
  std::vector<fabric::Request> requests;
  for (int s = 0; s < stages; ++s)
    if (s != me) {
      requests.push_back(pipeline_.irecv(
          s, std::as_writable_bytes(std::span(&theirs[static_cast<std::size_t>(s)], 1)),
          kExternalSyncTag));
      requests.push_back(
          pipeline_.isend(s, std::as_bytes(std::span(&cycles, 1)), kExternalSyncTag));
    }
  pipeline_.wait_all(requests);
  return *std::max_element(theirs.begin(), theirs.end());
}

}  // namespace ipupod::pod

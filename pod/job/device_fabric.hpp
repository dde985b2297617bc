// The device's links to other IPUs, bound to fabric transports: the gradient collectives over
// the MPI transport of this stage's replica group, and the pipeline's transfers and syncs over
// the subset of the world transport that holds this replica's stages.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/mpi_transport.hpp"
#include "fabric/subset_transport.hpp"
#include "fabric/topology.hpp"
#include "ipu_process/engine.hpp"
#include "pod/config.hpp"
#include "pod/job/fabric_costs.hpp"
#include "pod/job/protocol.hpp"

namespace ipupod::pod {

// Tags of a replica's pipeline traffic: the compiler numbers transfers from 0 and stays below
// kPipelineTagLimit; the stage relay (stage_relay.hpp) and the cross-IPU sync use the tags
// above it, below the tags the fabric's collectives reserve.
inline constexpr int kPipelineTagLimit = 31000;
inline constexpr int kExternalSyncTag = 31010;

class DeviceFabric {
 public:
  // `world` holds the host at rank 0 and IPU i at rank 1 + i; `replicas` is this stage's
  // replica group (IpuGroups). Both must outlive the object.
  DeviceFabric(const TrainConfig& config, const IpuPlace& place, MPI_Comm world, MPI_Comm replicas);
  DeviceFabric(const DeviceFabric&) = delete;
  DeviceFabric& operator=(const DeviceFabric&) = delete;
  ~DeviceFabric() = default;  // never waits: a job that fails ends through MPI_Abort

  // This replica's stages, ranked by stage (the stage relay uses it too).
  fabric::Transport& pipeline() { return pipeline_; }
  // What the engine calls for its collectives, transfers and external syncs.
  ipu::CollectiveBinding binding();
  // Waits until every pipeline send has left (before reports or the end of the job).
  void finish_sends() { complete_sends(true); }

 private:
  void all_reduce(std::span<float> data, ipu::CollectiveOp op);
  void send(unsigned peer, unsigned tag, std::span<const std::byte> bytes);
  void receive(unsigned peer, unsigned tag, std::span<std::byte> bytes);
  std::uint64_t external_sync(std::uint64_t cycles);
  // Forgets the sends that have left; all: waits for every one.
  void complete_sends(bool all);

  const TrainConfig& config_;
  FabricCosts costs_;
  fabric::MpiTransport replica_group_;
  fabric::MpiTransport world_;
  fabric::SubsetTransport pipeline_;
  // Pipeline sends copy their bytes and complete in the background: a stage never waits on its
  // successor to post a receive.
  struct PendingSend {
    std::vector<std::byte> bytes;
    fabric::Request request;
  };
  std::deque<PendingSend> pending_;
};

}  // namespace ipupod::pod

// The predicted costs of an IPU's traffic with other IPUs on a topology: the replica group's
// collectives, the pipeline's transfers between a replica's stages and the syncs across IPUs.
// Training charges them as the device runs (DeviceFabric) and `ipupod estimate` as it times a
// compiled stage: one cost model for both.
#pragma once

#include <cstddef>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/topology.hpp"
#include "ipu_process/engine.hpp"
#include "pod/config.hpp"
#include "pod/job/protocol.hpp"

namespace ipupod::pod {

class FabricCosts {
 public:
  // The IPU at `place` of a job of config.replicas x config.stages IPUs on config.topology.
  FabricCosts(const TrainConfig& config, const IpuPlace& place);
  FabricCosts(const FabricCosts&) = delete;  // collective_options_ points into topology_
  FabricCosts& operator=(const FabricCosts&) = delete;

  // A collective over this stage's replicas, of `bytes` of float32 on each.
  double collective_seconds(fabric::Collective collective, std::size_t bytes) const;
  // `bytes` from this replica's stage `peer` (0 from the IPU itself).
  double transfer_seconds(unsigned peer, std::size_t bytes) const;
  // One sync across all the job's IPUs: the topology's cost for the widest scope they span.
  double external_sync_seconds() const;
  // The predicted-time members of the engine's binding (predict_seconds, ..._reduce_scatter_,
  // ..._all_gather_, predict_transfer_seconds); the object must outlive the binding.
  void bind_predictions(ipu::CollectiveBinding& binding) const;

  const fabric::Topology& topology() const { return topology_; }
  // The options the replica group's collectives run with (the topology and their IPUs).
  const fabric::CollectiveOptions& collective_options() const { return collective_options_; }

 private:
  int replicas_, stages_;
  IpuPlace place_;
  fabric::Topology topology_;
  fabric::CollectiveOptions collective_options_;
};

}  // namespace ipupod::pod

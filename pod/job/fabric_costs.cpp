// The predicted costs of collectives and pipeline transfers on a topology's links.
#include "pod/job/fabric_costs.hpp"

namespace ipupod::pod {

FabricCosts::FabricCosts(const TrainConfig& config, const IpuPlace& place)
    : replicas_(static_cast<int>(config.replicas)),
      stages_(static_cast<int>(config.stages)),
      place_(place),
      topology_(fabric::Topology::preset(config.topology)) {
  // The fabric picks the algorithm for the topology (ring, bidirectional ring, hierarchical)
  // and the device is charged that algorithm's predicted time on the real links.
  collective_options_.topology = &topology_;
  for (int r = 0; r < replicas_; ++r)  // IPUs of this stage's replicas
    collective_options_.ipus.push_back(r * stages_ + place.stage);
}

double FabricCosts::collective_seconds(fabric::Collective collective, std::size_t bytes) const {
  return fabric::predict(collective, fabric::DataType::float32, bytes / sizeof(float), replicas_,
                         collective_options_)
      .predicted_seconds;
}

double FabricCosts::external_sync_seconds() const {
  // Poplar syncs every IPU of the job's device: all replicas' stages.
  std::vector<int> ipus(static_cast<std::size_t>(replicas_ * stages_));
  for (std::size_t i = 0; i < ipus.size(); ++i) ipus[i] = static_cast<int>(i);
  return fabric::predict_barrier_seconds(topology_, ipus);
}

double FabricCosts::transfer_seconds(unsigned peer, std::size_t bytes) const {
  const int peer_ipu = place_.replica * stages_ + static_cast<int>(peer);
  if (peer_ipu == place_.ipu) return 0.0;
  const fabric::LinkClass& link = topology_.link(place_.ipu, peer_ipu);
  return link.latency_s + static_cast<double>(bytes) / link.bandwidth_bytes_per_s;
}

void FabricCosts::bind_predictions(ipu::CollectiveBinding& b) const {
  b.predict_seconds = [this](std::size_t bytes) {
    return collective_seconds(fabric::Collective::all_reduce, bytes);
  };
  b.predict_reduce_scatter_seconds = [this](std::size_t bytes) {
    return collective_seconds(fabric::Collective::reduce_scatter, bytes);
  };
  b.predict_all_gather_seconds = [this](std::size_t bytes) {
    return collective_seconds(fabric::Collective::all_gather, bytes);
  };
  b.predict_transfer_seconds = [this](unsigned peer, std::size_t bytes) {
    return transfer_seconds(peer, bytes);
  };
  b.external_sync_seconds = external_sync_seconds();
}

}  // namespace ipupod::pod

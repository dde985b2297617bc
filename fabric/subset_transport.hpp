// A Transport over a subset of another transport's ranks (a replica group, a pipeline), so
// collectives can run over any group of IPUs on either the MPI or the loopback transport.
#pragma once

#include <vector>

#include "fabric/transport.hpp"

namespace ipupod::fabric {

// Rank i of the subset is rank members[i] of the parent. Groups that share a parent may run
// collectives at the same time only if they are disjoint (messages are matched by the
// parent's ranks and tags). Keeps a reference to the parent, which must outlive it.
class SubsetTransport final : public Transport {
 public:
  // FabricError if the parent's rank is not in members, a member is out of range or repeated.
  SubsetTransport(Transport& parent, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }

  Request isend(int peer, std::span<const std::byte> data, int tag) override;
  Request irecv(int peer, std::span<std::byte> data, int tag) override;
  void wait(Request& request) override;
  bool test(Request& request) override;

 private:
  Transport& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace ipupod::fabric

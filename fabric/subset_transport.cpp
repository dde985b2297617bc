// SubsetTransport: renumbers peers into the parent's ranks and forwards.
#include "fabric/subset_transport.hpp"

#include <set>
#include <string>

namespace ipupod::fabric {

SubsetTransport::SubsetTransport(Transport& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  std::set<int> seen;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    const int member = members_[i];
    if (member < 0 || member >= parent_.size() || !seen.insert(member).second) {
      throw FabricError("SubsetTransport on parent rank " + std::to_string(parent_.rank()) +
                        ": member " + std::to_string(member) + " is out of range (parent has " +
                        std::to_string(parent_.size()) +
                        " ranks) or listed twice; list each parent rank once");
    }
    if (member == parent_.rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0) {
    throw FabricError("SubsetTransport: parent rank " + std::to_string(parent_.rank()) +
                      " is not a member of the group; only members may make the subset");
  }
}

Request SubsetTransport::isend(int peer, std::span<const std::byte> data, int tag) {
  check_peer_and_tag("isend", peer, tag);
  return parent_.isend(members_[static_cast<std::size_t>(peer)], data, tag);
}

Request SubsetTransport::irecv(int peer, std::span<std::byte> data, int tag) {
  check_peer_and_tag("irecv", peer, tag);
  return parent_.irecv(members_[static_cast<std::size_t>(peer)], data, tag);
}

void SubsetTransport::wait(Request& request) {
  parent_.wait(request);
}

bool SubsetTransport::test(Request& request) {
  return parent_.test(request);
}

}  // namespace ipupod::fabric

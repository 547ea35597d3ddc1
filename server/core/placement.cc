// SPDX-License-Identifier: Apache-2.0
#include "server/core/placement.h"

#include <vector>

namespace repvar::server {

Placements Place(const TopologySnapshot& topology, int32_t replica_count) {
  std::vector<Placement> placement;
  placement.reserve(static_cast<size_t>(replica_count));
  for (int32_t i = 0; i < replica_count; ++i) {
    placement.push_back(Placement{topology.accelerators[i].device, topology.accelerators[i].task});
  }
  return Placements(std::move(placement));
}

bool OnOneHost(const TopologySnapshot& topology, int32_t replica_count) {
  for (int32_t i = 1; i < replica_count; ++i) {
    if (topology.accelerators[i].task != topology.accelerators[0].task) return false;
  }
  return true;
}

}  // namespace repvar::server

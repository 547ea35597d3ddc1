// SPDX-License-Identifier: Apache-2.0
// Where a new variable's replicas go (V1): pure functions of the topology.
#ifndef REPVAR_SERVER_CORE_PLACEMENT_H_
#define REPVAR_SERVER_CORE_PLACEMENT_H_

#include <cstdint>

#include "common/model/topology.h"
#include "common/model/variable.h"

namespace repvar::server {

// Replica i of a variable of `replica_count` replicas on accelerator
// ordinal i: the first `replica_count` accelerators of `topology` (its
// device and task). `replica_count` is at most the accelerators.
Placements Place(const TopologySnapshot& topology, int32_t replica_count);

// Whether Place(topology, replica_count) puts every replica on one host
// (then in-step data cannot survive the loss of that host).
bool OnOneHost(const TopologySnapshot& topology, int32_t replica_count);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_PLACEMENT_H_

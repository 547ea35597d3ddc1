// SPDX-License-Identifier: Apache-2.0
// The whole cluster at once -- topology, variables with their replicas'
// states, steps, published scalars -- as one message: what repvarctl status
// prints (CoordinatorAdmin.GetClusterStatus) and the web view draws.
#ifndef REPVAR_SERVER_RPC_CLUSTER_STATUS_H_
#define REPVAR_SERVER_RPC_CLUSTER_STATUS_H_

#include <cstddef>

#include "repvar/v1/coordinator.pb.h"
#include "server/core/coordinator.h"
#include "server/core/scalar_board.h"

namespace repvar::server {

// Lists at most `max_variables` variables (the first by name; 0: all), and
// counts all of them. `scalars` may be null (no curves).
void ClusterStatusToProto(Coordinator* core, const ScalarBoard* scalars, size_t max_variables,
                          v1::ClusterStatus* out);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_CLUSTER_STATUS_H_

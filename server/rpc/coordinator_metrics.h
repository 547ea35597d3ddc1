// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_COORDINATOR_METRICS_H_
#define REPVAR_SERVER_RPC_COORDINATOR_METRICS_H_

#include "server/core/coordinator.h"

namespace repvar::server {

// The coordinator's state as gauges, read at each scrape: live and missing
// workers, variables, replicas by state, the last committed step, the open
// step's age and participants yet to report, memory lent to tensors in
// flight. Call UnregisterCoordinatorGauges before `core` goes.
void RegisterCoordinatorGauges(Coordinator* core);
void UnregisterCoordinatorGauges();

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_COORDINATOR_METRICS_H_

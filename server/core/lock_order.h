// SPDX-License-Identifier: Apache-2.0
// The coordinator core's lock order, outermost first. Every unit's mutex is
// a RankedMutex with its rank here, so the order is checked on every
// acquisition (common/base/ranked_mutex.h); the clang build checks the
// guarded fields (-Wthread-safety).
//
//   per-variable write locks   Replication: held across a broadcast, taken
//                              in variable-id order before any ranked lock
//   kStepsRank                 StepCoordinator::mu_ (the barrier, the write gate)
//   kGroupsRank                CollectiveGroups::mu_ (held across a collective)
//   kRegistryRank              Registry::mu_ (the state and its commit point)
//   kLeafRank                  RendezvousStore::mu_, Replication::mu_: never
//                              held while taking another lock
//
// The edges that exist: a broadcast checks whether a step is open (write
// locks -> steps) and runs under the groups lock (write locks -> groups); a
// step asks the groups for its collectives' tags and commits through the
// registry (steps -> groups, steps -> registry); a new group deletes the old
// one's rendezvous keys (groups -> leaf).
#ifndef REPVAR_SERVER_CORE_LOCK_ORDER_H_
#define REPVAR_SERVER_CORE_LOCK_ORDER_H_

namespace repvar::server {

inline constexpr int kStepsRank = 10;
inline constexpr int kGroupsRank = 20;
inline constexpr int kRegistryRank = 30;
inline constexpr int kLeafRank = 40;

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_LOCK_ORDER_H_

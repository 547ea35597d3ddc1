// SPDX-License-Identifier: Apache-2.0
// What a replica holds, as the coordinator records it, and the only legal
// ways that changes. ClusterState::Apply moves every replica through
// TransitionReplica(); nothing else writes a replica's state.
//
//        created
//           |
//           v                 acked
//     UNINITIALIZED ---------------------------> UP_TO_DATE --.
//           |                                  ^  |      ^    | acked
//           | missed                    acked  |  | missed '----'
//           '-----------------------> STALE ---'  |
//                                      ^  ^ '-----'
//                               missed '--'
//
//   UNINITIALIZED, UP_TO_DATE, STALE --lost--> UNAVAILABLE (missed: stays)
//   UNAVAILABLE --returned---------------> STALE
//   UNAVAILABLE --returned uninitialized-> UNINITIALIZED
//
//   acked     its worker acknowledged holding the committed value (a
//             cross-replica write, a resync, a step it took part in)
//   missed    a value was committed that this replica does not hold (it sat
//             a step out, or holds an uncommitted version of a failed write)
//   lost      its worker was declared dead
//   returned  its worker registered again; what it holds is known only
//             once it is fenced off and listed (F2), so it is STALE until
//             then, even when the same process returns: a write that was
//             cut off may have landed after its last acknowledgement
//
// An event outside the table is a bug in the code that built the record:
// it crashes, naming the replica, its state and the event.
#ifndef REPVAR_SERVER_CORE_REPLICA_STATE_H_
#define REPVAR_SERVER_CORE_REPLICA_STATE_H_

#include <optional>
#include <string>

#include "repvar/types.h"

namespace repvar::server {

enum class ReplicaEvent {
  kAcked,
  kMissed,
  kLost,
  kReturned,
  kReturnedUninitialized,
};

const char* ReplicaEventName(ReplicaEvent event);

// The state after `event` in `from`; nullopt when the event cannot happen
// there.
std::optional<ReplicaState> NextReplicaState(ReplicaState from, ReplicaEvent event);

// Moves `state`, replica `index` of `variable`, through `event`; returns
// whether the state is another one now. Crashes, naming the replica
// ("w/3"), when the transition is not in the table. The name is made only
// then: a step's commit moves every replica of every variable it changed
// (32,000 for 32 workers x 1,000 variables).
bool TransitionReplica(ReplicaState& state, ReplicaEvent event, const std::string& variable,
                       int32_t index);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_REPLICA_STATE_H_

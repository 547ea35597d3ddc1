// SPDX-License-Identifier: Apache-2.0
// The replica state machine's table: every legal transition, and an illegal
// one crashing with a message that names the replica, its state and the event.
#include "server/core/replica_state.h"

#include <gtest/gtest.h>

namespace repvar::server {
namespace {

using S = ReplicaState;
using E = ReplicaEvent;

TEST(ReplicaState, LiveReplicas_AckedMissedLost) {
  for (S from : {S::kUninitialized, S::kUpToDate, S::kStale}) {
    EXPECT_EQ(NextReplicaState(from, E::kAcked), S::kUpToDate) << ReplicaStateName(from);
    EXPECT_EQ(NextReplicaState(from, E::kMissed), S::kStale) << ReplicaStateName(from);
    EXPECT_EQ(NextReplicaState(from, E::kLost), S::kUnavailable) << ReplicaStateName(from);
    for (E returned : {E::kReturned, E::kReturnedUninitialized}) {
      EXPECT_EQ(NextReplicaState(from, returned), std::nullopt) << ReplicaEventName(returned);
    }
  }
}

TEST(ReplicaState, UnavailableReplicas_StayUntilTheirWorkerReturns) {
  EXPECT_EQ(NextReplicaState(S::kUnavailable, E::kMissed), S::kUnavailable);
  // Unverified until F2's fenced listing, even from the same process.
  EXPECT_EQ(NextReplicaState(S::kUnavailable, E::kReturned), S::kStale);
  EXPECT_EQ(NextReplicaState(S::kUnavailable, E::kReturnedUninitialized), S::kUninitialized);
  EXPECT_EQ(NextReplicaState(S::kUnavailable, E::kAcked), std::nullopt);
  EXPECT_EQ(NextReplicaState(S::kUnavailable, E::kLost), std::nullopt);
}

TEST(ReplicaState, TransitionMovesTheState) {
  S state = S::kUninitialized;
  TransitionReplica(state, E::kAcked, "w", 0);
  EXPECT_EQ(state, S::kUpToDate);
  TransitionReplica(state, E::kLost, "w", 0);
  EXPECT_EQ(state, S::kUnavailable);
  TransitionReplica(state, E::kReturned, "w", 0);
  EXPECT_EQ(state, S::kStale);
}

TEST(ReplicaStateDeathTest, IllegalTransition_CrashesNamingIt) {
  S state = S::kUnavailable;
  EXPECT_DEATH(TransitionReplica(state, E::kAcked, "w", 3),
               "illegal replica transition: w/3 is UNAVAILABLE and cannot be acked");
}

}  // namespace
}  // namespace repvar::server

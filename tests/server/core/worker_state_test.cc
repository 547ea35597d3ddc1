// SPDX-License-Identifier: Apache-2.0
// The worker state machine's table: every legal transition, and an illegal
// one crashing with a message that names the task, its state and the event.
#include "server/core/worker_state.h"

#include <gtest/gtest.h>

namespace repvar::server {
namespace {

using S = WorkerState;
using E = WorkerEvent;

TEST(WorkerState, Table) {
  EXPECT_EQ(NextWorkerState(S::kUnknown, E::kRegistered), S::kLive);
  EXPECT_EQ(NextWorkerState(S::kDead, E::kRegistered), S::kLive);
  EXPECT_EQ(NextWorkerState(S::kLive, E::kDeclaredDead), S::kDead);
  EXPECT_EQ(NextWorkerState(S::kLive, E::kRegistered), std::nullopt);
  EXPECT_EQ(NextWorkerState(S::kDead, E::kDeclaredDead), std::nullopt);
  EXPECT_EQ(NextWorkerState(S::kUnknown, E::kDeclaredDead), std::nullopt);
}

TEST(WorkerStateDeathTest, IllegalTransition_CrashesNamingIt) {
  S state = S::kDead;
  EXPECT_DEATH(TransitionWorker(state, E::kDeclaredDead, "tpu_worker:2"),
               "illegal worker transition: tpu_worker:2 is DEAD and cannot be declared dead");
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "worker/core/worker_agent.h"

#include <gtest/gtest.h>

namespace repvar::worker {
namespace {

class ScriptedLink : public CoordinatorLink {
 public:
  absl::StatusOr<absl::Duration> Register(const WorkerRegistration&) override {
    ++registers;
    if (!register_status.ok()) return register_status;
    return absl::Milliseconds(250);
  }
  absl::StatusOr<HeartbeatAnswer> Heartbeat(const TaskKey&, uint64_t,
                                            const std::vector<HeldValue>& held) override {
    ++heartbeats;
    asked = held;
    if (!heartbeat_status.ok()) return heartbeat_status;
    return HeartbeatAnswer{lease, std::vector<bool>(held.size(), confirm)};
  }
  std::vector<HeldValue> asked;
  absl::Duration lease = absl::Seconds(3);
  bool confirm = true;
  absl::Status register_status;
  absl::Status heartbeat_status;
  int registers = 0;
  int heartbeats = 0;
};

TEST(WorkerAgent, RegistersThenHeartbeatsAtTheAdvertisedInterval) {
  ScriptedLink link;
  WorkerAgent agent({"tpu_worker", 0, "h:1", 5, {}}, &link);
  absl::Time t0 = absl::FromUnixSeconds(100);
  absl::Time next = agent.Tick(t0);
  EXPECT_EQ(agent.state(), WorkerAgent::State::kRegistered);
  EXPECT_EQ(next, t0 + absl::Milliseconds(250));
  agent.Tick(next);
  EXPECT_EQ(link.heartbeats, 1);
}

TEST(WorkerAgent, RegisterFails_RetriesWithBackoff) {
  ScriptedLink link;
  link.register_status = absl::UnavailableError("coordinator restarting");
  WorkerAgent agent({"tpu_worker", 0, "h:1", 5, {}}, &link);
  absl::Time t = absl::FromUnixSeconds(100);
  absl::Time n1 = agent.Tick(t);
  absl::Time n2 = agent.Tick(n1);
  EXPECT_EQ(agent.state(), WorkerAgent::State::kUnregistered);
  EXPECT_GT(n2 - n1, n1 - t);
}

TEST(WorkerAgent, DeclaredDead_RegistersAgain) {
  ScriptedLink link;
  WorkerAgent agent({"tpu_worker", 0, "h:1", 5, {}}, &link);
  absl::Time t = agent.Tick(absl::FromUnixSeconds(100));
  link.heartbeat_status = absl::NotFoundError("declared dead");
  t = agent.Tick(t);
  EXPECT_EQ(agent.state(), WorkerAgent::State::kUnregistered);
  link.heartbeat_status = absl::OkStatus();
  agent.Tick(t);
  EXPECT_EQ(link.registers, 2);
  EXPECT_EQ(agent.state(), WorkerAgent::State::kRegistered);
}

TEST(WorkerAgent, TransientHeartbeatError_StaysRegistered) {
  ScriptedLink link;
  WorkerAgent agent({"tpu_worker", 0, "h:1", 5, {}}, &link);
  absl::Time t = agent.Tick(absl::FromUnixSeconds(100));
  link.heartbeat_status = absl::UnavailableError("coordinator restarting");
  agent.Tick(t);
  EXPECT_EQ(agent.state(), WorkerAgent::State::kRegistered);
}

// T1: a newer process of this task registered; this one stops for good.
TEST(WorkerAgent, Superseded_Fenced_NeverRegistersAgain) {
  ScriptedLink link;
  WorkerAgent agent({"tpu_worker", 0, "h:1", 5, {}}, &link);
  absl::Time t = agent.Tick(absl::FromUnixSeconds(100));
  link.heartbeat_status = absl::AbortedError("stale incarnation");
  EXPECT_EQ(agent.Tick(t), absl::InfiniteFuture());
  EXPECT_EQ(agent.state(), WorkerAgent::State::kFenced);
  agent.Tick(t + absl::Seconds(5));
  EXPECT_EQ(link.registers, 1);

  ScriptedLink refused;
  refused.register_status = absl::AbortedError("live under a newer incarnation");
  WorkerAgent old({"tpu_worker", 0, "h:1", 4, {}}, &refused);
  old.Tick(absl::FromUnixSeconds(100));
  EXPECT_EQ(old.state(), WorkerAgent::State::kFenced);
}

}  // namespace
}  // namespace repvar::worker

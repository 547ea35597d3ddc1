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
  absl::StatusOr<HeartbeatAnswer> Heartbeat(const TaskKey&, uint64_t, bool read_lease,
                                            const std::vector<HeldValue>& held) override {
    ++heartbeats;
    asked_lease = read_lease;
    asked = held;
    if (!heartbeat_status.ok()) return heartbeat_status;
    return HeartbeatAnswer{lease, std::vector<bool>(held.size(), confirm)};
  }
  bool asked_lease = false;
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

// C8: a worker with a local read table asks for a lease and about the values
// it holds, serves them once confirmed, and stops serving them the moment the
// coordinator no longer knows it; one without a table asks for nothing.
TEST(WorkerAgent, C8_LocalReads_LeasedAndConfirmed_LostWithTheRegistration) {
  ScriptedLink link;
  std::vector<uint64_t> region(LocalReadTableBytes(16, 4096) / 8, 0);
  const std::span<std::byte> bytes(reinterpret_cast<std::byte*>(region.data()), region.size() * 8);
  ReplicaStore store;
  LocalReads reads(bytes, 16, &store, [] { return int64_t{5}; });
  store.set_listener(&reads);
  float x = 1;
  ReplicaWrite w{7,
                 "w",
                 1,
                 {0},
                 std::make_shared<const Tensor>(*Tensor::FromBytes(
                     TensorSpec{DType::kFloat32, {}}, std::as_bytes(std::span(&x, 1))))};
  w.fence = 3;
  ASSERT_TRUE(store.Apply({w}).ok());
  WorkerAgent agent({"tpu_worker", 0, "h:1", 5, {}}, &link, &reads);
  absl::Time t = agent.Tick(absl::FromUnixSeconds(100));  // registers
  t = agent.Tick(t);
  EXPECT_TRUE(link.asked_lease);
  ASSERT_EQ(link.asked.size(), 1u);
  EXPECT_EQ(reads.readable(), 1u);
  link.heartbeat_status = absl::NotFoundError("declared dead");
  agent.Tick(t);
  EXPECT_EQ(reads.readable(), 0u);
  EXPECT_EQ(reads.to_confirm(), 1u);

  ScriptedLink plain;
  WorkerAgent without({"tpu_worker", 1, "h:2", 5, {}}, &plain);
  without.Tick(without.Tick(absl::FromUnixSeconds(100)));
  EXPECT_EQ(plain.heartbeats, 1);
  EXPECT_FALSE(plain.asked_lease);
}

}  // namespace
}  // namespace repvar::worker

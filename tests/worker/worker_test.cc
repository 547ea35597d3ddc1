// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"
#include "worker/replica_store.h"
#include "worker/worker_agent.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::StatusIs;

std::shared_ptr<const Tensor> Value(float x) {
  return std::make_shared<const Tensor>(
      *Tensor::FromBytes(TensorSpec{DType::kFloat32, {}}, std::as_bytes(std::span(&x, 1))));
}

TEST(ReplicaStore, Apply_AllReplicasShareOneValue) {
  ReplicaStore store;
  store.Apply({{7, "w", 1, {0, 1}, Value(1.0f)}});
  auto r0 = store.Get(7, 0);
  auto r1 = store.Get(7, 1);
  ASSERT_OK(r0);
  ASSERT_OK(r1);
  EXPECT_EQ(r0->version, 1);
  EXPECT_EQ(r0->value.get(), r1->value.get());
  EXPECT_EQ(store.BytesHeld(), 4u);
  EXPECT_THAT(store.Get(7, 2), StatusIs(absl::StatusCode::kNotFound));
}

TEST(ReplicaStore, ReaderKeepsItsVersionAcrossAWrite) {
  ReplicaStore store;
  store.Apply({{7, "w", 1, {0}, Value(1.0f)}});
  auto held = store.Get(7, 0);
  store.Apply({{7, "w", 2, {0}, Value(2.0f)}});
  EXPECT_EQ(held->version, 1);
  EXPECT_EQ(LoadElement(*held->value, 0), 1.0);
  EXPECT_EQ(LoadElement(*store.Get(7, 0)->value, 0), 2.0);
  store.Drop(7);
  EXPECT_TRUE(store.List().empty());
}

class ScriptedLink : public CoordinatorLink {
 public:
  absl::StatusOr<absl::Duration> Register(const Registration&) override {
    ++registers;
    if (!register_status.ok()) return register_status;
    return absl::Milliseconds(250);
  }
  absl::Status Heartbeat(const std::string&, int32_t, uint64_t) override {
    ++heartbeats;
    return heartbeat_status;
  }
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
  link.register_status = absl::AbortedError("old incarnation still live");
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

}  // namespace
}  // namespace repvar::worker

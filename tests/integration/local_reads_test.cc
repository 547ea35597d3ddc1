// SPDX-License-Identifier: Apache-2.0
// C8 against real processes: a trainer reads committed values from its
// worker's local read table (no call), and never an older value than one
// acknowledged before the read began, even when its worker stops answering
// and the cluster goes on without it.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "common/base/seeded_bug.h"
#include "repvar/client.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

class LocalReadsTest : public testing::StartedCluster {
 protected:
  LocalReadsTest() : StartedCluster({.tpu_workers = 2, .tpu_per_worker = 2, .cpu_host = false}) {}
  void TearDown() override { SeedBug(SeededBug::kNone); }

  // "w": 16 floats with a replica on each of the 4 accelerators, assigned
  // `first`.
  void CreateAndAssign(float first) {
    VariableSpec s{.name = "w", .shape = {16}, .replica_count = 4};
    s.initializer = InitializerSpec::Zeros();
    ASSERT_OK(client_->CreateVariable(s));
    ASSERT_OK(client_->Initialize({"w"}));
    Assign(first);
  }
  int64_t Assign(float v) {
    std::vector<float> values(16, v);
    auto ack = client_->Assign("w", std::span<const float>(values));
    EXPECT_OK(ack);
    return ack.ok() ? ack->version : -1;
  }
  // Reads until one is served from the local table (the worker confirms a
  // written value on its next heartbeat); that read.
  absl::StatusOr<TensorValue> ReadServedLocally(Client& c) {
    const uint64_t before = c.local_read_stats().served;
    for (int i = 0; i < 200; ++i) {
      auto v = c.Read("w");
      if (!v.ok() || c.local_read_stats().served > before) return v;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return absl::DeadlineExceededError("no read was served locally in 5 s");
  }
};

TEST_F(LocalReadsTest, C8_CommittedValue_ServedLocally_WithItsVersion) {
  CreateAndAssign(3);
  ASSERT_OK(client_->UseLocalReads("tpu_worker:0"));
  auto v = ReadServedLocally(*client_);
  ASSERT_OK(v);
  auto info = client_->GetVariable("w");
  ASSERT_OK(info);
  EXPECT_EQ(v->version, info->version);
  EXPECT_EQ(v->checksum, info->checksum);
  EXPECT_EQ(v->as<float>()[15], 3.0f);
  // ReadInto the same way.
  std::vector<float> out(16);
  auto into = client_->ReadInto("w", std::as_writable_bytes(std::span(out)));
  ASSERT_OK(into);
  EXPECT_EQ(into->version, info->version);
  EXPECT_EQ(out[0], 3.0f);
}

TEST_F(LocalReadsTest, C8_EveryReadAfterAnAcknowledgedAssign_SeesIt) {
  CreateAndAssign(0);
  ASSERT_OK(client_->UseLocalReads("tpu_worker:1"));
  ASSERT_OK(ReadServedLocally(*client_));
  for (int i = 1; i <= 20; ++i) {
    const int64_t version = Assign(static_cast<float>(i));
    // Read at once (the table invalidated it before the worker answered)
    // and again once the worker confirmed it.
    auto now = client_->Read("w");
    ASSERT_OK(now);
    EXPECT_EQ(now->version, version);
    EXPECT_EQ(now->as<float>()[0], static_cast<float>(i));
    if (i % 5 == 0) {
      auto later = ReadServedLocally(*client_);
      ASSERT_OK(later);
      EXPECT_EQ(later->version, version);
    }
  }
  EXPECT_GE(client_->local_read_stats().served, 4u);
  EXPECT_GE(client_->local_read_stats().asked, 20u);
}

// The worker is paused (its table still mapped here), declared dead, and an
// assign is acknowledged without it: the next read must not be the old value.
// `seeded`: the control, whose reads ignore the lease.
void PausedWorker_ThenAssign_ReadIsNotStale(LocalReadsTest* t, testing::TestCluster& cluster,
                                            Client& client, bool* stale) {
  ASSERT_OK(client.UseLocalReads("tpu_worker:0"));
  auto before = client.Read("w");
  ASSERT_OK(before);
  cluster.worker(0).Kill(SIGSTOP);
  // Declared dead after the heartbeat timeout (2 s): the assign then skips it.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  std::vector<float> values(16, 99.0f);
  auto ack = client.Assign("w", std::span<const float>(values));
  auto after = client.Read("w");
  cluster.worker(0).Kill(SIGCONT);
  ASSERT_OK(ack);
  ASSERT_OK(after);
  *stale = after->version < ack->version;
  (void)t;
}

TEST_F(LocalReadsTest, C8_WorkerPausedAndDeclaredDead_ReadAfterAnAssignWithoutIt_IsNotStale) {
  CreateAndAssign(1);
  ASSERT_OK(client_->UseLocalReads("tpu_worker:0"));
  ASSERT_OK(ReadServedLocally(*client_));
  bool stale = true;
  PausedWorker_ThenAssign_ReadIsNotStale(this, cluster_, *client_, &stale);
  EXPECT_FALSE(stale);
}

TEST_F(LocalReadsTest, C8_Control_ReadsIgnoringTheLease_AreStale) {
  CreateAndAssign(1);
  ASSERT_OK(client_->UseLocalReads("tpu_worker:0"));
  ASSERT_OK(ReadServedLocally(*client_));
  SeedBug(SeededBug::kLocalReadsIgnoreLease);
  bool stale = false;
  PausedWorker_ThenAssign_ReadIsNotStale(this, cluster_, *client_, &stale);
  EXPECT_TRUE(stale) << "the check above could not fail";
}

TEST_F(LocalReadsTest, C8_NotAWorker_Refused) {
  EXPECT_THAT(client_->UseLocalReads("tpu_worker"),
              testing::StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->UseLocalReads("tpu_worker:9"),
              testing::StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(client_->local_read_stats().served, 0u);
}

}  // namespace
}  // namespace repvar

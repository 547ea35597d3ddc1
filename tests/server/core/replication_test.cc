// SPDX-License-Identifier: Apache-2.0
// Replica truth (F2, F3): what the coordinator reports about a replica is
// what the replica holds. A write whose answer was lost may still land; a
// coordinator may stop between sending a write and recording it. Repair and
// recovery fence the workers off from every earlier write, ask what they
// hold and rewrite what differs, so in the end every live replica holds the
// committed (version, checksum) and is reported so.
#include "server/core/replication.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/coordinator.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_worker_client.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar::server {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::Floats;
using ::repvar::testing::StatusIs;

// A log whose disk can fill: before a write asks (CheckRoom) or between the
// asking and the record (Append).
class FillableLog final : public StateLog {
 public:
  absl::StatusOr<uint64_t> Append(Record& record) override {
    if (refuse_appends || appends_left == 0) return absl::ResourceExhaustedError("disk full");
    if (appends_left > 0) --appends_left;
    return records_.Append(record);
  }
  absl::Status CheckRoom(uint64_t) override {
    return no_room ? absl::ResourceExhaustedError("disk full") : absl::OkStatus();
  }
  absl::Status Recover(ClusterState& state) override { return records_.Recover(state); }

  bool no_room = false;
  bool refuse_appends = false;
  int appends_left = -1;  // refuse once this many more were taken (-1: never)

 private:
  MemoryStateLog records_;
};

class ReplicationTruthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    core_ = Start();
    for (int t = 0; t < 3; ++t) Register(t, 100 + t);
    VariableDef def;
    def.name = "w";
    def.tensor = TensorSpec{DType::kFloat32, {3}};
    def.replica_count = 6;
    def.aggregation = Aggregation::kMean;
    ASSERT_OK(core_->CreateVariables({}, {{def, {}}}));
    ASSERT_OK(Assign({1, 2, 3}));
  }
  std::unique_ptr<Coordinator> Start(uint64_t prepare_max_bytes = 16 << 10) {
    CoordinatorOptions options;
    options.idempotency_capacity = 5;
    options.replication.prepare_max_bytes = prepare_max_bytes;
    return std::make_unique<Coordinator>(options, &clock_, &workers_, &log_);
  }
  void Register(int task, uint64_t incarnation) {
    WorkerRegistration r{"tpu_worker", task, absl::StrCat("h", task, ":1"), incarnation, {}};
    for (int i = 0; i < 2; ++i) {
      r.devices.push_back(absl::StrCat("/job:tpu_worker/replica:0/task:", task, "/device:TPU:", i));
    }
    ASSERT_OK(core_->RegisterWorker(r));
  }
  absl::Status Assign(std::vector<float> v) {
    return core_->Assign({}, {"w", AssignOp::kAssign, F32(v)}).status();
  }
  // Every replica whose worker holds something other than the committed
  // value, or that is reported as something other than it holds.
  std::vector<std::string> Disagreements() {
    std::vector<std::string> out;
    auto view = core_->GetVariable("w");
    for (const ReplicaView& r : view->replicas) {
      auto held = workers_.Get(r.task.ToString(), view->id, r.index);
      const bool holds = held && held->version == view->version && held->checksum == view->checksum;
      if (!holds) {
        out.push_back(absl::StrCat(r.name, " holds version ", held ? held->version : 0));
      }
      if (holds != (r.state == ReplicaState::kUpToDate)) {
        out.push_back(absl::StrCat(r.name, " is reported ", ReplicaStateName(r.state)));
      }
    }
    return out;
  }

  repvar::testing::FakeClock clock_;
  repvar::testing::FakeWorkerClient workers_;
  FillableLog log_;
  std::unique_ptr<Coordinator> core_;
};

TEST_F(ReplicationTruthTest, F2_UnansweredWriteThatLandsBeforeRepair_IsRewritten) {
  workers_.LoseAnswersOf("tpu_worker:2");
  EXPECT_THAT(Assign({7, 7, 7}), StatusIs(absl::StatusCode::kUnavailable, "tpu_worker:2"));
  auto view = core_->GetVariable("w");
  EXPECT_EQ(view->version, 1);
  EXPECT_TRUE(view->needs_resync);
  // Nobody is reported up to date: two workers took the uncommitted value
  // and the third may have.
  for (const ReplicaView& r : view->replicas) EXPECT_EQ(r.state, ReplicaState::kStale) << r.name;
  EXPECT_EQ(workers_.LandLate(), 1);  // the paused worker resumes
  core_->ResyncStale();
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
  EXPECT_FALSE(core_->GetVariable("w")->needs_resync);
  EXPECT_EQ(Floats(*core_->Read("w")->value), (std::vector<float>{1, 2, 3}));
}

TEST_F(ReplicationTruthTest, F2_UnansweredWriteThatLandsAfterRepair_IsFencedOff) {
  workers_.LoseAnswersOf("tpu_worker:2");
  EXPECT_THAT(Assign({7, 7, 7}), StatusIs(absl::StatusCode::kUnavailable));
  // Repair runs while the write is still on its way.
  core_->ResyncStale();
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
  EXPECT_EQ(workers_.LandLate(), 0) << "the late write landed on top of the repair";
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
}

// Negative control: the check above sees a late write that is not fenced.
TEST_F(ReplicationTruthTest, F2_NegativeControl_UnfencedLateWrite_IsADisagreement) {
  workers_.LoseAnswersOf("tpu_worker:2");
  EXPECT_THAT(Assign({7, 7, 7}), StatusIs(absl::StatusCode::kUnavailable));
  core_->ResyncStale();
  EXPECT_EQ(workers_.LandLate(/*fenced=*/false), 1);
  EXPECT_THAT(Disagreements(), ::testing::Not(::testing::IsEmpty()));
}

TEST_F(ReplicationTruthTest, F2_ReplicaReportedUpToDateButHoldingOtherBytes_FoundAndRepaired) {
  auto view = core_->GetVariable("w");
  // Bytes the coordinator never sent (a bug, a bad memory): only asking shows it.
  workers_.Plant("tpu_worker:1", view->id, 3, {1, F32({9, 9, 9})->checksum, 101, F32({9, 9, 9})});
  EXPECT_THAT(Disagreements(), ::testing::Not(::testing::IsEmpty()));
  ASSERT_OK(core_->registry()
                .Commit([&](const ClusterState&) -> absl::StatusOr<Record> {
                  return Record{{ResyncFlagged{view->id, true}}};
                })
                .status());
  core_->ResyncStale();
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
}

TEST_F(ReplicationTruthTest, F3_RestartAfterAWriteWasSentButNotRecorded_WorkersVerified) {
  // The coordinator stops between sending version 2 and recording it: the
  // workers hold version 2, the log says version 1, every replica current.
  const uint64_t id = core_->GetVariable("w")->id;
  for (int t = 0; t < 3; ++t) {
    for (int r : {2 * t, 2 * t + 1}) {
      workers_.Plant(absl::StrCat("tpu_worker:", t), id, r,
                     {2, F32({5, 5, 5})->checksum, static_cast<uint64_t>(100 + t), F32({5, 5, 5})});
    }
  }
  // ... and a replica of a variable it never recorded.
  workers_.Plant("tpu_worker:0", 999, 0, {1, 1, 100, F32({1})});
  core_ = Start();
  ASSERT_OK(core_->Recover());
  auto view = core_->GetVariable("w");
  EXPECT_EQ(view->version, 1);
  for (const ReplicaView& r : view->replicas) EXPECT_EQ(r.state, ReplicaState::kStale) << r.name;
  EXPECT_FALSE(workers_.Get("tpu_worker:0", 999, 0).has_value()) << "unknown id not dropped";
  core_->ResyncStale();
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
  EXPECT_EQ(Floats(*core_->Read("w")->value), (std::vector<float>{1, 2, 3}));
}

TEST_F(ReplicationTruthTest, F3_RestartWithAWorkerThatDoesNotAnswer_ItsReplicasStale) {
  workers_.Fail("tpu_worker:1", absl::UnavailableError("down"));
  core_ = Start();
  ASSERT_OK(core_->Recover());
  auto view = core_->GetVariable("w");
  EXPECT_EQ(view->replicas[2].state, ReplicaState::kStale);
  EXPECT_EQ(view->replicas[3].state, ReplicaState::kStale);
  EXPECT_EQ(view->replicas[0].state, ReplicaState::kUpToDate);  // verified
  workers_.Heal("tpu_worker:1");
  core_->ResyncStale();
  // It held the committed value all along: acknowledged, not rewritten.
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
}

TEST_F(ReplicationTruthTest, F3_FencesGrowAcrossRestarts) {
  const uint64_t before = workers_.fence("tpu_worker:0");
  ASSERT_GT(before, 0u);
  core_ = Start();
  ASSERT_OK(core_->Recover());
  ASSERT_OK(Assign({4, 5, 6}));
  EXPECT_GT(workers_.fence("tpu_worker:0"), before);
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
}

TEST_F(ReplicationTruthTest, F4_DiskFullBeforeAWrite_ResourceExhausted_NothingSentAnywhere) {
  const int calls = workers_.calls();
  log_.no_room = true;
  EXPECT_THAT(Assign({7, 7, 7}), StatusIs(absl::StatusCode::kResourceExhausted, "disk full"));
  EXPECT_EQ(workers_.calls(), calls);
  EXPECT_EQ(core_->GetVariable("w")->version, 1);
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
  log_.no_room = false;
  ASSERT_OK(Assign({7, 7, 7}));
}

// A write whose commit is synced before its answer (values over
// prepare_max_bytes; here every write).
TEST_F(ReplicationTruthTest, F4_DiskFullAfterTheWorkersTookIt_RepairFindsAndRewrites) {
  core_ = Start(/*prepare_max_bytes=*/0);
  ASSERT_OK(core_->Recover());
  log_.refuse_appends = true;
  EXPECT_THAT(Assign({7, 7, 7}), StatusIs(absl::StatusCode::kResourceExhausted));
  log_.refuse_appends = false;
  // The workers hold version 2; the records still say version 1, current.
  EXPECT_THAT(Disagreements(), ::testing::Not(::testing::IsEmpty()));
  core_->ResyncStale();
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
  EXPECT_EQ(Floats(*core_->Read("w")->value), (std::vector<float>{1, 2, 3}));
}

// A small write is decided (WritePrepared) before anything is sent: a full
// disk refuses it there, with nothing sent and nothing changed.
TEST_F(ReplicationTruthTest, F4_DiskFullBeforeASmallWrite_RefusedBeforeAnythingIsSent) {
  const int calls = workers_.calls();
  const std::string before = core_->registry().Read([](const ClusterState& s) { return s.Dump(); });
  log_.refuse_appends = true;
  EXPECT_THAT(Assign({7, 7, 7}), StatusIs(absl::StatusCode::kResourceExhausted));
  log_.refuse_appends = false;
  EXPECT_EQ(workers_.calls(), calls);
  EXPECT_EQ(core_->registry().Read([](const ClusterState& s) { return s.Dump(); }), before);
  EXPECT_THAT(Disagreements(), ::testing::IsEmpty());
}

// Once its WritePrepared is durable, a write's resolution must be recorded:
// a log that refuses it stops the coordinator (as a failed sync does), and
// the restart resolves the write, rather than the caller being told of a
// failure that the next start would turn into a commit.
TEST_F(ReplicationTruthTest, F4_DiskFullAfterAWriteWasDecided_StopsTheCoordinator) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        log_.appends_left = 1;  // the WritePrepared, not its resolution
        (void)Assign({7, 7, 7});
      },
      "cannot be resolved in the state log");
}

TEST_F(ReplicationTruthTest, C6_IdempotencyTableFull_NewIdRefusedBeforeFanOut_RetriesAnswered) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(core_->Assign({absl::StrCat("r", i), 1}, {"w", AssignOp::kAdd, F32({1, 1, 1})}));
  }
  const int calls = workers_.calls();
  EXPECT_THAT(core_->Assign({"r5", 1}, {"w", AssignOp::kAdd, F32({1, 1, 1})}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "request-id table"));
  EXPECT_EQ(workers_.calls(), calls);
  // A retry of a kept request is still answered (not applied twice).
  auto retry = core_->Assign({"r0", 1}, {"w", AssignOp::kAdd, F32({1, 1, 1})});
  ASSERT_OK(retry);
  EXPECT_EQ(retry->version, 2);
  EXPECT_EQ(core_->GetVariable("w")->version, 6);
  // Once the oldest answers age out of the window there is room again.
  clock_.Advance(absl::Hours(1) + absl::Seconds(1));
  ASSERT_OK(core_->Assign({"r5", 1}, {"w", AssignOp::kAdd, F32({1, 1, 1})}));
}

}  // namespace
}  // namespace repvar::server

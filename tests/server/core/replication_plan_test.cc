// SPDX-License-Identifier: Apache-2.0
// The write path's pure decisions (replication_plan.h): who is sent what,
// what the answers mean, and the record that settles a write (C2, F7).
#include "server/core/replication_plan.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/testing/tensors.h"

namespace repvar::server {
namespace {

using ::repvar::testing::F32;

DeviceName Tpu(int task, int id) {
  return *DeviceName::Parse(
      absl::StrCat("/job:tpu_worker/replica:0/task:", task, "/device:TPU:", id));
}

Change Registered(int task) {
  WorkerRegistered w;
  w.task = TaskKey{"tpu_worker", task};
  w.address = absl::StrCat("h", task);
  w.incarnation = 100 + task;
  w.devices = {Tpu(task, 0), Tpu(task, 1)};
  return w;
}

// Three workers with two accelerators each; "a" and "b" (ids 1 and 2) with
// replicas on tpu_worker:0 and :1, "c" (id 3) on tpu_worker:2 alone.
class ReplicationPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int t : {0, 1, 2}) state_.Apply(Record{{Registered(t)}});
    Create(1, "a", {{0, 0}, {0, 1}, {1, 0}});
    Create(2, "b", {{0, 0}, {1, 1}});
    Create(3, "c", {{2, 0}});
  }
  void Create(uint64_t id, const std::string& name, std::vector<std::pair<int, int>> where) {
    VariableDef def;
    def.name = name;
    def.tensor = TensorSpec{DType::kFloat32, {1}};
    def.replica_count = static_cast<int32_t>(where.size());
    std::vector<Placement> placement;
    for (auto [task, dev] : where) {
      placement.push_back(Placement{Tpu(task, dev), {"tpu_worker", task}});
    }
    state_.Apply({{VariableCreated{id, def, std::move(placement), {}}}});
  }
  PlannedWrite Write(uint64_t id, const std::string& name, float v) {
    return PlannedWrite{id, name, 1, F32({v})};
  }

  ClusterState state_{ClusterStateOptions{}};
};

TEST_F(ReplicationPlanTest, GroupByWorker_EachLiveWorkerGetsItsReplicas_InTaskOrder) {
  const auto batches = GroupByWorker(state_, {Write(1, "a", 1), Write(2, "b", 2), Write(3, "c", 3)},
                                     /*fence=*/77);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].target.task.ToString(), "tpu_worker:0");
  EXPECT_EQ(batches[0].target.incarnation, 100u);
  ASSERT_EQ(batches[0].writes.size(), 2u);
  EXPECT_EQ(batches[0].writes[0].replicas, (std::vector<int32_t>{0, 1}));  // a
  EXPECT_EQ(batches[0].writes[1].replicas, (std::vector<int32_t>{0}));     // b
  EXPECT_EQ(batches[1].writes[0].replicas, (std::vector<int32_t>{2}));     // a
  EXPECT_EQ(batches[1].writes[1].replicas, (std::vector<int32_t>{1}));     // b
  EXPECT_EQ(batches[2].writes.size(), 1u);                                 // c only
  for (const WriteBatch& b : batches) {
    for (const ReplicaWrite& w : b.writes) EXPECT_EQ(w.fence, 77u);
  }
}

TEST_F(ReplicationPlanTest, GroupByWorker_DeadWorkersAndDeletedVariablesLeftOut) {
  state_.Apply(Record{{WorkerDied{TaskKey{"tpu_worker", 1}, 101}}});
  const auto batches =
      GroupByWorker(state_, {Write(1, "a", 1), Write(9, "gone", 2), Write(3, "c", 3)}, 1);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].target.task.ToString(), "tpu_worker:0");
  EXPECT_EQ(batches[1].target.task.ToString(), "tpu_worker:2");
}

TEST_F(ReplicationPlanTest, FoldAnswers_AFailedWorkersReplicasAreUnknown_NamedInFailures) {
  const auto batches = GroupByWorker(state_, {Write(1, "a", 1)}, 1);
  const Delivery d = FoldAnswers(batches, {absl::OkStatus(), absl::UnavailableError("gone")},
                                 absl::OkStatus(), /*prepared=*/5);
  const VariableRecord& a = *state_.FindId(1);
  const std::vector<Holder> held = LiveHolders(state_, a, d.acknowledged);
  ASSERT_EQ(held.size(), 2u);  // tpu_worker:0's two replicas
  EXPECT_EQ(held[0].replica, 0);
  EXPECT_EQ(held[1].replica, 1);
  EXPECT_EQ(held[1].incarnation, 100u);
  const std::vector<Holder> unknown = LiveHolders(state_, a, d.unanswered);
  ASSERT_EQ(unknown.size(), 1u);  // tpu_worker:1's
  EXPECT_EQ(unknown[0].replica, 2);
  EXPECT_EQ(unknown[0].incarnation, 101u);
  ASSERT_EQ(d.failures.size(), 1u);
  EXPECT_NE(d.failures[0].find("tpu_worker:1"), std::string::npos);
  EXPECT_EQ(d.prepared, 5u);
  const Delivery log_failed =
      FoldAnswers(batches, {absl::OkStatus(), absl::OkStatus()}, absl::DataLossError("sync"), 5);
  ASSERT_EQ(log_failed.failures.size(), 1u) << "a failed sync of the WritePrepared fails it";
}

// C2: every live replica acknowledged: one commit with its holders and the
// request's answer. Otherwise no new version: what took it is STALE, the
// variable flagged for resync, the answer not recorded.
TEST_F(ReplicationPlanTest, SettleWrites_DeliveredCommits_UndeliveredMarksStaleAndFlags) {
  const std::vector<PlannedWrite> writes = {Write(1, "a", 1)};
  const auto batches = GroupByWorker(state_, writes, 1);
  const RequestRecorded outcome{RequestKey{"r", 1}, "assign", {}, absl::UnixEpoch()};
  const Record ok = SettleWrites(
      state_, writes,
      FoldAnswers(batches, {absl::OkStatus(), absl::OkStatus()}, absl::OkStatus(), 0), {}, outcome);
  ASSERT_EQ(ok.changes.size(), 2u);
  // Every replica took it: "all but none", whatever the replicas.
  EXPECT_TRUE(std::get<ValueCommitted>(ok.changes[0]).holders.all_but);
  EXPECT_TRUE(std::get<ValueCommitted>(ok.changes[0]).holders.missing.empty());
  EXPECT_TRUE(std::holds_alternative<RequestRecorded>(ok.changes[1]));

  const Record failed = SettleWrites(
      state_, writes,
      FoldAnswers(batches, {absl::OkStatus(), absl::UnavailableError("x")}, absl::OkStatus(), 9),
      {}, outcome);
  ASSERT_EQ(failed.changes.size(), 3u);
  EXPECT_EQ(std::get<ReplicasWritten>(failed.changes[0]).holders.listed.size(), 2u);
  EXPECT_TRUE(std::get<ResyncFlagged>(failed.changes[1]).needs_resync);
  EXPECT_EQ(std::get<WriteResolved>(failed.changes[2]).fence, 9u);
  for (const Change& c : failed.changes) EXPECT_FALSE(std::holds_alternative<RequestRecorded>(c));
}

// An acknowledgement from a worker declared dead since is not recorded.
TEST_F(ReplicationPlanTest, SettleWrites_HoldersDeclaredDeadSinceAreDropped) {
  const std::vector<PlannedWrite> writes = {Write(1, "a", 1)};
  const auto batches = GroupByWorker(state_, writes, 1);
  const Delivery d =
      FoldAnswers(batches, {absl::OkStatus(), absl::OkStatus()}, absl::OkStatus(), 0);
  state_.Apply(Record{{WorkerDied{TaskKey{"tpu_worker", 1}, 101}}});
  const Record r = SettleWrites(state_, writes, d, {}, std::nullopt);
  ASSERT_EQ(r.changes.size(), 1u);
  const Holders& h = std::get<ValueCommitted>(r.changes[0]).holders;
  ASSERT_TRUE(h.all_but);
  ASSERT_EQ(h.missing.size(), 1u);
  EXPECT_EQ(state_.FindId(1)->placement[static_cast<size_t>(h.missing[0])].task,
            (TaskKey{"tpu_worker", 1}));
}

// Each variable's missing replicas are its own placement's, however many
// variables one write settles.
TEST_F(ReplicationPlanTest, SettleWrites_EachVariableMissesItsOwnReplicas) {
  const std::vector<PlannedWrite> writes = {Write(1, "a", 1), Write(2, "b", 2), Write(3, "c", 3)};
  const auto batches = GroupByWorker(state_, writes, 1);
  const Delivery d = FoldAnswers(batches, {absl::OkStatus(), absl::OkStatus(), absl::OkStatus()},
                                 absl::OkStatus(), 0);
  state_.Apply(Record{{WorkerDied{TaskKey{"tpu_worker", 1}, 101}}});
  const Record r = SettleWrites(state_, writes, d, {}, std::nullopt);
  ASSERT_EQ(r.changes.size(), 3u);
  EXPECT_EQ(std::get<ValueCommitted>(r.changes[0]).holders.missing, (std::vector<int32_t>{2}));
  EXPECT_EQ(std::get<ValueCommitted>(r.changes[1]).holders.missing, (std::vector<int32_t>{1}));
  EXPECT_TRUE(std::get<ValueCommitted>(r.changes[2]).holders.missing.empty());
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// ClusterState::Apply, change by change: what each record does to workers,
// variables and replica states, and that a record contradicting the state
// crashes rather than corrupting it.
#include "server/core/cluster_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar::server {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::StatusIs;

DeviceName Tpu(int task, int id) {
  return *DeviceName::Parse(
      absl::StrCat("/job:tpu_worker/replica:0/task:", task, "/device:TPU:", id));
}

// Records built field by field (GCC 12 misreads nested aggregate braces).
Change Registered(int task, uint64_t incarnation) {
  WorkerRegistered w;
  w.task = TaskKey{"tpu_worker", task};
  w.address = absl::StrCat("h", task);
  w.incarnation = incarnation;
  w.devices = {Tpu(task, 0)};
  return w;
}
Change Died(int task, uint64_t incarnation) {
  WorkerDied d;
  d.task = TaskKey{"tpu_worker", task};
  d.incarnation = incarnation;
  return d;
}
Change Request(const std::string& id, uint64_t digest, absl::Time at) {
  RequestRecorded r;
  r.key.id = id;
  r.key.digest = digest;
  r.op = "delete";
  r.at = at;
  return r;
}

class ClusterStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int t : {0, 1}) {
      state_.Apply(Record{{Registered(t, Inc(t))}});
    }
    VariableDef def;
    def.name = "w";
    def.tensor = TensorSpec{DType::kFloat32, {2}};
    def.replica_count = 2;
    state_.Apply({{VariableCreated{
        1,
        def,
        {Placement{Tpu(0, 0), {"tpu_worker", 0}}, Placement{Tpu(1, 0), {"tpu_worker", 1}}},
        {}}}});
  }
  static uint64_t Inc(int task) { return 100 + task; }
  ReplicaState StateOf(int replica) {
    return state_.FindId(1)->StateOf(static_cast<size_t>(replica));
  }
  void Commit(int64_t version, std::shared_ptr<const Tensor> v, std::vector<Holder> holders) {
    state_.Apply({{ValueCommitted{1, version, v->checksum, v, std::move(holders), {}}}});
  }

  ClusterState state_{ClusterStateOptions{3, absl::Minutes(1)}};
};

TEST_F(ClusterStateTest, Registration_BumpsTheVersionOncePerRecord) {
  EXPECT_EQ(state_.topology_version(), 2);
  auto topo = state_.Topology({{"tpu_worker", 3}});
  EXPECT_EQ(topo.tasks.size(), 2u);
  EXPECT_EQ(topo.missing_tasks, (std::vector<std::string>{"tpu_worker:2"}));
  EXPECT_EQ(topo.infeed_host->task, (TaskKey{"tpu_worker", 0}));
  state_.Apply(Record{{Died(0, Inc(0)), Died(1, Inc(1))}});
  EXPECT_EQ(state_.topology_version(), 3);
  EXPECT_TRUE(state_.Topology({}).tasks.empty());
}

TEST_F(ClusterStateTest, ValueCommitted_HoldersUpToDateOthersStale) {
  EXPECT_EQ(StateOf(0), ReplicaState::kUninitialized);
  Commit(1, F32({1, 2}), {{0, Inc(0)}});
  EXPECT_EQ(StateOf(0), ReplicaState::kUpToDate);
  EXPECT_EQ(StateOf(1), ReplicaState::kStale);
  auto v = F32({1, 2});
  state_.Apply({{ReplicasWritten{1, 1, v->checksum, {{1, Inc(1)}}}}});  // a resync
  EXPECT_EQ(StateOf(1), ReplicaState::kUpToDate);
  // A failed write: replica 0 got version 2, which never committed.
  state_.Apply({{ReplicasWritten{1, 2, 12345, {{0, Inc(0)}}}, ResyncFlagged{1, true}}});
  EXPECT_EQ(StateOf(0), ReplicaState::kStale);
  EXPECT_TRUE(state_.FindId(1)->needs_resync);
  EXPECT_EQ(state_.FindId(1)->version, 1);
}

// F2/F7: a returning worker's replicas are unverified until it is fenced
// off and listed, whichever process returns.
TEST_F(ClusterStateTest, WorkerDeathAndReturn_EveryReplicaStaleUntilVerified) {
  Commit(1, F32({1, 2}), {{0, Inc(0)}, {1, Inc(1)}});
  state_.Apply(Record{{Died(0, Inc(0)), Died(1, Inc(1))}});
  EXPECT_EQ(StateOf(0), ReplicaState::kUnavailable);
  EXPECT_EQ(StateOf(1), ReplicaState::kUnavailable);
  state_.Apply(Record{{Registered(0, Inc(0))}});
  state_.Apply(Record{{Registered(1, 999)}});
  EXPECT_EQ(StateOf(0), ReplicaState::kStale);
  EXPECT_EQ(StateOf(1), ReplicaState::kStale);
}

// The shape the simulator found (seed 1781): replica 0 acknowledged an
// uncommitted (v2, A) of a write that failed elsewhere; a later write B
// was sent to it but not answered (its worker paused), then declared dead;
// the retry of A committed (v2, A) on replica 1 alone. B may have landed
// on replica 0 meanwhile: when the same process returns, the record's
// (v2, A) for replica 0 proves nothing.
TEST_F(ClusterStateTest, F7_SameProcessReturns_AfterAnUnansweredWrite_NotUpToDate) {
  Commit(1, F32({1, 2}), {{0, Inc(0)}, {1, Inc(1)}});
  const auto a = F32({3, 4});
  state_.Apply({{ReplicasWritten{1, 2, a->checksum, {{0, Inc(0)}}}, ResyncFlagged{1, true}}});
  state_.Apply(Record{{Died(0, Inc(0))}});
  Commit(2, a, {{1, Inc(1)}});
  state_.Apply(Record{{Registered(0, Inc(0))}});
  EXPECT_EQ(StateOf(0), ReplicaState::kStale);
  EXPECT_EQ(StateOf(1), ReplicaState::kUpToDate);
}

// Replica state as exceptions (docs/architecture.md "Replica state"): a
// step in which every replica took the value leaves nothing per replica; one
// that sat out is the only exception, and returns to the norm when it
// takes the value again.
TEST_F(ClusterStateTest, ReplicaState_OnlyExceptionsAreKept_AStepOfAllKeepsNone) {
  EXPECT_TRUE(state_.FindId(1)->exceptions.empty());  // UNINITIALIZED is the norm
  Commit(1, F32({1, 2}), {{0, Inc(0)}, {1, Inc(1)}});
  EXPECT_TRUE(state_.FindId(1)->exceptions.empty());
  EXPECT_EQ(state_.Replica(*state_.FindId(1), 1),
            (ReplicaRecord{ReplicaState::kUpToDate, 1, F32({1, 2})->checksum, Inc(1)}));

  state_.Apply({{ValueCommitted{1, 2, 77, nullptr, Holders::AllBut({1}), {}}}});
  const VariableRecord& v = *state_.FindId(1);
  EXPECT_EQ(v.exceptions.size(), 1u);
  EXPECT_EQ(StateOf(0), ReplicaState::kUpToDate);
  EXPECT_EQ(state_.Replica(v, 1),
            (ReplicaRecord{ReplicaState::kStale, 1, F32({1, 2})->checksum, Inc(1)}));
  EXPECT_EQ(state_.needing_repair(), (std::set<uint64_t>{1}));

  state_.Apply({{ReplicasWritten{1, 2, 77, Holders::AllBut({})}}});  // a repair in a step
  EXPECT_TRUE(state_.FindId(1)->exceptions.empty());
  EXPECT_EQ(StateOf(1), ReplicaState::kUpToDate);
  EXPECT_TRUE(state_.needing_repair().empty());
}

// A step's every-replica form names a dead worker's replica among those
// that take the value: a bug in the record's builder, caught.
TEST_F(ClusterStateTest, ReplicaState_AllButThatIncludesADeadWorker_Crashes) {
  Commit(1, F32({1, 2}), {{0, Inc(0)}, {1, Inc(1)}});
  state_.Apply(Record{{Died(1, Inc(1))}});
  EXPECT_DEATH(state_.Apply({{ValueCommitted{1, 2, 77, nullptr, Holders::AllBut({}), {}}}}),
               "w/1 from a worker that is not live");
  state_.Apply({{ValueCommitted{1, 2, 77, nullptr, Holders::AllBut({1}), {}}}});
  EXPECT_EQ(StateOf(1), ReplicaState::kUnavailable);
}

// A checkpoint written before exceptions lists every replica: restored, the
// replicas at the norm are dropped and the state is the same.
TEST_F(ClusterStateTest, ReplicaState_RestoreOfEveryReplica_KeepsOnlyExceptions) {
  Commit(1, F32({1, 2}), {{0, Inc(0)}});
  ClusterStateData data;
  data.next_variable_id = 2;
  for (const auto& [key, w] : state_.workers()) data.workers.emplace(key, w);
  VariableRecord v = *state_.FindId(1);
  for (size_t i = 0; i < v.replica_count(); ++i) {
    v.exceptions[static_cast<int32_t>(i)] = state_.Replica(*state_.FindId(1), i);
  }
  data.variables.emplace(1, v);
  ClusterState restored;
  ASSERT_OK(restored.Restore(std::move(data)));
  EXPECT_EQ(restored.FindId(1)->exceptions.size(), 1u);
  EXPECT_EQ(restored.Replica(*restored.FindId(1), 1).state, ReplicaState::kStale);
  EXPECT_EQ(restored.Replica(*restored.FindId(1), 0), state_.Replica(*state_.FindId(1), 0));
}

// C6 with its bound: an answer is kept for the whole window, whatever
// the traffic; at the capacity a new id is refused before anything runs.
TEST_F(ClusterStateTest, C6_Outcomes_NeverForgottenInsideTheWindow_NewIdsRefusedAtCapacity) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) {
    ASSERT_FALSE(state_.Outcome({absl::StrCat("r", i), 7}, "delete", t0)->has_value());
    state_.Apply(Record{{Request(absl::StrCat("r", i), 7, t0)}});
  }
  // Full (capacity 3): a new id is refused, the old answers all still there.
  EXPECT_THAT(state_.Outcome({"r3", 7}, "delete", t0 + absl::Seconds(10)),
              StatusIs(absl::StatusCode::kResourceExhausted, "refused for 50s"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(state_.Outcome({absl::StrCat("r", i), 7}, "delete", t0)->has_value()) << i;
  }
  // Requests without an id need no room; a retry of a kept one gets its answer.
  EXPECT_FALSE(state_.Outcome({"", 7}, "delete", t0)->has_value());
  EXPECT_TRUE(state_.Outcome({"r0", 7}, "delete", t0 + absl::Seconds(10))->has_value());
  EXPECT_THAT(state_.Outcome({"r0", 8}, "delete", t0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(state_.Outcome({"r0", 7}, "assign", t0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Past the window (1 minute) they age out and make room.
  const absl::Time later = t0 + absl::Minutes(2);
  EXPECT_FALSE(state_.Outcome({"r0", 7}, "delete", later)->has_value());
  EXPECT_FALSE(state_.Outcome({"r3", 7}, "delete", later)->has_value());
  state_.Apply(Record{{Request("r3", 7, later)}});
  EXPECT_TRUE(state_.Outcome({"r3", 7}, "delete", later)->has_value());
}

TEST_F(ClusterStateTest, Dump_SameRecordsSameDump) {
  ClusterState other{ClusterStateOptions{3, absl::Minutes(1)}};
  EXPECT_NE(other.Dump(), state_.Dump());
}

TEST_F(ClusterStateTest, StepIds_Increase) {
  state_.Apply(Record{{StepBegun{1, 1}, StepCommitted{1, 1}}});
  state_.Apply(Record{{StepBegun{2, 2}, StepFailed{2, 2}}});
  EXPECT_EQ(state_.last_committed_step(), 1);
  EXPECT_EQ(state_.last_epoch(), 2u);
}

// The repair pass reads needing_repair() instead of scanning every variable:
// after every change of a long seeded run of commits, partial writes, resync
// flags, deaths, returns (same and new process), creates and deletes, it is
// exactly the variables flagged for resync or holding a STALE replica; and a
// state restored from a checkpoint of it files the same ones.
TEST(ClusterStateRepairIndexTest, NeedingRepair_AfterEveryChange_IsTheFlaggedAndStaleVariables) {
  constexpr int kWorkers = 3;
  ClusterState state;
  std::vector<uint64_t> incarnation(kWorkers);
  std::vector<bool> live(kWorkers, true);
  for (int t = 0; t < kWorkers; ++t) {
    incarnation[t] = 100 + t;
    state.Apply(Record{{Registered(t, incarnation[t])}});
  }
  uint64_t next_id = 1;
  auto create = [&] {
    VariableDef def;
    def.name = absl::StrCat("v", next_id);
    def.tensor = TensorSpec{DType::kFloat32, {2}};
    def.replica_count = kWorkers;
    std::vector<Placement> placement;
    for (int t = 0; t < kWorkers; ++t) {
      placement.push_back(Placement{Tpu(t, 0), {"tpu_worker", t}});
    }
    state.Apply({{VariableCreated{next_id++, def, placement, {}}}});
  };
  for (int i = 0; i < 6; ++i) create();
  auto brute_force = [&] {
    std::set<uint64_t> out;
    for (const auto& [id, v] : state.variables()) {
      bool needs = v.needs_resync;
      for (size_t i = 0; i < v.replica_count(); ++i) {
        needs = needs || state.Replica(v, i).state == ReplicaState::kStale;
      }
      if (needs) out.insert(id);
    }
    return out;
  };
  std::mt19937 rng(20261205);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  size_t most = 0;
  int emptied = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<uint64_t> ids;
    for (const auto& [id, v] : state.variables()) ids.push_back(id);
    const uint64_t id = ids[pick(ids.size())];
    const VariableRecord& v = *state.FindId(id);
    std::vector<Holder> holders;  // a random subset of the live replicas
    for (int t = 0; t < kWorkers; ++t) {
      if (live[t] && pick(3) != 0) holders.push_back(Holder{t, incarnation[t]});
    }
    const bool all_live = std::count(live.begin(), live.end(), true) == kWorkers;
    switch (pick(9)) {
      case 0:
      case 1: {  // a write commits on the holders; the others miss it
        auto value = F32({static_cast<float>(round), 1});
        state.Apply({{ValueCommitted{id, v.version + 1, value->checksum, value, holders, {}}}});
        break;
      }
      case 2:  // a resync of the holders to the committed value
        if (v.version > 0) state.Apply({{ReplicasWritten{id, v.version, v.checksum, holders}}});
        break;
      case 3:  // a failed write left the holders ahead of the committed value
        state.Apply({{ReplicasWritten{id, v.version + 1, 777, holders}, ResyncFlagged{id, true}}});
        break;
      case 4:
        state.Apply({{ResyncFlagged{id, false}}});
        break;
      case 5: {  // a worker dies, or one comes back (the same process or a new one)
        const int t = static_cast<int>(pick(kWorkers));
        if (live[t]) {
          state.Apply(Record{{Died(t, incarnation[t])}});
        } else {
          if (pick(2) == 0) incarnation[t] += 10;
          state.Apply(Record{{Registered(t, incarnation[t])}});
        }
        live[t] = !live[t];
        break;
      }
      case 6:
        if (ids.size() > 2) state.Apply({{VariableDeleted{id}}});
        break;
      default:
        if (all_live && ids.size() < 12) create();
        break;
    }
    const std::set<uint64_t> want = brute_force();
    ASSERT_EQ(state.needing_repair(), want) << "after round " << round;
    most = std::max(most, want.size());
    emptied += want.empty() ? 1 : 0;
  }
  // Not vacuous: variables came into the index and left it again.
  EXPECT_GE(most, 4u);
  EXPECT_GT(emptied, 0);

  state.Apply({{ResyncFlagged{state.variables().begin()->first, true}}});
  ASSERT_FALSE(state.needing_repair().empty());
  ClusterStateData data;
  data.variables = state.variables();
  data.next_variable_id = state.next_variable_id();
  data.workers = state.workers();
  ClusterState restored;
  ASSERT_OK(restored.Restore(std::move(data)));
  EXPECT_EQ(restored.needing_repair(), state.needing_repair());
}

// A checkpoint that contradicts itself is refused, and nothing of it is
// taken: here a prepared write without its value, found after the
// variables were read.
TEST_F(ClusterStateTest, Restore_PreparedWriteWithoutItsValue_DataLossNothingTaken) {
  ClusterStateData data;
  data.variables = state_.variables();
  data.next_variable_id = state_.next_variable_id();
  data.workers = state_.workers();
  WritePrepared p;
  p.fence = 9;
  p.values.push_back(PreparedValue{1, 1, 1234, nullptr});
  data.prepared.push_back(p);
  ClusterState restored;
  EXPECT_THAT(restored.Restore(std::move(data)),
              StatusIs(absl::StatusCode::kDataLoss, "lacks the value of variable id 1"));
  EXPECT_TRUE(restored.variables().empty());
  EXPECT_EQ(restored.FindId(1), nullptr);
  EXPECT_EQ(restored.Find("w"), nullptr);
  EXPECT_TRUE(restored.workers().empty());
}

using ClusterStateDeathTest = ClusterStateTest;

TEST_F(ClusterStateDeathTest, ContradictingRecords_Crash) {
  auto v = F32({1, 2});
  EXPECT_DEATH(state_.Apply({{ValueCommitted{7, 1, v->checksum, v, {}, {}}}}),
               "ValueCommitted names variable id 7, which does not exist");
  Commit(1, v, {});
  EXPECT_DEATH(Commit(1, v, {}), "from version 1 to 1");
  state_.Apply(Record{{Died(1, Inc(1))}});
  EXPECT_DEATH(state_.Apply({{ReplicasWritten{1, 1, v->checksum, {{1, Inc(1)}}}}}),
               "a worker that is not live");
  EXPECT_DEATH(state_.Apply({{StepBegun{1, 0}}}), "reuses epoch 0");
}

}  // namespace
}  // namespace repvar::server

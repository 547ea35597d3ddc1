// SPDX-License-Identifier: Apache-2.0
// Replicated steps (S1-S5) against the coordinator core: beginning a step,
// reports, the barrier's resolution and its waiters. Reads, writes beside
// steps and restarts are in step_coordinator_writes_test.cc.
#include <tuple>

#include "common/rpc/to_proto.h"
#include "tests/server/core/step_core_fixture.h"

namespace repvar::server {
namespace {

TEST_F(StepCoreTest, S1_BeginStep_IdempotentFixesParticipantsAndIdsIncrease) {
  uint64_t w = Create("w", Aggregation::kMean);
  auto s1 = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s1);
  ASSERT_EQ(s1->participants.size(), 3u);  // the CPU host holds no replica
  EXPECT_EQ(s1->participants[2].task.ToString(), "tpu_worker:2");
  ASSERT_EQ(s1->variables.size(), 1u);
  EXPECT_EQ(s1->variables[0].id, w);
  EXPECT_EQ(s1->variables[0].replica_participant, (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  auto again = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(again);
  EXPECT_EQ(again->epoch, s1->epoch);
  EXPECT_THAT(testing::BeginStep(core_, 2, absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 (epoch"));
  EXPECT_THAT(testing::BeginStep(core_, 3, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));

  ASSERT_OK(core_.AbortStep(s1->epoch, "test"));
  auto reopened = testing::BeginStep(core_, 1, absl::Seconds(10));  // an aborted id may be reused
  ASSERT_OK(reopened);
  EXPECT_GT(reopened->epoch, s1->epoch);
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.ReportStep(Report(*reopened, t)));
  EXPECT_EQ(Resolution(reopened->epoch).state, StepState::kCommitted);
  EXPECT_THAT(testing::BeginStep(core_, 1, absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not above"));
  EXPECT_OK(testing::BeginStep(core_, 7, absl::Seconds(10)));
}

TEST_F(StepCoreTest, S1_BeginStep_WaitsForCrossReplicaWritesInFlight) {
  uint64_t w = Create("w", Aggregation::kMean);
  Create("probe", Aggregation::kMean);
  workers_.HoldWritesOf(w);
  absl::StatusOr<WriteResult> assigned;
  std::thread writer([&] { assigned = core_.Assign({}, {"w", AssignOp::kAssign, F32({3, 4})}); });
  while (workers_.parked() == 0) std::this_thread::yield();  // the write is in flight
  absl::Notification begun;
  absl::StatusOr<StepInfo> step;
  std::thread beginner([&] {
    step = testing::BeginStep(core_, 1, absl::Seconds(10));
    begun.Notify();
  });
  // Once BeginStep waits, new cross-replica writes are refused.
  while (true) {
    absl::Status s = core_.Assign({}, {"probe", AssignOp::kAssign, F32({5, 6})}).status();
    if (absl::IsFailedPrecondition(s)) break;
    std::this_thread::yield();
  }
  EXPECT_FALSE(begun.HasBeenNotified());  // still waiting for the write in flight
  workers_.ReleaseWrites();
  writer.join();
  beginner.join();
  ASSERT_OK(assigned);
  ASSERT_OK(step);
  EXPECT_EQ(step->begin[0].version, 2);  // the step starts after the write
  EXPECT_EQ(step->begin[0].checksum, F32({3, 4})->checksum);
}

// A consistent cut (checkpoints): a hold waits for the open step to
// resolve (or gives up at its deadline, holding nothing); while held,
// cross-replica writes and new steps wait instead of being refused, and go
// on when it is released.
TEST_F(StepCoreTest, Cut_HoldWrites_WaitsForTheOpenStep_ThenHoldsWritesAndNewSteps) {
  Create("w", Aggregation::kMean);
  auto step = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(step);
  EXPECT_THAT(core_.HoldWrites(absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "step 1 is still open"));
  ASSERT_OK(core_.AbortStep(step->epoch, "test"));  // nothing was held: it resolves as usual

  {
    auto hold = core_.HoldWrites(absl::InfiniteFuture());
    ASSERT_OK(hold);
    absl::Notification written;
    absl::StatusOr<WriteResult> assigned;
    std::thread writer([&] {
      assigned = core_.Assign({}, {"w", AssignOp::kAssign, F32({3, 4})});
      written.Notify();
    });
    for (int i = 0; i < 1000; ++i) std::this_thread::yield();
    EXPECT_FALSE(written.HasBeenNotified()) << "a write went through a hold";
    auto value = core_.Read("w");  // reads are not held
    ASSERT_OK(value);
    EXPECT_EQ(value->version, 1);
    { Coordinator::WriteHold released = *std::move(hold); }
    writer.join();
    ASSERT_OK(assigned);  // held, not refused
    EXPECT_EQ(assigned->version, 2);
  }
  auto hold = core_.HoldWrites(absl::InfiniteFuture());
  ASSERT_OK(hold);
  absl::Notification begun;
  absl::StatusOr<StepInfo> next;
  std::thread beginner([&] {
    next = testing::BeginStep(core_, 2, absl::Seconds(10));
    begun.Notify();
  });
  for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  EXPECT_FALSE(begun.HasBeenNotified()) << "a step began during a hold";
  { Coordinator::WriteHold released = *std::move(hold); }
  beginner.join();
  ASSERT_OK(next);
  EXPECT_EQ(next->step, 2);
}

TEST_F(StepCoreTest, F2_StaleReplicaOnALiveWorker_SitsTheStepOut_ThenIsRepaired) {
  uint64_t w = Create("w", Aggregation::kMean);
  // A step first: the steps below begin with its layout kept, and must show
  // what the write and the repair changed in the replicas all the same.
  auto first = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(first);
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.ReportStep(Report(*first, t)));
  ASSERT_EQ(Resolution(first->epoch).state, StepState::kCommitted);
  // A cross-replica write that does not reach tpu_worker:1 leaves the others
  // at the new version and the variable marked for resync.
  workers_.Fail("tpu_worker:1", absl::UnavailableError("down for a moment"));
  EXPECT_THAT(core_.Assign({}, {"w", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  workers_.Heal("tpu_worker:1");
  auto view = core_.GetVariable("w");
  EXPECT_TRUE(view->needs_resync);
  // tpu_worker:1 did not answer, so what it holds is unknown (STALE) until
  // repair asks it; the others cannot be asked this time.
  EXPECT_EQ(view->replicas[2].state, ReplicaState::kStale);
  workers_.Fail("tpu_worker:0", absl::UnavailableError("busy"));
  workers_.Fail("tpu_worker:2", absl::UnavailableError("busy"));
  core_.ResyncStale();
  workers_.Heal("tpu_worker:0");
  workers_.Heal("tpu_worker:2");
  view = core_.GetVariable("w");
  EXPECT_EQ(view->replicas[2].state, ReplicaState::kUpToDate);  // it holds version 1
  EXPECT_EQ(view->replicas[0].state, ReplicaState::kStale);
  EXPECT_TRUE(view->needs_resync);
  auto s = testing::BeginStep(core_, 2, absl::Seconds(10));
  ASSERT_OK(s);
  // Committed is still version 1: the replicas that got version 2 sit out.
  EXPECT_EQ(s->participants.size(), 1u);  // only tpu_worker:1 holds the committed value
  EXPECT_EQ(s->variables[0].replica_participant, (std::vector<int32_t>{-1, -1, 0, 0, -1, -1}));
  // The hosts whose replicas sit out are named: their trainers are refused
  // at begin rather than told COMMITTED for writes that count for nothing.
  EXPECT_EQ(s->sitting_out, (std::vector<TaskKey>{{"tpu_worker", 0}, {"tpu_worker", 2}}));
  ASSERT_OK(core_.AbortStep(s->epoch, "test"));
  core_.ResyncStale();
  view = core_.GetVariable("w");
  EXPECT_FALSE(view->needs_resync);
  for (const ReplicaView& r : view->replicas) EXPECT_EQ(r.state, ReplicaState::kUpToDate);
  EXPECT_EQ(workers_.Get("tpu_worker:0", w, 0)->version, 1);  // rewritten to the committed one
  auto again = testing::BeginStep(core_, 2, absl::Seconds(10));
  ASSERT_OK(again);
  EXPECT_EQ(again->variables[0].replica_participant, (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
}

// Each step's layout is the state's at its begin, although a step begun
// when no worker, variable or replica state changed since the last shares
// that layout rather than building it again: a new variable, a step that
// changed a value, a variable initialized after a step and a worker's death
// each show in the next step.
TEST_F(StepCoreTest, S1_EachStepDescribesTheStateAtItsBegin_WhatChangedBetweenStepsShows) {
  uint64_t w = Create("w", Aggregation::kNone);
  auto reported_step = [&](int64_t step) {
    auto s = testing::BeginStep(core_, step, absl::Seconds(10));
    EXPECT_OK(s);
    if (!s.ok()) return StepInfo{};
    for (int t = 0; t < 3; ++t) EXPECT_OK(core_.ReportStep(Report(*s, t)));
    EXPECT_EQ(Resolution(s->epoch).state, StepState::kCommitted);
    return *s;
  };
  const StepInfo s1 = reported_step(1);
  const StepInfo s2 = reported_step(2);  // nothing changed: the same layout
  EXPECT_EQ(s2.step, 2);
  EXPECT_EQ(s2.layout_id, s1.layout_id);
  ASSERT_EQ(s2.variables.size(), 1u);
  EXPECT_EQ(s2.begin[0].version, s1.begin[0].version);
  // Shared, not copied: a step's begin costs no work per variable then.
  EXPECT_TRUE(s2.variables.SharesWith(s1.variables));
  EXPECT_TRUE(s2.begin.SharesWith(s1.begin));

  uint64_t v = Create("v", Aggregation::kNone);  // created and initialized
  const StepInfo s3 = reported_step(3);
  EXPECT_NE(s3.layout_id, s2.layout_id);
  ASSERT_EQ(s3.variables.size(), 2u);
  EXPECT_EQ(s3.variables[1].id, v);
  EXPECT_FALSE(s3.variables.SharesWith(s2.variables));

  StepInfo s4;
  CommitAgreedStep(w, 4, *F32({5, 6}), &s4);  // w moves to a new version
  const StepInfo s5 = reported_step(5);
  EXPECT_EQ(s5.layout_id, s4.layout_id);  // begin versions are not part of it
  EXPECT_EQ(s5.begin[0].version, s4.begin[0].version + 1);
  EXPECT_EQ(s5.begin[0].checksum, F32({5, 6})->checksum);
  EXPECT_EQ(s5.begin[1].version, s4.begin[1].version);
  // Only values moved: the layout is shared, the begin versions are new.
  EXPECT_TRUE(s5.variables.SharesWith(s4.variables));
  EXPECT_FALSE(s5.begin.SharesWith(s4.begin));

  // Created, then initialized after a step: only then does it join one.
  VariableDef u;
  u.name = "u";
  u.tensor = TensorSpec{DType::kFloat32, {2}};
  u.replica_count = 6;
  u.aggregation = Aggregation::kMean;
  ASSERT_OK(core_.CreateVariables({}, {{u, Initializer{.kind = InitializerKind::kZeros}}}));
  EXPECT_EQ(reported_step(6).variables.size(), 2u);
  ASSERT_OK(core_.Initialize({}, {{"u", std::nullopt}}));
  const StepInfo s7 = reported_step(7);
  ASSERT_EQ(s7.variables.size(), 3u);
  EXPECT_EQ(s7.variables[2].name, "u");

  DeclareTpuWorker2Dead();
  auto s8 = testing::BeginStep(core_, 8, absl::Seconds(10));
  ASSERT_OK(s8);
  EXPECT_EQ(s8->participants.size(), 2u);
  EXPECT_EQ(s8->variables[0].replica_participant, (std::vector<int32_t>{0, 0, 1, 1, -1, -1}));
}

TEST_F(StepCoreTest, S1_DeadWorkersReplicasSitTheStepOut) {
  Create("w", Aggregation::kMean);
  DeclareTpuWorker2Dead();
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  EXPECT_EQ(s->participants.size(), 2u);
  EXPECT_EQ(s->variables[0].replica_participant, (std::vector<int32_t>{0, 0, 1, 1, -1, -1}));
}

// C8: a heartbeat confirms a held value only when it is the committed value
// of an up-to-date replica of that worker's.
TEST_F(StepCoreTest, C8_Heartbeat_ConfirmsOnlyCommittedValuesOfItsOwnUpToDateReplicas) {
  const uint64_t id = Create("w", Aggregation::kMean);
  auto ack = core_.Assign({}, {"w", AssignOp::kAssign, F32({3, 4})});
  ASSERT_OK(ack);
  auto info = core_.GetVariable("w");
  ASSERT_OK(info);
  const uint64_t sum = info->checksum;
  // Replicas 0 and 1 are on tpu_worker:0, 2 and 3 on tpu_worker:1.
  auto grant = core_.Heartbeat(
      TaskKey{"tpu_worker", 0}, Inc(0), /*read_lease=*/true,
      {HeldValue{id, 0, ack->version, sum}, HeldValue{id, 0, ack->version - 1, sum},
       HeldValue{id, 0, ack->version, sum + 1}, HeldValue{id, 2, ack->version, sum},
       HeldValue{id + 100, 0, ack->version, sum}, HeldValue{id, 99, ack->version, sum}});
  ASSERT_OK(grant);
  EXPECT_EQ(grant->confirmed, (std::vector<bool>{true, false, false, false, false, false}));
  EXPECT_GT(grant->read_lease, absl::ZeroDuration());
}

// C8: a superseded process may still serve reads under its lease: a write
// that would replace what it holds commits only after that lease ends.
TEST_F(StepCoreTest, C8_WriteAfterASupersede_CommitsOnceTheOldLeaseEnded) {
  Create("w", Aggregation::kMean);
  ASSERT_OK(core_.Heartbeat(TaskKey{"worker", 0}, 5, /*read_lease=*/true));
  ASSERT_OK(core_.RegisterWorker(
      {"worker", 0, "cpu:1", 6, {"/job:worker/replica:0/task:0/device:CPU:0"}}));
  const absl::Time end = core_.registry().SupersededLeasesEnd();
  ASSERT_GT(end, clock_.Now());
  ASSERT_OK(core_.Assign({}, {"w", AssignOp::kAssign, F32({3, 4})}));
  EXPECT_GE(clock_.Now(), end);  // the fake clock's sleep moved it there
}

// C8: a step that leaves a live worker's replica behind commits a value that
// replica does not get; it begins only once no read lease of that worker can
// hold, and such a worker is granted none.
TEST_F(StepCoreTest, C8_StepLeavingAWorkerBehind_WaitsOutItsReadLease) {
  Create("b", Aggregation::kMean);
  for (int t : {0, 1, 2}) {  // each serves local reads and is granted a lease
    ASSERT_OK(core_.Heartbeat(TaskKey{"tpu_worker", t}, Inc(t), /*read_lease=*/true));
  }
  // tpu_worker:1 does not answer: the write fails, and every replica it
  // reached (tpu_worker:0 and :2) or may have is not up to date.
  workers_.Fail("tpu_worker:1", absl::UnavailableError("down for a moment"));
  EXPECT_THAT(core_.Assign({}, {"b", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(testing::BeginStep(core_, 1, absl::Seconds(10)),
              StatusIs(absl::StatusCode::kUnavailable));
  auto grant = core_.Heartbeat(TaskKey{"tpu_worker", 1}, Inc(1), true);
  ASSERT_OK(grant);
  EXPECT_EQ(grant->read_lease, absl::ZeroDuration());
  auto clean = core_.Heartbeat(TaskKey{"worker", 0}, 5, true);  // holds no replica
  ASSERT_OK(clean);
  EXPECT_GT(clean->read_lease, absl::ZeroDuration());
  clock_.Advance(absl::Seconds(4));
  ASSERT_OK(testing::BeginStep(core_, 1, absl::Seconds(10)));
}

// A delete whose drop did not reach a holder that serves local reads is
// answered only once that holder's lease cannot hold, and the holder gets
// no new lease until the drop, tried again by repair, reaches it.
TEST_F(StepCoreTest, C8_DeleteThatMissedAHolder_WaitsOutItsLease_NoLeaseUntilDropped) {
  uint64_t id = Create("d", Aggregation::kMean);
  auto granted = core_.Heartbeat(TaskKey{"tpu_worker", 1}, Inc(1), /*read_lease=*/true);
  ASSERT_OK(granted);
  ASSERT_GT(granted->read_lease, absl::ZeroDuration());
  const absl::Time lease_end = core_.registry().LeaseHeldUntil({TaskKey{"tpu_worker", 1}});
  workers_.Fail("tpu_worker:1", absl::UnavailableError("down for a moment"));
  ASSERT_OK(core_.DeleteVariable({}, "d"));
  EXPECT_GE(clock_.Now(), lease_end);  // the fake clock's sleep moved it there
  auto barred = core_.Heartbeat(TaskKey{"tpu_worker", 1}, Inc(1), true);
  ASSERT_OK(barred);
  EXPECT_EQ(barred->read_lease, absl::ZeroDuration());
  auto others = core_.Heartbeat(TaskKey{"tpu_worker", 0}, Inc(0), true);  // the drop reached it
  ASSERT_OK(others);
  EXPECT_GT(others->read_lease, absl::ZeroDuration());
  core_.ResyncStale();  // still down: still owed
  EXPECT_EQ(core_.Heartbeat(TaskKey{"tpu_worker", 1}, Inc(1), true)->read_lease,
            absl::ZeroDuration());
  workers_.Heal("tpu_worker:1");
  core_.ResyncStale();
  EXPECT_FALSE(workers_.Get("tpu_worker:1", id, 2).has_value());  // dropped
  EXPECT_GT(core_.Heartbeat(TaskKey{"tpu_worker", 1}, Inc(1), true)->read_lease,
            absl::ZeroDuration());
}

// Found by the simulator (seed 1939): a worker behind when the step began,
// repaired while it is open, must not get a lease before the step commits
// the value that leaves it behind again.
TEST_F(StepCoreTest, C8_WorkerRepairedDuringAStepItSitsOut_NoLeaseUntilTheStepEnds) {
  Create("b", Aggregation::kMean);
  // As in F2_StaleReplicaOnALiveWorker_...: tpu_worker:1 alone holds the
  // committed value, tpu_worker:0 and :2 sit the step out.
  workers_.Fail("tpu_worker:1", absl::UnavailableError("down for a moment"));
  EXPECT_THAT(core_.Assign({}, {"b", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  workers_.Heal("tpu_worker:1");
  workers_.Fail("tpu_worker:0", absl::UnavailableError("busy"));
  workers_.Fail("tpu_worker:2", absl::UnavailableError("busy"));
  core_.ResyncStale();
  workers_.Heal("tpu_worker:0");
  workers_.Heal("tpu_worker:2");
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  EXPECT_EQ(s->participants.size(), 1u);
  core_.ResyncStale();  // tpu_worker:0 and :2 are up to date again
  ASSERT_EQ(core_.GetVariable("b")->replicas[0].state, ReplicaState::kUpToDate);
  EXPECT_EQ(LeaseGranted(0), absl::ZeroDuration());
  EXPECT_GT(LeaseGranted(1), absl::ZeroDuration());  // takes part
  ASSERT_OK(core_.AbortStep(s->epoch, "test"));
  EXPECT_GT(LeaseGranted(0), absl::ZeroDuration());
}

// The same for a worker that registers while a step it was not live for is
// open (declared dead, then back under the same incarnation): once its
// replicas are up to date again it would serve the value the step
// replaces.
TEST_F(StepCoreTest, C8_WorkerRegisteredDuringAStep_NoLeaseUntilTheStepEnds) {
  Create("b", Aggregation::kMean);
  DeclareTpuWorker2Dead();
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  ASSERT_EQ(Me(*s, 2), -1);
  ASSERT_OK(core_.RegisterWorker(TpuWorker(2)));  // the same incarnation
  core_.ResyncStale();
  ASSERT_EQ(core_.GetVariable("b")->replicas[4].state, ReplicaState::kUpToDate);
  EXPECT_EQ(LeaseGranted(2), absl::ZeroDuration());
  EXPECT_GT(LeaseGranted(0), absl::ZeroDuration());  // takes part
  ASSERT_OK(core_.AbortStep(s->epoch, "test"));
  EXPECT_GT(LeaseGranted(2), absl::ZeroDuration());
}

// Variables placed alike whose replicas all take part share one replica ->
// participant list, even when created apart and when a worker is dead (what
// keeps a layout of 4,000 replicas per variable small); one whose own
// replica sits out has its own.
TEST_F(StepCoreTest, S1_VariablesPlacedAlike_ShareOneParticipantList_UnlessOwnReplicasSitOut) {
  Create("a", Aggregation::kMean);
  Create("b", Aggregation::kMean);
  DeclareTpuWorker2Dead();
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  EXPECT_EQ(s->variables[1].replica_participant, (std::vector<int32_t>{0, 0, 1, 1, -1, -1}));
  EXPECT_TRUE(s->variables[0].replica_participant.SharesWith(s->variables[1].replica_participant));
  ASSERT_OK(core_.AbortStep(s->epoch, "test"));

  workers_.Fail("tpu_worker:1", absl::UnavailableError("down for a moment"));
  EXPECT_THAT(core_.Assign({}, {"b", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  // The write reached tpu_worker:0 alone and did not commit: no replica of
  // b holds its committed value now.
  EXPECT_EQ(s->variables[1].replica_participant, (std::vector<int32_t>{-1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(s->variables[0].replica_participant, (std::vector<int32_t>{0, 0, 1, 1, -1, -1}));
  EXPECT_FALSE(s->variables[0].replica_participant.SharesWith(s->variables[1].replica_participant));
}

TEST_F(StepCoreTest, S1_JoinOpenStep_AnswersAsBeginStepWithoutWaiting_OnlyOnceOpen) {
  Create("w", Aggregation::kMean);
  EXPECT_FALSE(core_.JoinOpenStep(3, absl::Seconds(10)).has_value());  // would open it
  auto begun = testing::BeginStep(core_, 3, absl::Seconds(10));
  ASSERT_OK(begun);
  auto joined = core_.JoinOpenStep(3, absl::Seconds(10));
  ASSERT_TRUE(joined.has_value());
  ASSERT_OK(*joined);
  EXPECT_EQ((*joined)->info->epoch, begun->epoch);
  auto other = core_.JoinOpenStep(4, absl::Seconds(10));  // refused, as BeginStep is
  ASSERT_TRUE(other.has_value());
  EXPECT_THAT(other->status(), StatusIs(absl::StatusCode::kFailedPrecondition, "is open"));
  EXPECT_THAT(testing::BeginStep(core_, 4, absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is open"));
  auto no_timeout = core_.JoinOpenStep(3, absl::ZeroDuration());
  ASSERT_TRUE(no_timeout.has_value());
  EXPECT_THAT(no_timeout->status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StepCoreTest, S1_VariablesOnDifferentPlacements_EachReplicaOnItsOwnParticipant) {
  Create("a", Aggregation::kMean);  // 6 replicas: tpu_worker 0, 0, 1, 1, 2, 2
  clock_.Advance(absl::Seconds(30));
  HeartbeatAll({1, 2});
  ASSERT_OK(core_.Heartbeat(TaskKey{"worker", 0}, 5));
  core_.Tick(clock_.Now());  // tpu_worker:0 is declared dead
  // Created now, b's 2 replicas go to the first live accelerators: task 1's.
  ASSERT_NE(CreateZeroed(core_, "b", Aggregation::kMean, DType::kFloat32, /*replicas=*/2), 0u);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  ASSERT_EQ(s->participants.size(), 2u);  // tasks 1 and 2
  EXPECT_EQ(s->participants[0].task, (TaskKey{"tpu_worker", 1}));
  ASSERT_EQ(s->variables.size(), 2u);
  EXPECT_EQ(s->variables[0].replica_participant, (std::vector<int32_t>{-1, -1, 0, 0, 1, 1}));
  EXPECT_EQ(s->variables[1].replica_participant, (std::vector<int32_t>{0, 0}));
}

TEST_F(StepCoreTest, S3_OneReportPerWorker_RefusalsHaveDistinctStatuses) {
  uint64_t w = Create("w", Aggregation::kNone);
  auto s = testing::BeginStep(core_, 4, absl::Seconds(10));
  ASSERT_OK(s);
  WorkerReport good = Report(*s, 0, {{w, 0, kA, -1}, {w, 1, kA, -1}});

  WorkerReport stale = good;
  stale.incarnation = 999;
  EXPECT_THAT(core_.ReportStep(stale), StatusIs(absl::StatusCode::kAborted));
  WorkerReport not_owner = Report(*s, 0, {{w, 2, kA, -1}});
  EXPECT_THAT(core_.ReportStep(not_owner), StatusIs(absl::StatusCode::kPermissionDenied));
  WorkerReport stranger = good;
  stranger.task = TaskKey{"worker", 0};
  stranger.incarnation = 5;
  EXPECT_THAT(core_.ReportStep(stranger), StatusIs(absl::StatusCode::kPermissionDenied));
  WorkerReport future = good;
  future.step = 5;
  future.epoch = s->epoch + 1;
  EXPECT_THAT(core_.ReportStep(future), StatusIs(absl::StatusCode::kOutOfRange));
  WorkerReport closed = good;
  closed.step = 3;
  closed.epoch = s->epoch - 1;
  EXPECT_THAT(core_.ReportStep(closed), StatusIs(absl::StatusCode::kFailedPrecondition));
  WorkerReport unknown = Report(*s, 0, {{w + 100, 0, kA, -1}});
  EXPECT_THAT(core_.ReportStep(unknown), StatusIs(absl::StatusCode::kInvalidArgument));
  WorkerReport twice = Report(*s, 0);
  twice.replicas = {{w, 0, kA, -1}, {w, 0, kA, -1}};
  EXPECT_THAT(core_.ReportStep(twice), StatusIs(absl::StatusCode::kInvalidArgument));

  ASSERT_OK(core_.ReportStep(good));
  WorkerReport reordered = Report(*s, 0, {{w, 1, kA, -1}, {w, 0, kA, -1}});
  EXPECT_OK(core_.ReportStep(reordered));  // identical: idempotent
  WorkerReport different = Report(*s, 0, {{w, 0, kB, -1}, {w, 1, kA, -1}});
  EXPECT_THAT(core_.ReportStep(different), StatusIs(absl::StatusCode::kAlreadyExists));
  // Once the step resolved, its reports are refused as closed.
  for (int t = 1; t < 3; ++t) {
    ASSERT_OK(core_.ReportStep(Report(*s, t, {{w, 2 * t, kA, -1}, {w, 2 * t + 1, kA, -1}})));
  }
  EXPECT_EQ(Resolution(s->epoch).state, StepState::kCommitted);
  EXPECT_THAT(core_.ReportStep(good), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(StepCoreTest, S4_Resolution_NoneAgreement_VersionPlusOne_ReadFromPrimary) {
  uint64_t w = Create("w", Aggregation::kNone);
  uint64_t u = Create("untouched", Aggregation::kNone);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  auto value = F32({5, 6});
  for (int t = 0; t < 3; ++t) {
    ASSERT_OK(core_.ReportStep(
        Report(*s, t, {{w, 2 * t, value->checksum, -1}, {w, 2 * t + 1, value->checksum, -1}})));
  }
  StepResolution r = Resolution(s->epoch);
  ASSERT_EQ(r.state, StepState::kCommitted);
  ASSERT_EQ(r.changed.size(), 1u);  // "untouched" keeps its version
  EXPECT_EQ(r.changed[0].variable_id, w);
  EXPECT_EQ(r.changed[0].version, 2);
  EXPECT_EQ(r.latencies.size(), 3u);
  EXPECT_EQ(core_.GetVariable("untouched")->version, 1);
  (void)u;
  // The value now lives on the replicas only: a read fetches it, primary first.
  for (int i = 0; i < 6; ++i) workers_.Install(absl::StrCat("tpu_worker:", i / 2), w, i, 2, *value);
  auto read = core_.Read("w");
  ASSERT_OK(read);
  EXPECT_EQ(read->version, 2);
  EXPECT_EQ(read->value->checksum, value->checksum);
  auto view = core_.GetVariable("w");
  for (const ReplicaView& rv : view->replicas) EXPECT_EQ(rv.state, ReplicaState::kUpToDate);
}

// Values a step left on the replicas are cached once read, within the
// bound: reading the whole model (a checkpoint) does not keep it in the
// coordinator's memory.
TEST_F(StepCoreTest, S4_WhenStepResolved_EachWaiterAnsweredOnce_AllShareOneResolution) {
  const uint64_t w = Create("w", Aggregation::kNone);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  std::vector<StepCoordinator::SharedResolution> got;
  int answers = 0;
  for (int i = 0; i < 2; ++i) {
    core_.WhenStepResolved(s->epoch, [&](absl::StatusOr<StepCoordinator::SharedResolution> r) {
      ++answers;
      ASSERT_OK(r);
      got.push_back(*r);
    });
  }
  core_.WhenStepPlanned(
      s->epoch, /*detailed=*/false,
      [&](absl::StatusOr<std::variant<StepPlan, StepCoordinator::SharedResolution>> r) {
        ++answers;
        ASSERT_OK(r);
        ASSERT_TRUE(std::holds_alternative<StepCoordinator::SharedResolution>(*r))
            << "no collectives: resolved at the barrier";
        got.push_back(std::get<StepCoordinator::SharedResolution>(*r));
      });
  for (int t = 0; t < 2; ++t) {
    ASSERT_OK(core_.ReportStep(Report(*s, t, {{w, 2 * t, kA, -1}, {w, 2 * t + 1, kA, -1}})));
  }
  EXPECT_EQ(answers, 0) << "answered before the step resolved";
  ASSERT_OK(core_.ReportStep(Report(*s, 2, {{w, 4, kA, -1}, {w, 5, kA, -1}})));
  EXPECT_EQ(answers, 3);
  core_.WhenStepResolved(s->epoch, [&](absl::StatusOr<StepCoordinator::SharedResolution> r) {
    ++answers;
    ASSERT_OK(r);
    got.push_back(*r);
  });
  EXPECT_EQ(answers, 4) << "registered after: answered at once";
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0]->state, StepState::kCommitted);
  EXPECT_EQ(got[0]->latencies.size(), 3u);
  for (const StepCoordinator::SharedResolution& r : got) {
    EXPECT_EQ(r.get(), got[0].get()) << "one resolution for every waiter";
  }
  EXPECT_EQ(Resolution(s->epoch).latencies, got[0]->latencies);

  auto next = testing::BeginStep(core_, 2, absl::Seconds(10));
  ASSERT_OK(next);
  absl::Status waiting;
  core_.WhenStepResolved(next->epoch, [&](absl::StatusOr<StepCoordinator::SharedResolution> r) {
    waiting = r.status();
  });
  core_.ShutdownStepWaiters();
  EXPECT_THAT(waiting, StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
}

TEST_F(StepCoreTest, S4_NoneDivergence_TieGoesToPrimary_RepairPlanned) {
  uint64_t w = Create("w", Aggregation::kNone);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  // 3 replicas say A (0, 1, 2), 3 say B (3, 4, 5): a tie, so the primary's A.
  const std::vector<std::vector<ReplicaReport>> changed = {{{w, 0, kA, -1}, {w, 1, kA, -1}},
                                                           {{w, 2, kA, -1}, {w, 3, kB, -1}},
                                                           {{w, 4, kB, -1}, {w, 5, kB, -1}}};
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.ReportStep(Report(*s, t, changed[t])));
  // tpu_worker:2's digest says B where w's reporter (tpu_worker:0) says A:
  // the barrier asks for the reports in detail before it decides.
  StepPlan ask = Plan(s->epoch);
  EXPECT_TRUE(ask.send_detail);
  EXPECT_TRUE(ask.collectives.empty());
  for (int t = 0; t < 3; ++t) {
    ASSERT_OK(core_.ReportStep(Report(*s, t, changed[t], /*detailed=*/true)));
  }
  StepPlan plan = Plan(s->epoch, /*detailed=*/true);
  ASSERT_EQ(plan.collectives.size(), 1u);
  const StepCollective& c = plan.collectives[0];
  EXPECT_EQ(c.kind, StepCollective::Kind::kBroadcast);
  EXPECT_EQ(c.root, 0);  // tpu_worker:0 holds the primary
  EXPECT_EQ(c.checksum, kA);
  EXPECT_EQ(c.targets, (std::vector<int32_t>{3, 4, 5}));
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.FinishStep(Finish(*s, t, {{w, kA, -1}})));
  StepResolution r = Resolution(s->epoch);
  ASSERT_EQ(r.state, StepState::kCommitted);
  ASSERT_EQ(r.divergences.size(), 1u);
  EXPECT_EQ(r.divergences[0].chosen_checksum, kA);
  EXPECT_EQ(r.divergences[0].repaired, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(r.divergences[0].replica_checksums, (std::vector<uint64_t>{kA, kA, kA, kB, kB, kB}));
}

TEST_F(StepCoreTest, S4_Mean_FusedAllreducePlanned_WorkersMustAgree) {
  uint64_t a = Create("a", Aggregation::kMean);
  uint64_t b = Create("b", Aggregation::kSum);
  uint64_t c = Create("c", Aggregation::kSum, DType::kFloat64);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  ASSERT_OK(core_.ReportStep(Report(*s, 0, {{a, 0, kA, -1}, {b, 1, kA, -1}, {c, 0, kA, -1}})));
  ASSERT_OK(core_.ReportStep(Report(*s, 1)));  // nothing changed there
  ASSERT_OK(core_.ReportStep(Report(*s, 2)));
  StepPlan plan = Plan(s->epoch);
  // One fused reduction per accumulator type, variables in id order.
  ASSERT_EQ(plan.collectives.size(), 2u);
  EXPECT_EQ(testing::IdsOf(s->variables, plan.collectives[0].variables),
            (std::vector<uint64_t>{a, b}));
  EXPECT_EQ(testing::IdsOf(s->variables, plan.collectives[1].variables),
            (std::vector<uint64_t>{c}));
  EXPECT_NE(plan.collectives[0].tag, plan.collectives[1].tag);
  ASSERT_OK(core_.FinishStep(Finish(*s, 0, {{a, 1, -1}, {b, 2, -1}, {c, 3, -1}})));
  ASSERT_OK(core_.FinishStep(Finish(*s, 1, {{a, 1, -1}, {b, 2, -1}, {c, 3, -1}})));
  ASSERT_OK(core_.FinishStep(Finish(*s, 2, {{a, 1, -1}, {b, 9, -1}, {c, 3, -1}})));
  StepResolution r = Resolution(s->epoch);
  EXPECT_EQ(r.state, StepState::kFailed);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kDataLoss, "tpu_worker:2"));
  EXPECT_EQ(core_.GetVariable("b")->version, 1);  // nothing changed
}

// A worker whose values differ is named even when it is the one that
// reported the variable's checksum (the others then disagree with it).
TEST_F(StepCoreTest, S4_Finish_TheOddWorkerIsNamed_EvenWhenItIsTheReporter) {
  uint64_t a = Create("a", Aggregation::kSum);
  uint64_t b = Create("b", Aggregation::kSum);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  ASSERT_EQ(ReporterOf(s->variables[1], 1), Me(*s, 0)) << "b's reporter is tpu_worker:0";
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.ReportStep(Report(*s, t, {{b, 2 * t, kA, -1}})));
  (void)Plan(s->epoch);
  ASSERT_OK(core_.FinishStep(Finish(*s, 0, {{b, 9, -1}})));
  ASSERT_OK(core_.FinishStep(Finish(*s, 1, {{b, 2, -1}})));
  ASSERT_OK(core_.FinishStep(Finish(*s, 2, {{b, 2, -1}})));
  StepResolution r = Resolution(s->epoch);
  EXPECT_EQ(r.state, StepState::kFailed);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kDataLoss, "failed: tpu_worker:0 ended with"));
  EXPECT_EQ(core_.GetVariable("b")->version, 1);
  (void)a;
}

// What a summary or a finish claims is checked against the layout before
// anything changes; a valid one from the same worker is accepted after.
TEST_F(StepCoreTest, S3_Summaries_ClaimsCheckedAgainstTheLayout) {
  uint64_t n = Create("n", Aggregation::kNone);
  uint64_t m = Create("m", Aggregation::kMean);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  WorkerReport past = Report(*s, 0);
  past.changed = IndexRanges::All(3);  // the layout has 2 variables
  EXPECT_THAT(core_.ReportStep(past), StatusIs(absl::StatusCode::kInvalidArgument, "index 2"));
  // n's reporter is tpu_worker:0 (replica 0); tpu_worker:1 may not report it.
  WorkerReport not_reporter = Report(*s, 1, {{n, 2, kA, -1}, {n, 3, kA, -1}});
  not_reporter.shard = {{n, kA}};
  EXPECT_THAT(core_.ReportStep(not_reporter),
              StatusIs(absl::StatusCode::kInvalidArgument, "reports the checksum of n"));
  WorkerReport wrong_detail = Report(*s, 0, {{n, 0, kA, -1}, {n, 1, kA, -1}}, true);
  wrong_detail.replicas[0].checksum = kB;
  EXPECT_THAT(core_.ReportStep(wrong_detail),
              StatusIs(absl::StatusCode::kInvalidArgument, "do not sum to its digest"));
  WorkerReport both = Report(*s, 0, {{n, 0, kA, -1}, {n, 1, kA, -1}});
  both.replicas = {{n, 0, kA, -1}};
  EXPECT_THAT(core_.ReportStep(both),
              StatusIs(absl::StatusCode::kInvalidArgument, "in its changed ranges too"));
  // A detailed report may take its own summary's place, not another's.
  ASSERT_OK(core_.ReportStep(Report(*s, 0, {{n, 0, kA, -1}, {n, 1, kA, -1}, {m, 0, kA, -1}})));
  EXPECT_THAT(core_.ReportStep(Report(*s, 0, {{n, 0, kB, -1}, {n, 1, kB, -1}}, true)),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_OK(
      core_.ReportStep(Report(*s, 0, {{n, 0, kA, -1}, {n, 1, kA, -1}, {m, 0, kA, -1}}, true)));
  for (int t = 1; t < 3; ++t) {
    ASSERT_OK(core_.ReportStep(Report(*s, t, {{n, 2 * t, kA, -1}, {n, 2 * t + 1, kA, -1}})));
  }
  StepPlan plan = Plan(s->epoch);
  ASSERT_EQ(plan.changed, IndexRanges::All(2));
  WorkerFinish short_of_one = Finish(*s, 1, {{m, 5, -1}});  // n left out
  EXPECT_THAT(core_.FinishStep(short_of_one),
              StatusIs(absl::StatusCode::kInvalidArgument, "not the plan's changed variables"));
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.FinishStep(Finish(*s, t, {{n, kA, -1}, {m, 5, -1}})));
  StepResolution r = Resolution(s->epoch);
  ASSERT_EQ(r.state, StepState::kCommitted) << r.status;
  EXPECT_EQ(r.changed_ranges, IndexRanges::All(2));
  EXPECT_EQ(r.changed_digest, DigestTerm(n, kA) + DigestTerm(m, 5));
}

// When every variable changes and the replicas agree, what a worker sends
// and receives about a step does not grow with the number of variables:
// one range, one digest; only the checksums it reports (its share of
// them) grow, by the variables over the workers.
TEST_F(StepCoreTest, S4_Messages_DoNotGrowWithTheVariables_WhenReplicasAgree) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < 60; ++i) ids.push_back(Create(absl::StrCat("v", i), Aggregation::kMean));
  auto sizes = [&](size_t count, int64_t step) {
    auto s = testing::BeginStep(core_, step, absl::Seconds(10));
    EXPECT_OK(s);
    size_t report_bytes = 0, finish_bytes = 0;
    for (int t = 0; t < 3; ++t) {
      std::vector<ReplicaReport> rr;
      for (size_t i = 0; i < count; ++i) rr.push_back({ids[i], 2 * t, kA, -1});
      WorkerReport report = Report(*s, t, rr);
      v1::ReportStepRequest proto;
      ReportToProto(report, &proto);
      report_bytes = std::max(report_bytes, proto.ByteSizeLong());
      EXPECT_OK(core_.ReportStep(report));
    }
    StepPlan plan = Plan(s->epoch);
    v1::StepPlan plan_proto;
    PlanToProto(plan, &plan_proto);
    for (int t = 0; t < 3; ++t) {
      std::vector<PreparedVariable> pv;
      for (size_t i = 0; i < count; ++i) pv.push_back({ids[i], 1000 + i, -1});
      WorkerFinish finish = Finish(*s, t, pv);
      v1::FinishStepRequest proto;
      FinishToProto(finish, &proto);
      finish_bytes = std::max(finish_bytes, proto.ByteSizeLong());
      EXPECT_OK(core_.FinishStep(finish));
    }
    StepResolution r = Resolution(s->epoch);
    EXPECT_EQ(r.state, StepState::kCommitted) << r.status;
    v1::StepResolution res;
    StepResolutionToProto(r, &res, /*short_form=*/true);
    return std::make_tuple(report_bytes, plan_proto.ByteSizeLong(), finish_bytes,
                           res.ByteSizeLong());
  };
  const auto [report6, plan6, finish6, res6] = sizes(6, 1);
  const auto [report60, plan60, finish60, res60] = sizes(60, 2);
  EXPECT_EQ(report6, report60);
  EXPECT_LE(plan60, plan6 + 2);  // a range bound may take a byte more
  EXPECT_LE(res60, res6 + 2);
  // 60 variables over 3 workers: 20 checksums each, about 12 bytes apiece.
  EXPECT_LE(finish60, finish6 + 18 * 14);
}

TEST_F(StepCoreTest, S4_NonFinite_LocalValueNamesReplica_ResultNamesVariable) {
  uint64_t w = Create("w", Aggregation::kMean);
  uint64_t n = Create("n", Aggregation::kNone);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  ASSERT_OK(core_.ReportStep(Report(*s, 0)));
  ASSERT_OK(core_.ReportStep(Report(*s, 1, {{n, 2, kA, 1}, {n, 3, kA, 1}})));
  ASSERT_OK(core_.ReportStep(Report(*s, 2)));
  EXPECT_THAT(Resolution(s->epoch).status,
              StatusIs(absl::StatusCode::kInvalidArgument, "n/2 on tpu_worker:1"));

  auto s2 = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s2);
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.ReportStep(Report(*s2, t, {{w, 2 * t, kA, -1}})));
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.FinishStep(Finish(*s2, t, {{w, kB, 0}})));
  EXPECT_THAT(Resolution(s2->epoch).status,
              StatusIs(absl::StatusCode::kInvalidArgument, "aggregated value of w"));
}

TEST_F(StepCoreTest, S4_MeanOfIntegerDtype_RefusedAtCreate) {
  VariableDef d;
  d.name = "counts";
  d.tensor = TensorSpec{DType::kInt32, {2}};
  d.aggregation = Aggregation::kMean;
  EXPECT_THAT(core_.CreateVariables({}, {{d, {}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "MEAN aggregation needs a floating"));
}

TEST_F(StepCoreTest, S4_BarrierTimeout_NamesMissingWorkers_WarnsAtHalf) {
  Create("w", Aggregation::kMean);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  ASSERT_OK(core_.ReportStep(Report(*s, 0)));
  clock_.Advance(absl::Seconds(5));
  HeartbeatAll({0, 1, 2});
  core_.Tick(clock_.Now());
  std::vector<StepEvent> events = core_.WaitStepEvents(0, absl::InfinitePast());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, StepEvent::Kind::kStragglers);
  EXPECT_EQ(events.back().missing, (std::vector<std::string>{"tpu_worker:1", "tpu_worker:2"}));
  EXPECT_THAT(testing::ResolutionNow(core_, s->epoch).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));  // still open
  clock_.Advance(absl::Seconds(5));
  HeartbeatAll({0, 1, 2});
  core_.Tick(clock_.Now());
  StepResolution r = Resolution(s->epoch);
  EXPECT_EQ(r.state, StepState::kFailed);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                 "missing: tpu_worker:1 (sent no report; last heartbeat 0 s ago)"));
  EXPECT_NE(r.status.message().find("tpu_worker:2"), std::string::npos);
}

}  // namespace
}  // namespace repvar::server

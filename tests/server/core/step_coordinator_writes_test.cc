// SPDX-License-Identifier: Apache-2.0
// Replicated steps against the coordinator core, beside the rest of the
// cluster: reads of what steps left (C1), cross-replica writes during and
// after a step (S5, C6, F7), restarts (F3, F6) and dead workers (F1).
#include "tests/server/core/step_core_fixture.h"

namespace repvar::server {
namespace {

TEST_F(StepCoreTest, ReadCache_FetchedValuesStayWithinItsBound) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(Create(absl::StrCat("v", i), Aggregation::kNone));
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  auto value = F32({7, 8});
  for (int t = 0; t < 3; ++t) {
    std::vector<ReplicaReport> rr;
    for (uint64_t id : ids) {
      rr.push_back({id, 2 * t, value->checksum, -1});
      rr.push_back({id, 2 * t + 1, value->checksum, -1});
    }
    ASSERT_OK(core_.ReportStep(Report(*s, t, std::move(rr))));
  }
  ASSERT_EQ(Resolution(s->epoch).state, StepState::kCommitted);
  for (uint64_t id : ids) {
    for (int i = 0; i < 6; ++i)
      workers_.Install(absl::StrCat("tpu_worker:", i / 2), id, i, 2, *value);
  }
  for (int i = 0; i < 6; ++i) {
    auto read = core_.Read(absl::StrCat("v", i));
    ASSERT_OK(read);
    EXPECT_EQ(read->value->checksum, value->checksum);
    EXPECT_LE(core_.replication().cached_bytes(), 32u) << "after reading v" << i;
  }
  EXPECT_EQ(core_.replication().cached_bytes(), 32u) << "the cache is used up to its bound";
}

// A batched read takes every kept value from one look at the state and
// reads a value a step left on the replicas as Read does: each comes back
// as a single Read gives it, in the order asked.
TEST_F(StepCoreTest, C1_ReadBatch_KeptAndStepLeftValues_EachAsReadGivesIt) {
  auto value = F32({7, 8});
  KeptAndStepLeft(*value);
  const int reads_before = workers_.reads();
  auto batch = core_.ReadBatch({"w", "kept", "w"}, 1 << 20);
  ASSERT_OK(batch);
  ASSERT_EQ(batch->size(), 3u);
  for (size_t i : {0, 2}) {
    EXPECT_EQ((*batch)[i].version, 2);
    EXPECT_EQ((*batch)[i].value->checksum, value->checksum);
  }
  auto single = core_.Read("kept");
  ASSERT_OK(single);
  EXPECT_EQ((*batch)[1].version, single->version);
  EXPECT_EQ((*batch)[1].value.get(), single->value.get()) << "the coordinator's own copy";
  EXPECT_EQ(workers_.reads() - reads_before, 1) << "w fetched once, then from the cache";
}

// What the coordinator holds is read without a worker (ReadBatchHeld: the
// trainers' service answers it on gRPC's callback thread): its copies, and a
// value a step left on the replicas once read back. A batch with a value
// not read back yet is not held (nullopt, no worker asked), nor one larger
// than the bound on what is held; a refusal is the same as ReadBatch's.
TEST_F(StepCoreTest, C1_ReadBatchHeld_CopiesAndReadBackValues_NoWorkerAsked) {
  auto value = F32({7, 8});
  KeptAndStepLeft(*value);
  const int reads_before = workers_.reads();
  auto kept = core_.ReadBatchHeld({"kept"}, 1 << 20, 1 << 20);
  ASSERT_OK(kept);
  ASSERT_TRUE(kept->has_value());
  EXPECT_EQ((**kept)[0].value.get(), core_.Read("kept")->value.get()) << "the coordinator's copy";
  auto not_yet = core_.ReadBatchHeld({"kept", "w"}, 1 << 20, 1 << 20);
  ASSERT_OK(not_yet);
  EXPECT_FALSE(not_yet->has_value()) << "w lives on the replicas only";
  EXPECT_EQ(workers_.reads(), reads_before) << "not held: no worker asked";
  ASSERT_OK(core_.ReadBatch({"w"}, 1 << 20));  // reads it back, once
  EXPECT_EQ(workers_.reads() - reads_before, 1);
  auto held = core_.ReadBatchHeld({"w", "kept"}, 1 << 20, 1 << 20);
  ASSERT_OK(held);
  ASSERT_TRUE(held->has_value());
  EXPECT_EQ((**held)[0].version, 2);
  EXPECT_EQ((**held)[0].value->checksum, value->checksum);
  EXPECT_EQ(workers_.reads() - reads_before, 1) << "read back: from the cache";
  EXPECT_THAT(core_.ReadBatchHeld({"w", "nope"}, 1 << 20, 1 << 20),
              StatusIs(absl::StatusCode::kNotFound, "nope"));
  auto over_held = core_.ReadBatchHeld({"w", "kept"}, 1 << 20, 8);
  ASSERT_OK(over_held);
  EXPECT_FALSE(over_held->has_value()) << "more than held_bytes: not held, not refused";
  EXPECT_THAT(core_.ReadBatchHeld({"w", "kept"}, 8, 1 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted, "more than 8 bytes"));
  EXPECT_EQ(workers_.reads() - reads_before, 1);
}

// The callback handlers' waits (WhenStepPlanned, WhenStepResolved): a
// waiter registered while the step is open is answered once, when it
// resolves; one registered after, at once; every waiter of the step gets
// the one resolution, shared rather than copied for each; after
// ShutdownWaiters, UNAVAILABLE.
// F3 on the callback thread: a read there never answers from a state whose
// last record waits for its sync (that would answer what a power loss can
// still take back), nor waits for the sync: not held, read where it may wait.
TEST_F(StepCoreTest, F3_ReadBatchHeld_AStateNotDurableYet_NotHeld) {
  KeptAndStepLeft(*F32({7, 8}));
  log_.durable = false;
  auto not_yet = core_.ReadBatchHeld({"kept"}, 1 << 20, 1 << 20);
  ASSERT_OK(not_yet);
  EXPECT_FALSE(not_yet->has_value()) << "the state it read is not durable yet";
  log_.durable = true;
  auto held = core_.ReadBatchHeld({"kept"}, 1 << 20, 1 << 20);
  ASSERT_OK(held);
  EXPECT_TRUE(held->has_value());
}

// A copy in a blob file not checked yet (its first use after a restart) is
// not held: its check, a pass over its bytes maybe read from disk, is made
// where a read may wait (ReadBatch, on the trainers' pool), and then it is.
TEST_F(StepCoreTest, C1_ReadBatchHeld_ACopyNotCheckedYet_NotHeld_CheckedWhereAReadMayWait) {
  KeptAndStepLeft(*F32({7, 8}));
  auto kept = core_.Read("kept");
  ASSERT_OK(kept);
  log_.unchecked.insert(kept->value->checksum);
  const int checks_before = log_.checks;
  auto not_yet = core_.ReadBatchHeld({"kept"}, 1 << 20, 1 << 20);
  ASSERT_OK(not_yet);
  EXPECT_FALSE(not_yet->has_value()) << "its first check is no work for the callback thread";
  EXPECT_EQ(log_.checks, checks_before);
  ASSERT_OK(core_.ReadBatch({"kept"}, 1 << 20));
  EXPECT_EQ(log_.checks, checks_before + 1);
  auto held = core_.ReadBatchHeld({"kept"}, 1 << 20, 1 << 20);
  ASSERT_OK(held);
  ASSERT_TRUE(held->has_value()) << "checked: held from then on";
  EXPECT_EQ((**held)[0].value.get(), kept->value.get());
}

TEST_F(StepCoreTest, S5_CrossReplicaWritesRefusedDuringStep_ReadsCommitted_NewVariablesWait) {
  uint64_t w = Create("w", Aggregation::kMean);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  EXPECT_THAT(core_.Assign({}, {"w", AssignOp::kAssign, F32({1, 1})}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 is open"));
  EXPECT_THAT(core_.DeleteVariable({}, "w"), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto read = core_.Read("w");
  ASSERT_OK(read);
  EXPECT_EQ(read->version, 1);
  // Created and initialized during the step: allowed, and not in this step.
  uint64_t slot = Create("slot", Aggregation::kMean);
  EXPECT_THAT(core_.ReportStep(Report(*s, 0, {{slot, 0, kA, -1}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "join the next one"));
  for (int t = 0; t < 3; ++t) ASSERT_OK(core_.ReportStep(Report(*s, t)));
  ASSERT_EQ(Resolution(s->epoch).state, StepState::kCommitted);
  EXPECT_OK(core_.Assign({}, {"w", AssignOp::kAssign, F32({1, 1})}));
  auto next = testing::BeginStep(core_, 2, absl::Seconds(10));
  ASSERT_OK(next);
  EXPECT_EQ(next->variables.size(), 2u);  // the slot joined
  (void)w;
}

// C6 before S5: the retry of a write that was applied (its caller gave up
// waiting) gets the original answer even though a step opened since; a new
// request is refused. Found by the crash trials under step load.
TEST_F(StepCoreTest, C6_RetryOfAnAppliedWrite_AnsweredWhileAStepIsOpen) {
  Create("w", Aggregation::kMean);
  const RequestKey key{"assign-1", 7};
  auto first = core_.Assign(key, {"w", AssignOp::kAssign, F32({3, 4})});
  ASSERT_OK(first);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  auto retry = core_.Assign(key, {"w", AssignOp::kAssign, F32({3, 4})});
  ASSERT_OK(retry);
  EXPECT_EQ(retry->version, first->version);
  EXPECT_EQ(retry->checksum, first->checksum);
  EXPECT_THAT(core_.Assign({"assign-2", 7}, {"w", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 is open"));
}

// C6 with S5: a retry that arrives while an earlier attempt of its request
// still runs (its caller gave up waiting) is told to retry, not refused at
// the write gate a beginning step closed: that attempt goes on to apply
// the write, and the request's answer is then its answer. Found by the
// simulator once it ran steps beside writes.
TEST_F(StepCoreTest, C6_RetryWhileAnEarlierAttemptRuns_UnavailableNeverRefused) {
  const uint64_t w = Create("w", Aggregation::kMean);
  Create("u", Aggregation::kMean);
  const RequestKey key{"assign-1", 7};
  workers_.HoldWritesOf(w);
  absl::StatusOr<WriteResult> first;
  std::thread attempt([&] { first = core_.Assign(key, {"w", AssignOp::kAssign, F32({3, 4})}); });
  while (workers_.parked() == 0) std::this_thread::yield();
  absl::StatusOr<SharedStep> begun;
  std::thread step([&] { begun = core_.BeginStep(1, absl::Seconds(10)); });
  // Until the step is beginning (waiting for the write in flight): a new
  // write of another variable is refused then.
  for (int n = 0;; ++n) {
    auto probe =
        core_.Assign({absl::StrCat("probe-", n), 7}, {"u", AssignOp::kAssign, F32({1, 2})});
    if (absl::IsFailedPrecondition(probe.status())) break;
    std::this_thread::yield();
  }
  EXPECT_THAT(core_.Assign(key, {"w", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kUnavailable, "still running"));
  workers_.ReleaseWrites();
  attempt.join();
  step.join();
  ASSERT_OK(first);
  ASSERT_OK(begun);
  auto retry = core_.Assign(key, {"w", AssignOp::kAssign, F32({3, 4})});
  ASSERT_OK(retry);
  EXPECT_EQ(retry->version, first->version);
}

// C6 with S5: a request refused while a step was open stays refused; an
// attempt of it that arrives once the step resolved (delayed, duplicated,
// queued while the coordinator was paused) gets the same refusal and
// changes nothing. A new request goes through. Found by the simulator.
TEST_F(StepCoreTest, C6_ARefusedRequest_StaysRefused_ALateAttemptChangesNothing) {
  Create("w", Aggregation::kMean);
  const int64_t before = core_.GetVariable("w")->version;
  auto s = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(s);
  const RequestKey key{"assign-1", 7};
  EXPECT_THAT(core_.Assign(key, {"w", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 is open"));
  ASSERT_OK(core_.AbortStep(s->epoch, "test"));
  EXPECT_THAT(core_.Assign(key, {"w", AssignOp::kAssign, F32({3, 4})}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 is open"));
  EXPECT_EQ(core_.GetVariable("w")->version, before);
  EXPECT_OK(core_.Assign({"assign-2", 7}, {"w", AssignOp::kAssign, F32({3, 4})}));
}

// Two-phase commit across a restart: a worker that did not hear how its
// step ended asks the restarted coordinator, which answers the last step
// committed before the restart as committed, with what it changed (so the
// worker installs it: the value lives nowhere else), and a step the restart
// cut off as failed. Found by the crash trials under step load.
TEST_F(StepCoreTest, F3_AfterARestart_LastCommittedStepAnsweredCommitted_CutOffStepFailed) {
  const uint64_t w = Create("w", Aggregation::kNone);
  auto value = F32({5, 6});
  StepInfo s;
  ASSERT_NO_FATAL_FAILURE(CommitAgreedStep(w, 1, *value, &s));
  auto cut = testing::BeginStep(core_, 2, absl::Seconds(10));
  ASSERT_OK(cut);

  Coordinator after(Options(), &clock_, &workers_, &log_);
  ASSERT_OK(after.Recover());
  auto committed = testing::ResolutionNow(after, s.epoch);
  ASSERT_OK(committed);
  EXPECT_EQ(committed->state, StepState::kCommitted);
  EXPECT_EQ(committed->step, 1);
  ASSERT_EQ(committed->changed.size(), 1u);
  EXPECT_EQ(committed->changed[0].variable_id, w);
  EXPECT_EQ(committed->changed[0].name, "w");
  EXPECT_EQ(committed->changed[0].version, 2);
  EXPECT_EQ(committed->changed[0].checksum, value->checksum);
  auto plan = testing::PlanNow(after, s.epoch);
  ASSERT_OK(plan);
  ASSERT_TRUE(std::holds_alternative<StepResolution>(*plan));
  EXPECT_EQ(std::get<StepResolution>(*plan).state, StepState::kCommitted);

  auto failed = testing::ResolutionNow(after, cut->epoch);
  ASSERT_OK(failed);
  EXPECT_EQ(failed->state, StepState::kFailed);
  EXPECT_THAT(failed->status, StatusIs(absl::StatusCode::kAborted, "coordinator restarted"));
  EXPECT_THAT(testing::ResolutionNow(after, cut->epoch + 1), StatusIs(absl::StatusCode::kNotFound));
}

// F7 for a value only the replicas hold (a step changed it): before a
// cross-replica write overwrites them, the coordinator keeps the committed
// value, so a write sent to every replica but never recorded (the
// coordinator stopped first) loses nothing: after the restart the value is
// read and the replicas are rewritten with it. Found by the crash trials.
TEST_F(StepCoreTest, F7_WriteAfterAStep_CommittedValueKeptBeforeTheReplicasAreOverwritten) {
  const uint64_t w = Create("w", Aggregation::kNone);
  auto value = F32({5, 6});
  StepInfo s;
  ASSERT_NO_FATAL_FAILURE(CommitAgreedStep(w, 1, *value, &s));
  for (int i = 0; i < 6; ++i) workers_.Install(absl::StrCat("tpu_worker:", i / 2), w, i, 2, *value);

  log_.refuse_values = true;
  EXPECT_FALSE(core_.Assign({}, {"w", AssignOp::kAssign, F32({7, 8})}).ok());
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(workers_.Get(absl::StrCat("tpu_worker:", i / 2), w, i)->version, 3)
        << "every replica took the unrecorded version";
  }
  log_.refuse_values = false;

  Coordinator after(Options(), &clock_, &workers_, &log_);
  ASSERT_OK(after.Recover());
  auto read = after.Read("w");
  ASSERT_OK(read);
  EXPECT_EQ(read->version, 2);
  EXPECT_EQ(read->value->checksum, value->checksum);
  after.ResyncStale();
  for (int i = 0; i < 6; ++i) {
    auto held = workers_.Get(absl::StrCat("tpu_worker:", i / 2), w, i);
    ASSERT_TRUE(held.has_value());
    EXPECT_EQ(held->version, 2) << "replica " << i;
    EXPECT_EQ(held->checksum, value->checksum) << "replica " << i;
  }
}

// F6 with nothing recorded: a coordinator that keeps nothing (--ephemeral),
// started again under workers that outlived it, begins its epochs above the
// ones it gave before (they start at the clock in microseconds), so no
// worker sees an epoch twice.
TEST_F(StepCoreTest, F6_EpochsNeverRepeat_EvenForACoordinatorThatRecordsNothing) {
  Create("w", Aggregation::kMean);
  auto first = testing::BeginStep(core_, 1, absl::Seconds(10));
  ASSERT_OK(first);
  ASSERT_OK(core_.AbortStep(first->epoch, "the coordinator goes away"));
  clock_.Advance(absl::Seconds(1));
  Coordinator again(Options(), &clock_, &workers_);  // nothing recorded
  ASSERT_OK(again.Recover());
  ASSERT_NO_FATAL_FAILURE(RegisterHosts(again));
  ASSERT_NE(CreateZeroed(again, "w", Aggregation::kNone), 0u);
  auto next = testing::BeginStep(again, 1, absl::Seconds(10));
  ASSERT_OK(next);
  EXPECT_GT(next->epoch, first->epoch);
}

TEST_F(StepCoreTest, F1_DeadWorker_FailsOpenStepWithUnavailableNamingIt) {
  Create("w", Aggregation::kMean);
  auto s = testing::BeginStep(core_, 1, absl::Seconds(600));
  ASSERT_OK(s);
  ASSERT_OK(core_.ReportStep(Report(*s, 0)));
  clock_.Advance(absl::Seconds(30));
  HeartbeatAll({0, 2});
  core_.Tick(clock_.Now());
  StepResolution r = Resolution(s->epoch);
  EXPECT_EQ(r.state, StepState::kFailed);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kUnavailable, "worker tpu_worker:1"));
  std::vector<StepEvent> events = core_.WaitStepEvents(0, absl::InfinitePast());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, StepEvent::Kind::kResolved);  // the watch stream tells
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// Cross-replica writes (C2-C7), bad writes (X2), returning and dying
// workers (F1, F2, T1), restarts (F3), delete and drain against the
// coordinator core.
#include "tests/server/core/coordinator_fixture.h"

namespace repvar::server {
namespace {

TEST_F(CoordinatorTest, C2_Assign_AckedOnlyWhenEveryLiveReplicaHoldsIt) {
  Create(Def("w", 6));
  auto ack = Assign("w", F32({1, 2, 3}));
  ASSERT_OK(ack);
  auto view = core_.GetVariable("w");
  for (int i = 0; i < 6; ++i) {
    auto held = workers_.Get(absl::StrCat("tpu_worker:", i / 2), view->id, i);
    ASSERT_TRUE(held.has_value()) << i;
    EXPECT_EQ(held->version, ack->version);
    EXPECT_EQ(held->checksum, ack->checksum);
    EXPECT_EQ(view->replicas[i].state, ReplicaState::kUpToDate);
  }
}

// Threads of this process, from /proc/self/status.
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

TEST_F(CoordinatorTest, C2_Assign_AllWorkersCalledAtOnce_NoThreadPerWorker_AckedWhenAllAnswer) {
  Create(Def("w", 6));  // replicas on three hosts
  workers_.SetManual(true);
  const int threads = ThreadCount();
  absl::StatusOr<WriteResult> ack;
  std::thread writer([&] { ack = Assign("w", F32({1, 2, 3})); });
  // Every worker's call is out before any answers, and no thread waits per
  // worker: only the writer's own thread was added.
  while (workers_.parked() < 3) std::this_thread::yield();
  EXPECT_EQ(ThreadCount(), threads + 1);
  ASSERT_TRUE(workers_.CompleteNext());
  ASSERT_TRUE(workers_.CompleteNext());
  EXPECT_EQ(core_.GetVariable("w")->version, 0) << "not committed before every replica answered";
  ASSERT_TRUE(workers_.CompleteNext());
  writer.join();
  workers_.SetManual(false);
  ASSERT_OK(ack);
  EXPECT_EQ(core_.GetVariable("w")->version, 1);
}

TEST_F(CoordinatorTest, C2_Assign_ReplicaUnreachable_ErrorMarkedForResyncCommittedUnchanged) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  workers_.Fail("tpu_worker:2", absl::UnavailableError("connection refused"));
  EXPECT_THAT(Assign("w", F32({7, 7, 7})),
              StatusIs(absl::StatusCode::kUnavailable, "tpu_worker:2"));
  auto view = core_.GetVariable("w");
  EXPECT_EQ(view->version, 1);
  EXPECT_TRUE(view->needs_resync);
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{1, 2, 3}));
  // Replicas that took the uncommitted value are reported stale, never silently current.
  EXPECT_EQ(view->replicas[0].state, ReplicaState::kStale);
  // The unreachable worker's too: its answer may be what was lost, so it
  // may hold either value until repair fences it off and looks.
  EXPECT_EQ(view->replicas[4].state, ReplicaState::kStale);
  workers_.Heal("tpu_worker:2");
  auto retry = Assign("w", F32({7, 7, 7}));
  ASSERT_OK(retry);
  EXPECT_EQ(retry->version, 2);
  EXPECT_FALSE(core_.GetVariable("w")->needs_resync);
}

TEST_F(CoordinatorTest, C2_Assign_DeadWorkerReplicaIsUnavailableNotBlocking) {
  Create(Def("w", 6));
  SilenceTpuWorker(2);
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  auto view = core_.GetVariable("w");
  EXPECT_EQ(view->replicas[4].state, ReplicaState::kUnavailable);
  EXPECT_EQ(view->replicas[0].state, ReplicaState::kUpToDate);
}

TEST_F(CoordinatorTest, C3_AssignAdd_ChangesEveryReplicaComputedOnce) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  auto add = Assign("w", F32({10, 10, 10}), AssignOp::kAdd);
  ASSERT_OK(add);
  auto sub = Assign("w", F32({1, 1, 1}), AssignOp::kSub);
  ASSERT_OK(sub);
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{10, 11, 12}));
  auto view = core_.GetVariable("w");
  for (int i = 0; i < 6; ++i) {
    auto held = workers_.Get(absl::StrCat("tpu_worker:", i / 2), view->id, i);
    EXPECT_EQ(held->version, 3);
    EXPECT_EQ(held->checksum, sub->checksum) << "every replica got the value, not the delta";
  }
}

TEST_F(CoordinatorTest, C3_AssignAdd_RetryWithSameRequestIdAppliesOnce) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({0, 0, 0})));
  auto delta = F32({1, 1, 1});
  auto first = Assign("w", delta, AssignOp::kAdd, "req-1");
  auto retry = Assign("w", delta, AssignOp::kAdd, "req-1");
  ASSERT_OK(first);
  ASSERT_OK(retry);
  EXPECT_EQ(first->version, retry->version);
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{1, 1, 1}));
}

TEST_F(CoordinatorTest, C3_AssignAdd_FailedAttemptThenRetryAppliesOnce) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({0, 0, 0})));
  workers_.Fail("tpu_worker:1", absl::UnavailableError("down"));
  auto delta = F32({1, 1, 1});
  EXPECT_THAT(Assign("w", delta, AssignOp::kAdd, "req-2"),
              StatusIs(absl::StatusCode::kUnavailable));
  workers_.Heal("tpu_worker:1");
  ASSERT_OK(Assign("w", delta, AssignOp::kAdd, "req-2"));
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(core_.Read("w")->version, 2);
}

TEST_F(CoordinatorTest, C3_AssignAdd_Uninitialized_FailedPrecondition) {
  Create(Def("w", 2));
  EXPECT_THAT(Assign("w", F32({1, 1, 1}), AssignOp::kAdd),
              StatusIs(absl::StatusCode::kFailedPrecondition, "uninitialized"));
}

TEST_F(CoordinatorTest, C4_ConcurrentWriters_VersionsStrictlyIncreaseAndReadsSeeAckedWrites) {
  Create(Def("w", 6, {1}));
  ASSERT_OK(Assign("w", F32({0}, {1})));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      int64_t last = 0;
      for (int i = 0; i < 50; ++i) {
        auto ack = Assign("w", F32({1}, {1}), AssignOp::kAdd);
        ASSERT_OK(ack);
        EXPECT_GT(ack->version, last);
        last = ack->version;
        auto r = core_.Read("w");  // starts after the ack: sees it or later
        EXPECT_GE(r->version, ack->version);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(Floats(*core_.Read("w")->value)[0], 200.0f);
  EXPECT_EQ(core_.Read("w")->version, 201);
}

TEST_F(CoordinatorTest, C4_AssignReturnsNewValue) {
  Create(Def("w", 2));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  auto ack = Assign("w", F32({1, 1, 1}), AssignOp::kAdd);
  ASSERT_OK(ack);
  EXPECT_EQ(Floats(*ack->value), (std::vector<float>{2, 3, 4}));
}

TEST_F(CoordinatorTest, C5_Initialize_FirstCallerWinsValueMadeOnce) {
  Initializer normal{InitializerKind::kRandomNormal, 0, 0.0, 1.0, 42};
  Create(Def("w", 6, {64}), normal);
  auto first = core_.Initialize({}, {{"w", std::nullopt}});
  Initializer other = normal;
  other.seed = 7;
  auto second = core_.Initialize({}, {{"w", other}});
  ASSERT_OK(first);
  ASSERT_OK(second);
  EXPECT_TRUE((*first)[0].initialized_now);
  EXPECT_FALSE((*second)[0].initialized_now);
  EXPECT_EQ((*second)[0].checksum, (*first)[0].checksum);
  EXPECT_EQ(core_.Read("w")->version, 1);
}

TEST_F(CoordinatorTest, C5_SeededInitializer_ReproducibleAcrossCoordinators) {
  Initializer uniform{InitializerKind::kRandomUniform, 0, -1.0, 1.0, 1234};
  Create(Def("w", 2, {1000}), uniform);
  ASSERT_OK(core_.Initialize({}, {{"w", std::nullopt}}));
  repvar::testing::FakeWorkerClient other_workers;
  Coordinator other(CoordinatorOptions{}, &clock_, &other_workers);
  ASSERT_OK(other.RegisterWorker({"tpu_worker",
                                  0,
                                  "x:1",
                                  1,
                                  {"/job:tpu_worker/replica:0/task:0/device:TPU:0",
                                   "/job:tpu_worker/replica:0/task:0/device:TPU:1"}}));
  ASSERT_OK(other.CreateVariables({}, {{Def("w", 2, {1000}), uniform}}));
  ASSERT_OK(other.Initialize({}, {{"w", std::nullopt}}));
  EXPECT_EQ(core_.Read("w")->value->checksum, other.Read("w")->value->checksum);
  auto v = Floats(*core_.Read("w")->value);
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x >= -1 && x < 1; }));
}

TEST_F(CoordinatorTest, C5_ReadUninitialized_FailedPreconditionAndIsInitializedPerReplica) {
  Create(Def("w", 6), Initializer{InitializerKind::kZeros});
  EXPECT_THAT(core_.Read("w"), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto before = core_.GetVariable("w");
  EXPECT_FALSE(before->initialized);
  for (const auto& r : before->replicas) EXPECT_EQ(r.state, ReplicaState::kUninitialized);
  ASSERT_OK(core_.Initialize({}, {{"w", std::nullopt}}));
  auto after = core_.GetVariable("w");
  EXPECT_TRUE(after->initialized);
  for (const auto& r : after->replicas) EXPECT_EQ(r.state, ReplicaState::kUpToDate);
}

TEST_F(CoordinatorTest, C5_InitializeWithoutInitializer_InvalidArgument) {
  Create(Def("w", 2));
  EXPECT_THAT(core_.Initialize({}, {{"w", std::nullopt}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "no initializer"));
  EXPECT_FALSE(core_.GetVariable("w")->initialized);
}

TEST_F(CoordinatorTest, C6_RequestId_RetryReturnsOriginalAnswer) {
  Create(Def("w", 2));
  auto v1 = F32({1, 2, 3});
  auto first = Assign("w", v1, AssignOp::kAssign, "id-1");
  ASSERT_OK(Assign("w", F32({9, 9, 9})));
  auto retry = Assign("w", v1, AssignOp::kAssign, "id-1");
  ASSERT_OK(first);
  ASSERT_OK(retry);
  EXPECT_EQ(retry->version, first->version);
  EXPECT_EQ(core_.Read("w")->version, 2) << "the retry did not apply again";
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{9, 9, 9}));
}

TEST_F(CoordinatorTest, C6_RequestId_ReusedWithOtherPayload_InvalidArgument) {
  Create(Def("w", 2));
  ASSERT_OK(Assign("w", F32({1, 2, 3}), AssignOp::kAssign, "id-2"));
  EXPECT_THAT(Assign("w", F32({4, 5, 6}), AssignOp::kAssign, "id-2"),
              StatusIs(absl::StatusCode::kInvalidArgument, "id-2"));
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{1, 2, 3}));
}

TEST_F(CoordinatorTest, C7_NonFinite_RefusedByDefaultAllowedByOptOut) {
  Create(Def("w", 2));
  const float inf = std::numeric_limits<float>::infinity();
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  EXPECT_THAT(Assign("w", F32({1, NAN, 3})),
              StatusIs(absl::StatusCode::kInvalidArgument, "element 1"));
  EXPECT_THAT(Assign("w", F32({inf, 0, 0}), AssignOp::kAdd),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(Assign("w", F32({3e38f, 0, 0})));
  EXPECT_THAT(Assign("w", F32({3e38f, 0, 0}), AssignOp::kAdd),
              StatusIs(absl::StatusCode::kInvalidArgument, "result is non-finite"));
  EXPECT_EQ(core_.Read("w")->version, 2);
  VariableDef loose = Def("loose", 2);
  loose.allow_nonfinite = true;
  Create(loose);
  ASSERT_OK(Assign("loose", F32({NAN, inf, -inf})));
  auto v = Floats(*core_.Read("loose")->value);
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], inf);
}

// An initializer's non-finite value is refused for a variable that does not
// opt out, even in a batch where one that does takes the same initializer
// (their values are not shared): the whole batch, naming the variable;
// the one that opts out alone is initialized.
TEST_F(CoordinatorTest, C7_Initialize_NonFiniteValue_RefusedUnlessTheVariableOptsOut) {
  const Initializer inf{InitializerKind::kConstant, std::numeric_limits<double>::infinity()};
  VariableDef loose = Def("loose", 2);
  loose.allow_nonfinite = true;
  Create(loose, inf);
  Create(Def("strict", 2), inf);
  EXPECT_THAT(core_.Initialize({}, {{"loose", std::nullopt}, {"strict", std::nullopt}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "variable strict: initial value has a non-finite element at 0"));
  EXPECT_EQ(core_.GetVariable("loose")->version, 0) << "the batch changed nothing";
  ASSERT_OK(core_.Initialize({}, {{"loose", std::nullopt}}));
  EXPECT_TRUE(std::isinf(Floats(*core_.Read("loose")->value)[2]));
  EXPECT_THAT(core_.Read("strict"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(CoordinatorTest, X2_AssignWrongSpec_FailedPreconditionNothingChanges) {
  Create(Def("w", 2));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  EXPECT_THAT(Assign("w", F32({1, 2})), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto f64 = Tensor::Zeros(TensorSpec{DType::kFloat64, {3}});
  EXPECT_THAT(Assign("w", std::make_shared<const Tensor>(*std::move(f64))),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Assign("nope", F32({1, 2, 3})), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(core_.Read("w")->version, 1);
}

TEST_F(CoordinatorTest, X2_AssignBatch_OneBadItemChangesNothing) {
  Create(Def("a", 2));
  Create(Def("b", 2));
  ASSERT_OK(Assign("a", F32({1, 1, 1})));
  ASSERT_OK(Assign("b", F32({1, 1, 1})));
  EXPECT_THAT(core_.AssignBatch({}, {{"a", AssignOp::kAssign, F32({5, 5, 5})},
                                     {"b", AssignOp::kAssign, F32({NAN, 5, 5})}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Floats(*core_.Read("a")->value), (std::vector<float>{1, 1, 1}));
}

TEST_F(CoordinatorTest, X2_BadVariableNames_InvalidArgument) {
  for (const char* bad : {"", "/lead", "trail/", "a//b", "a/../b", "sp ace", "ü"}) {
    EXPECT_THAT(core_.CreateVariables({}, {{Def(bad, 1), {}}}),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST_F(CoordinatorTest, F2_NewIncarnation_ResyncedBeforeRegisterReturns) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  SilenceTpuWorker(1);  // it comes back as a new process below
  EXPECT_EQ(core_.GetVariable("w")->replicas[2].state, ReplicaState::kUnavailable);
  Register("tpu_worker", 1, 2, 555);
  auto view = core_.GetVariable("w");
  auto held = workers_.Get("tpu_worker:1", view->id, 2);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->incarnation, 555u);
  EXPECT_EQ(held->version, 1);
  EXPECT_EQ(view->replicas[2].state, ReplicaState::kUpToDate);
  EXPECT_EQ(view->replicas[3].state, ReplicaState::kUpToDate);
}

// F2: a returning worker is listed (topology, ordinals, expected tasks) only
// once its replicas were resynced; until then it is registered and takes
// writes, but nobody sees it.
TEST_F(CoordinatorTest, F2_ReturningWorker_ListedOnlyAfterItsResync) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  SilenceTpuWorker(1);
  ASSERT_EQ(core_.registry().Snapshot().accelerators.size(), 4u);

  workers_.HoldWritesOf(core_.GetVariable("w")->id);  // the resync waits
  absl::Notification registered;
  std::thread worker([&] {
    Register("tpu_worker", 1, 2, 555);
    registered.Notify();
  });
  while (workers_.parked() == 0) std::this_thread::yield();  // resyncing now
  TopologySnapshot during = core_.registry().Snapshot();
  EXPECT_EQ(during.tasks.size(), 3u) << "listed before its resync";
  EXPECT_EQ(during.accelerators.size(), 4u);
  EXPECT_FALSE(registered.HasBeenNotified());
  workers_.ReleaseWrites();
  worker.join();
  TopologySnapshot after = core_.registry().Snapshot();
  EXPECT_EQ(after.tasks.size(), 4u);
  EXPECT_EQ(after.accelerators.size(), 6u);
  EXPECT_GT(after.version, during.version) << "watchers learn it joined";
  EXPECT_EQ(core_.GetVariable("w")->replicas[2].state, ReplicaState::kUpToDate);
}

// F2 across a restart: the coordinator stopped after recording a returning
// worker's registration and before it was resynced and listed. The join is
// recorded, so the restarted coordinator keeps it out of the topology and
// finishes it (resync, then listed) before serving.
TEST_F(CoordinatorTest, F2_RestartMidJoin_TheJoinIsFinishedBeforeTheWorkerIsListed) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  const uint64_t id = core_.GetVariable("w")->id;
  SilenceTpuWorker(1);
  // A new process of tpu_worker:1 (holding nothing) registers; the
  // coordinator stops before it resyncs it.
  WorkerRegistration r{"tpu_worker", 1, "h1:1", 555, {}};
  for (int i = 0; i < 2; ++i) {
    r.devices.push_back(absl::StrCat("/job:tpu_worker/replica:0/task:1/device:TPU:", i));
  }
  for (int32_t replica : {2, 3}) {
    workers_.Plant("tpu_worker:1", id, replica, {0, 0, 555, F32({0, 0, 0})});  // holds nothing
  }
  ASSERT_OK(core_.registry().Register(r, nullptr, /*joining=*/true));
  EXPECT_EQ(core_.registry().Snapshot().tasks.size(), 3u) << "listed before its resync";

  Coordinator after(CoordinatorOptions{}, &clock_, &workers_, &log_);
  ASSERT_OK(after.Recover());
  auto held = workers_.Get("tpu_worker:1", id, 2);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->version, 1) << "listed without its resync";
  EXPECT_EQ(after.GetVariable("w")->replicas[2].state, ReplicaState::kUpToDate);
  EXPECT_EQ(after.registry().Snapshot().tasks.size(), 4u);
  EXPECT_EQ(after.registry().Joining().size(), 0u);
}

// F3 with a roll-forward commit: a small assign is answered once its
// WritePrepared is durable and every replica took it, without waiting for
// its commit's own sync. A power loss that takes every record nobody waited
// for (the commit among them) loses nothing the caller was told: the
// restart commits the prepared write - same version, value and answer.
TEST_F(CoordinatorTest, F3_AnsweredSmallWrite_SurvivesLosingEveryUnsyncedRecord) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  auto answered = Assign("w", F32({4, 5, 6}), AssignOp::kAssign, "req-rf");
  ASSERT_OK(answered);
  ASSERT_EQ(answered->version, 2);
  std::vector<Record> synced = log_.Synced();
  ASSERT_LT(synced.size(), log_.records().size())
      << "the commit was synced before the answer: nothing here is rolled forward";

  MemoryStateLog after_power_loss(std::move(synced));
  Coordinator after(CoordinatorOptions{}, &clock_, &workers_, &after_power_loss);
  ASSERT_OK(after.Recover());
  auto view = after.GetVariable("w");
  ASSERT_OK(view);
  EXPECT_EQ(view->version, 2);
  EXPECT_EQ(view->checksum, answered->checksum);
  EXPECT_EQ(Floats(*after.Read("w")->value), (std::vector<float>{4, 5, 6}));
  // The replicas took it before the answer: verified, they are current.
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(view->replicas[i].state, ReplicaState::kUpToDate) << "replica " << i;
  }
  // C6: the retry is answered, not applied again.
  auto value = F32({4, 5, 6});
  auto retry =
      after.Assign(RequestKey{"req-rf", value->checksum ^ static_cast<uint64_t>(AssignOp::kAssign)},
                   {"w", AssignOp::kAssign, value});
  ASSERT_OK(retry);
  EXPECT_EQ(retry->version, 2);
  EXPECT_EQ(after.GetVariable("w")->version, 2);
}

// ... and a write that failed is resolved in a record synced before the
// caller hears of the failure: the restart does not roll it forward.
TEST_F(CoordinatorTest, F3_FailedSmallWrite_NotRolledForwardAfterLosingUnsyncedRecords) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  workers_.Fail("tpu_worker:2", absl::UnavailableError("connection refused"));
  EXPECT_THAT(Assign("w", F32({7, 7, 7})), StatusIs(absl::StatusCode::kUnavailable));
  MemoryStateLog after_power_loss(log_.Synced());
  Coordinator after(CoordinatorOptions{}, &clock_, &workers_, &after_power_loss);
  ASSERT_OK(after.Recover());
  EXPECT_EQ(after.GetVariable("w")->version, 1);
  EXPECT_EQ(Floats(*after.Read("w")->value), (std::vector<float>{1, 2, 3}));
}

// F1: a write waiting on a worker that is declared dead fails then, not at
// the call's own deadline (30 s and more).
TEST_F(CoordinatorTest, F1_WorkerDeclaredDeadMidWrite_CallsCancelled_WriteFailsAtOnce) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  const uint64_t id = core_.GetVariable("w")->id;
  workers_.SetManual(true);  // every write waits until completed or cancelled
  absl::StatusOr<WriteResult> result;
  std::thread writer([&] { result = Assign("w", F32({7, 7, 7})); });
  while (workers_.parked() < 3) std::this_thread::yield();
  // Two workers answer; tpu_worker:2 went silent.
  ASSERT_TRUE(workers_.CompleteNext());
  ASSERT_TRUE(workers_.CompleteNext());
  SilenceTpuWorker(2);  // declared dead: its call is cancelled
  writer.join();
  workers_.SetManual(false);
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable, "CANCELLED"));
  EXPECT_EQ(workers_.cancels(), 1);
  EXPECT_EQ(core_.GetVariable("w")->version, 1);
  EXPECT_EQ(workers_.Get("tpu_worker:0", id, 0)->version, 2);  // took it: STALE until repaired
  EXPECT_EQ(core_.GetVariable("w")->replicas[0].state, ReplicaState::kStale);
}

// T1: the newer incarnation supersedes the live one at once; the open step
// it took part in fails, naming it.
TEST_F(CoordinatorTest, T1_NewerIncarnation_SupersedesAtOnce_OpenStepFails) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  auto step = testing::BeginStep(core_, 1, absl::Seconds(30));
  ASSERT_OK(step);
  Register("tpu_worker", 1, 2, 9999);
  auto resolved = testing::ResolutionNow(core_, step->epoch);
  ASSERT_OK(resolved);
  EXPECT_EQ(resolved->state, StepState::kFailed);
  EXPECT_THAT(resolved->status, StatusIs(absl::StatusCode::kUnavailable, "tpu_worker:1"));
  EXPECT_EQ(workers_.cancels(), 1);
  // The new process got the committed value before Register returned.
  auto held = workers_.Get("tpu_worker:1", core_.GetVariable("w")->id, 2);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->incarnation, 9999u);
  // The old one is fenced.
  EXPECT_THAT(core_.Heartbeat({"tpu_worker", 1}, 101), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(CoordinatorTest, Delete_RemovesVariableAndNotFoundAfter) {
  Create(Def("w", 2));
  ASSERT_OK(core_.DeleteVariable({}, "w"));
  EXPECT_THAT(core_.GetVariable("w"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(core_.DeleteVariable({}, "w"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinatorTest, Drain_RefusesNewChanges_ReadsGoOn_ResumeServesAgain) {
  Create(Def("w", 2));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  core_.SetDraining(true);
  EXPECT_THAT(Assign("w", F32({4, 5, 6})), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(core_.AssignBatch({}, {{"w", AssignOp::kAssign, F32({4, 5, 6})}}),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(core_.CreateVariables({}, {{Def("x", 2), {}}}),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(core_.DeleteVariable({}, "w"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(core_.Initialize({}, {}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(testing::BeginStep(core_, 1, absl::Seconds(5)),
              StatusIs(absl::StatusCode::kUnavailable));
  // Nothing changed, and reads go on.
  EXPECT_EQ(core_.Read("w")->version, 1);
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{1, 2, 3}));
  EXPECT_THAT(core_.GetVariable("x"), StatusIs(absl::StatusCode::kNotFound));
  core_.SetDraining(false);
  ASSERT_OK(Assign("w", F32({4, 5, 6})));
  EXPECT_EQ(core_.Read("w")->version, 2);
}

}  // namespace
}  // namespace repvar::server

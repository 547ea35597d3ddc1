// SPDX-License-Identifier: Apache-2.0
// The worker's side of steps (S2-S4): the step table with the real step
// resolver and plan runner, a fake coordinator link and fake collectives: no
// sockets, no sleeps (trainers are threads).
#include "worker/core/step_table.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/base/random.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "worker/core/step_resolver.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::Floats;
using ::repvar::testing::StatusIs;

constexpr uint64_t kInc = 7;
constexpr uint64_t kW = 1;  // variable id

// The coordinator as the worker sees it: answers from the test's script.
// The table calls it from several threads at once (commits that wait run on
// its pool), so the calls record under `mu`; the test reads the records once
// those calls have answered.
class FakeLink final : public StepLink {
 public:
  absl::StatusOr<StepInfo> GetStep(uint64_t, uint64_t known_layout) override {
    absl::MutexLock lock(&mu);
    known_layouts.push_back(known_layout);
    if (known_layout != 0 && known_layout == info.layout_id) {
      StepInfo header = info;
      header.participants.clear();
      header.variables.clear();
      header.layout_omitted = true;
      return header;
    }
    return info;
  }
  absl::StatusOr<std::variant<StepPlan, StepResolution>> ReportStep(const WorkerReport& report,
                                                                    absl::Duration) override {
    absl::MutexLock lock(&mu);
    reports.push_back(report);
    return plan;
  }
  // With `defer_reports`, a report's answer waits in `deferred` until the
  // test gives it (the barrier resolving later, on another thread).
  void ReportStepAsync(const WorkerReport& report, absl::Duration timeout,
                       absl::AnyInvocable<void(ReportAnswer) &&> done) override {
    if (!defer_reports) {
      StepLink::ReportStepAsync(report, timeout, std::move(done));
      return;
    }
    absl::MutexLock lock(&mu);
    reports.push_back(report);
    deferred = std::move(done);
  }
  absl::StatusOr<StepResolution> FinishStep(const WorkerFinish& finish, absl::Duration) override {
    if (before_answer) before_answer();
    absl::MutexLock lock(&mu);
    finishes.push_back(finish);
    if (!finish_error.ok()) return finish_error;
    return resolution;
  }
  absl::StatusOr<StepResolution> WaitStep(uint64_t, absl::Duration, bool) override {
    return resolution;
  }

  absl::Mutex mu;
  StepInfo info;
  std::variant<StepPlan, StepResolution> plan;
  StepResolution resolution;
  absl::Status finish_error;            // FinishStep fails with it (the answer was lost)
  std::function<void()> before_answer;  // runs as FinishStep is answered
  std::vector<WorkerReport> reports;
  std::vector<WorkerFinish> finishes;
  std::vector<uint64_t> known_layouts;
  bool defer_reports = false;
  absl::AnyInvocable<void(ReportAnswer) &&> deferred;
};

// Collectives of a group where the other members contribute `others`.
class FakeCollectives final : public Collectives {
 public:
  absl::Status Broadcast(const CollectiveSpec&, std::span<std::byte>, ChecksumStream*,
                         ArrivingBytes*) override {
    return absl::OkStatus();
  }
  absl::Status Allreduce(const CollectiveSpec&, AccumType, std::span<std::byte> bytes) override {
    auto* f = reinterpret_cast<float*>(bytes.data());
    for (size_t i = 0; i < bytes.size() / 4; ++i) f[i] += others;
    return absl::OkStatus();
  }
  float others = 0;
};

class LocalStepsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Step 3: this worker (participant 0) holds replicas 0 and 1 of w (of 4).
    StepInfo& info = link_.info;
    info.step = 3;
    info.epoch = 11;
    info.state = StepState::kOpen;
    info.barrier_timeout = absl::Seconds(1);
    for (auto [task, incarnation] : {std::pair<int32_t, uint64_t>{0, kInc}, {1, 8}}) {
      StepParticipant p;
      p.task = TaskKey{"tpu_worker", task};
      p.incarnation_digest = IncarnationDigest(incarnation);  // what the wire carries
      info.participants.push_back(p);
    }
    StepVariable w;
    w.id = kW;
    w.name = "w";
    w.aggregation = Aggregation::kMean;
    w.spec = TensorSpec{DType::kFloat32, {2}};
    w.replica_participant = {0, 0, 1, 1};
    info.variables.push_back(w);
    info.layout_id = 77;
    auto begin = F32({1, 2});
    ASSERT_TRUE(store_.Apply({ReplicaWrite{kW, "w", 5, {0, 1}, begin}}).ok());
  }
  absl::StatusOr<StepResolution> Commit(int64_t step, uint64_t epoch,
                                        std::vector<std::string> devices, absl::Duration wait) {
    return steps_.Commit(step, epoch, devices, absl::Now() + wait);
  }
  // The coordinator answers the finish with a short resolution: w (the
  // layout's one variable) committed, with `digest`.
  void AnswerShort(uint64_t digest) {
    StepResolution& res = link_.resolution;
    res.state = StepState::kCommitted;
    res.short_form = true;
    res.layout_id = 77;
    res.changed_ranges = IndexRanges::All(1);
    res.changed_digest = digest;
  }
  // Step 3 plans a MEAN allreduce of w; this host writes deltas +4
  // (replica 0) and +8 (replica 1), the other host adds 12.
  void WriteMeanStep() {
    StepPlan plan;
    plan.group = "g";
    plan.timeout = absl::Seconds(1);
    StepCollective c;
    c.kind = StepCollective::Kind::kAllreduce;
    c.variables = IndexRanges::All(1);  // w, the layout's one variable
    plan.collectives.push_back(c);
    plan.changed = IndexRanges::All(1);
    link_.plan = plan;
    ASSERT_OK(steps_.Write(3, 11, {{kW, 0, F32({5, 6})}}));
    ASSERT_OK(steps_.Write(3, 11, {{kW, 1, F32({9, 10})}}));
    collectives_.others = 12;
  }
  StepResolution& PlannedResolution() {
    link_.plan = StepResolution{};
    return std::get<StepResolution>(link_.plan);
  }

  const WorkerIdentity me_{"tpu_worker", 0, kInc, {"TPU:0", "TPU:1"}};
  FakeLink link_;
  FakeCollectives collectives_;
  ReplicaStore store_;
  StepResolver resolver_{me_, &store_, &link_, &collectives_};
  StepTable steps_{me_, &store_, &link_, &resolver_};
};

TEST_F(LocalStepsTest, S2_WritesAreStepLocalCopies_DiscardLeavesReplicasAsCommitted) {
  ASSERT_OK(steps_.Write(3, 11, {{kW, 0, F32({9, 9})}}));
  auto in_step = steps_.Read(11, kW, 0);
  ASSERT_OK(in_step);
  EXPECT_EQ(Floats(*in_step->value), (std::vector<float>{9, 9}));
  auto committed = steps_.Read(0, kW, 0);
  ASSERT_OK(committed);
  EXPECT_EQ(Floats(*committed->value), (std::vector<float>{1, 2}));
  steps_.Discard(11);
  EXPECT_EQ(Floats(*steps_.Read(11, kW, 0)->value), (std::vector<float>{1, 2}));
  EXPECT_THAT(steps_.Write(3, 11, {{kW, 0, F32({9, 9})}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no longer open"));
  EXPECT_TRUE(link_.reports.empty());
}

TEST_F(LocalStepsTest, S1_LayoutKeptAcrossSteps_OnlyTheHeaderIsFetchedAgain) {
  ASSERT_OK(steps_.Write(3, 11, {{kW, 0, F32({9, 9})}}));
  steps_.Discard(11);
  link_.info.step = 4;
  link_.info.epoch = 12;
  ASSERT_OK(steps_.Write(4, 12, {{kW, 1, F32({8, 8})}}));  // the cached layout serves
  EXPECT_EQ(link_.known_layouts, (std::vector<uint64_t>{0, 77}));
  link_.info.layout_id = 78;  // membership changed: a new layout comes whole
  link_.info.step = 5;
  link_.info.epoch = 13;
  ASSERT_OK(steps_.Write(5, 13, {{kW, 1, F32({8, 8})}}));
  EXPECT_EQ(link_.known_layouts.back(), 77u);
  link_.info.step = 6;
  link_.info.epoch = 14;
  ASSERT_OK(steps_.Write(6, 14, {{kW, 1, F32({8, 8})}}));
  EXPECT_EQ(link_.known_layouts.back(), 78u);
}

TEST_F(LocalStepsTest, S4_LateTrainer_GetsTheResolutionOfAStepAlreadyOver) {
  link_.info.state = StepState::kFailed;
  link_.resolution.state = StepState::kFailed;
  link_.resolution.status = absl::DeadlineExceededError("missing: tpu_worker:1");
  auto r = Commit(3, 11, {}, absl::Seconds(5));
  ASSERT_OK(r);
  EXPECT_EQ(r->status.message(), "missing: tpu_worker:1");
  EXPECT_TRUE(link_.reports.empty());
}

TEST_F(LocalStepsTest, S1_TrainersHintOfAKnownLayout_NoFetchAtAll) {
  ASSERT_OK(steps_.Write(3, 11, {{kW, 0, F32({9, 9})}}));  // fetches step 3 and its layout
  steps_.Discard(11);
  ASSERT_EQ(link_.known_layouts.size(), 1u);
  steps_.Hint(4, 12, 77, absl::Seconds(5));  // as a trainer's call says it
  ASSERT_OK(steps_.Write(4, 12, {{kW, 1, F32({8, 8})}}));
  EXPECT_EQ(link_.known_layouts.size(), 1u);  // the coordinator was not asked
  steps_.Hint(5, 13, 99, absl::Seconds(5));   // a layout this worker does not hold
  link_.info.step = 5;
  link_.info.epoch = 13;
  ASSERT_OK(steps_.Write(5, 13, {{kW, 1, F32({8, 8})}}));
  EXPECT_EQ(link_.known_layouts.size(), 2u);  // so it asks
}

TEST_F(LocalStepsTest, S2_WriteRefusals) {
  EXPECT_THAT(steps_.Write(3, 11, {{kW + 1, 0, F32({1, 1})}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "join the next one"));
  EXPECT_THAT(steps_.Write(3, 11, {{kW, 2, F32({1, 1})}}),
              StatusIs(absl::StatusCode::kNotFound, "not held by this worker"));
  EXPECT_THAT(steps_.Write(3, 11, {{kW, 0, F32({1, 1, 1})}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(steps_.Write(4, 11, {{kW, 0, F32({1, 1})}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "belongs to step 3"));
}

TEST_F(LocalStepsTest, S3_TwoTrainersPerHost_OneReportOnceEveryDeviceCommitted) {
  PlannedResolution().state = StepState::kCommitted;
  PlannedResolution().step = 3;
  ASSERT_OK(steps_.Write(3, 11, {{kW, 0, F32({1, 2})}}));  // unchanged: not reported
  ASSERT_OK(steps_.Write(3, 11, {{kW, 1, F32({3, 4})}}));
  absl::StatusOr<StepResolution> first;
  std::thread t0([&] { first = Commit(3, 11, {"TPU:0"}, absl::Seconds(30)); });
  auto second = Commit(3, 11, {"/job:tpu_worker/replica:0/task:0/device:TPU:1"}, absl::Seconds(30));
  t0.join();
  ASSERT_OK(first);
  ASSERT_OK(second);
  EXPECT_EQ(first->step, second->step);
  EXPECT_EQ(first->state, second->state);
  ASSERT_EQ(link_.reports.size(), 1u);
  const WorkerReport& r = link_.reports[0];
  EXPECT_EQ(r.incarnation, kInc);
  EXPECT_EQ(r.changed, IndexRanges::All(1)) << "w (MEAN) changed here";
  EXPECT_TRUE(r.replicas.empty());
  EXPECT_THAT(Commit(3, 11, {"GPU:0"}, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// The commit that completes the host sends the report and returns: no
// thread waits for the barrier. The answer, when it comes (on the link's
// thread), resolves the step and answers the trainer from there.
TEST_F(LocalStepsTest, S3_CommitAsync_TheHostsLastCommitReturnsBeforeTheBarrier_TheAnswerEndsIt) {
  StepResolution& planned = PlannedResolution();
  planned.state = StepState::kCommitted;
  planned.step = 3;
  link_.defer_reports = true;
  ASSERT_OK(steps_.Write(3, 11, {{kW, 1, F32({3, 4})}}));  // the step is known here now
  std::optional<absl::StatusOr<StepResolution>> got;
  std::thread::id answered_on;
  steps_.CommitAsync(3, 11, {}, absl::Now() + absl::Seconds(30),
                     [&](absl::StatusOr<StepResolution> r) {
                       got = std::move(r);
                       answered_on = std::this_thread::get_id();
                     });
  ASSERT_EQ(link_.reports.size(), 1u);  // reported, and returned
  EXPECT_FALSE(got.has_value());
  EXPECT_THAT(steps_.Write(3, 11, {{kW, 1, F32({5, 6})}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no longer open"));
  std::thread barrier([&] { std::move(link_.deferred)(link_.plan); });
  const std::thread::id barrier_id = barrier.get_id();
  barrier.join();
  ASSERT_TRUE(got.has_value());
  ASSERT_OK(*got);
  EXPECT_EQ((*got)->state, StepState::kCommitted);
  EXPECT_EQ(answered_on, barrier_id);
  // The step is closed: a late trainer's commit gets the same resolution.
  auto late = Commit(3, 11, {"TPU:0"}, absl::Seconds(5));
  ASSERT_OK(late);
  EXPECT_EQ(late->state, StepState::kCommitted);
}

// A commit that has to wait (here: the step is not known yet and must be
// fetched; the host's other device has not committed) runs on the table's
// own threads and still answers once.
TEST_F(LocalStepsTest, S3_CommitAsync_CallsThatWait_RunOnTheTablesThreads_EachAnsweredOnce) {
  StepResolution& planned = PlannedResolution();
  planned.state = StepState::kCommitted;
  planned.step = 3;
  absl::Mutex mu;
  std::vector<absl::StatusOr<StepResolution>> answers;
  auto record = [&](absl::StatusOr<StepResolution> r) {
    absl::MutexLock lock(&mu);
    answers.push_back(std::move(r));
  };
  // An unknown device is refused at once, before the call returns.
  steps_.CommitAsync(3, 11, {"GPU:0"}, absl::Now() + absl::Seconds(30), record);
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(answers.size(), 1u);
  }
  steps_.CommitAsync(3, 11, {"TPU:0"}, absl::Now() + absl::Seconds(30), record);
  steps_.CommitAsync(3, 11, {"TPU:1"}, absl::Now() + absl::Seconds(30), record);
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](decltype(answers)* a) { return a->size() == 3; }, &answers));
  }
  // The two trainers get the step.
  EXPECT_THAT(answers[0], StatusIs(absl::StatusCode::kInvalidArgument, "GPU:0"));
  for (size_t i : {1, 2}) {
    ASSERT_OK(answers[i]);
    EXPECT_EQ(answers[i]->state, StepState::kCommitted);
  }
  EXPECT_EQ(link_.reports.size(), 1u);
}

// A trainer whose host-mate never commits gets DEADLINE_EXCEEDED at its
// deadline, naming the device still missing; nothing is reported, and the
// step stays open for that device, whose commit then completes the host.
TEST_F(LocalStepsTest, S3_CommitAsync_AHostMateNotCommittedByTheDeadline_NamedNothingReported) {
  StepResolution& planned = PlannedResolution();
  planned.state = StepState::kCommitted;
  planned.step = 3;
  ASSERT_OK(steps_.Write(3, 11, {{kW, 0, F32({3, 4})}}));  // the step is known here now
  absl::Notification answered;
  absl::StatusOr<StepResolution> first;
  steps_.CommitAsync(3, 11, {"TPU:0"}, absl::Now(), [&](absl::StatusOr<StepResolution> r) {
    first = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kDeadlineExceeded, "not committed yet: TPU:1"));
  EXPECT_TRUE(link_.reports.empty());
  auto second = Commit(3, 11, {"TPU:1"}, absl::Seconds(30));
  ASSERT_OK(second);
  EXPECT_EQ(second->state, StepState::kCommitted);
  EXPECT_EQ(link_.reports.size(), 1u);
}

TEST_F(LocalStepsTest, S4_MeanPlan_BeginPlusMeanOfDeltas_InstalledWithNewVersion) {
  WriteMeanStep();
  auto expected = F32({7, 8});  // 1,2 + (4 + 8 + 12) / 4
  link_.resolution.state = StepState::kCommitted;
  link_.resolution.changed.push_back(CommittedVariable{kW, "w", 6, expected->checksum});
  auto r = Commit(3, 11, {}, absl::Seconds(30));
  ASSERT_OK(r);
  ASSERT_EQ(link_.finishes.size(), 1u);
  EXPECT_EQ(link_.finishes[0].held, IndexRanges::All(1));
  EXPECT_EQ(link_.finishes[0].digest, DigestTerm(kW, expected->checksum));
  ASSERT_EQ(link_.finishes[0].shard.size(), 1u) << "this worker reports w (replica 0 is its)";
  EXPECT_EQ(link_.finishes[0].shard[0].checksum, expected->checksum);
  for (int32_t replica : {0, 1}) {
    auto got = store_.Get(kW, replica);
    ASSERT_OK(got);
    EXPECT_EQ(got->version, 6);
    EXPECT_EQ(Floats(*got->value), (std::vector<float>{7, 8}));
  }
}

// The short form workers get: the changed variables as layout ranges and
// a digest; each is installed at its version + 1 with the value computed
// here, and the trainers get the list of what this host holds.
TEST_F(LocalStepsTest, S4_ShortResolution_InstalledAtVersionPlusOne_TrainersGetTheList) {
  WriteMeanStep();
  auto expected = F32({7, 8});
  AnswerShort(DigestTerm(kW, expected->checksum));
  auto r = Commit(3, 11, {}, absl::Seconds(30));
  ASSERT_OK(r);
  ASSERT_EQ(r->changed.size(), 1u);
  EXPECT_EQ(r->changed[0].name, "w");
  EXPECT_EQ(r->changed[0].version, 6);
  EXPECT_EQ(r->changed[0].checksum, expected->checksum);
  for (int32_t replica : {0, 1}) {
    auto got = store_.Get(kW, replica);
    ASSERT_OK(got);
    EXPECT_EQ(got->version, 6);
    EXPECT_EQ(Floats(*got->value), (std::vector<float>{7, 8}));
  }
}

// A replica the coordinator rewrote with the committed value before this
// worker heard the answer (a resync after the commit) stays at the
// committed version: the commit lands at the version the step began from,
// plus one, and only where the replica still is at it.
TEST_F(LocalStepsTest, S4_ShortResolution_AReplicaResyncedMeanwhile_KeepsTheCommittedVersion) {
  WriteMeanStep();
  auto expected = F32({7, 8});
  AnswerShort(DigestTerm(kW, expected->checksum));
  link_.before_answer = [&] {
    ASSERT_TRUE(store_.Apply({ReplicaWrite{kW, "w", 6, {0, 1}, expected}}).ok());
  };
  auto r = Commit(3, 11, {}, absl::Seconds(30));
  ASSERT_OK(r);
  ASSERT_EQ(r->changed.size(), 1u);
  EXPECT_EQ(r->changed[0].version, 6);
  for (int32_t replica : {0, 1}) {
    auto got = store_.Get(kW, replica);
    ASSERT_OK(got);
    EXPECT_EQ(got->version, 6) << "not 7: the resync's version is the commit's";
  }
}

// A short resolution whose digest is not that of the values here is not
// installed: the replicas stay as committed before the step.
TEST_F(LocalStepsTest, S4_ShortResolution_DigestMismatch_NothingInstalled) {
  WriteMeanStep();
  auto expected = F32({7, 8});
  AnswerShort(DigestTerm(kW, expected->checksum) + 1);
  auto r = Commit(3, 11, {}, absl::Seconds(30));
  ASSERT_OK(r);
  auto got = store_.Get(kW, 0);
  ASSERT_OK(got);
  EXPECT_EQ(got->version, 5);
  EXPECT_EQ(Floats(*got->value), (std::vector<float>{1, 2}));
}

// Two-phase commit: the answer to this worker's finish was lost (the
// coordinator was killed after recording the commit); asked again, the
// coordinator says the step committed, and the worker installs its values
// as it would have. Discarding them would leave no replica holding the
// committed value.
TEST_F(LocalStepsTest, S4_FinishAnswerLost_CommittedWhenAsked_Installed) {
  WriteMeanStep();
  auto expected = F32({7, 8});
  link_.finish_error = absl::UnavailableError("the coordinator went away");
  link_.resolution.state = StepState::kCommitted;
  link_.resolution.changed.push_back(CommittedVariable{kW, "w", 6, expected->checksum});
  auto r = Commit(3, 11, {}, absl::Seconds(30));
  ASSERT_OK(r);
  EXPECT_EQ(r->state, StepState::kCommitted);
  for (int32_t replica : {0, 1}) {
    auto got = store_.Get(kW, replica);
    ASSERT_OK(got);
    EXPECT_EQ(got->version, 6);
    EXPECT_EQ(Floats(*got->value), (std::vector<float>{7, 8}));
  }
}

TEST_F(LocalStepsTest, S4_FailedResolution_DropsCopiesReplicasUntouched) {
  PlannedResolution().state = StepState::kFailed;
  PlannedResolution().status = absl::DeadlineExceededError("barrier");
  ASSERT_OK(steps_.Write(3, 11, {{kW, 0, F32({5, 6})}}));
  auto r = Commit(3, 11, {}, absl::Seconds(30));
  ASSERT_OK(r);
  EXPECT_EQ(r->state, StepState::kFailed);
  auto got = store_.Get(kW, 0);
  EXPECT_EQ(got->version, 5);
  EXPECT_EQ(Floats(*got->value), (std::vector<float>{1, 2}));
}

// Unmap(hash_later), with the table's hasher run by hand.
class HashLaterTest : public LocalStepsTest {
 protected:
  // Maps replica `r` of w for writing, fills it with `v` through the shared
  // buffer, and publishes it to be hashed later.
  void PublishLater(int32_t r, std::vector<float> v) {
    auto lease = later_.Map(3, 11, kW, r, /*write=*/true, /*initialize=*/false);
    ASSERT_OK(lease);
    ASSERT_EQ(lease->byte_size, v.size() * sizeof(float));
    void* p = mmap(nullptr, lease->byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, lease->fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memcpy(p, v.data(), lease->byte_size);
    munmap(p, lease->byte_size);
    auto sum = later_.Unmap(lease->id, /*publish=*/true, std::nullopt, /*hash_later=*/true);
    ASSERT_OK(sum);
    EXPECT_EQ(*sum, 0u);  // answered before the hash
  }
  // Runs what the table handed to its hasher, newest first (the order a
  // pool of hashers could finish them in).
  void RunHasherNewestFirst() {
    std::vector<std::function<void()>> q = std::move(queued_);
    queued_.clear();
    std::reverse(q.begin(), q.end());
    for (auto& f : q) f();
  }

  std::vector<std::function<void()>> queued_;
  StepTable later_{me_, &store_, &link_, &resolver_,
                   [this](std::function<void()> f) { queued_.push_back(std::move(f)); }};
};

TEST_F(HashLaterTest, S2_PublishAnsweredBeforeItsHash_ThenReadWithItsChecksum) {
  PublishLater(0, {5, 6});
  ASSERT_EQ(queued_.size(), 1u);  // the hash waits for the hasher
  RunHasherNewestFirst();
  auto got = later_.Read(11, kW, 0);
  ASSERT_OK(got);
  EXPECT_EQ(Floats(*got->value), (std::vector<float>{5, 6}));
  EXPECT_EQ(got->checksum, F32({5, 6})->checksum);
  EXPECT_EQ(got->value->checksum, F32({5, 6})->checksum);
}

TEST_F(HashLaterTest, S2_ReadOfAPublishStillBeingHashed_WaitsAndSeesIt) {
  PublishLater(0, {5, 6});
  std::atomic<bool> done = false;
  absl::StatusOr<StoredReplica> got;
  std::thread t([&] {
    got = later_.Read(11, kW, 0);
    done = true;
  });
  for (int64_t i = 0; i < 100'000'000 && later_.HashWaiters() == 0 && !done; ++i) {
    std::this_thread::yield();
  }
  EXPECT_FALSE(done);  // a read without the hash would see the committed value
  RunHasherNewestFirst();
  t.join();
  ASSERT_OK(got);
  EXPECT_EQ(Floats(*got->value), (std::vector<float>{5, 6}));
}

TEST_F(HashLaterTest, S2_LastWriterWins_OverAPublishStillBeingHashed) {
  PublishLater(0, {5, 6});
  ASSERT_OK(later_.Write(3, 11, {{kW, 0, F32({7, 7})}}));  // not held up by the hash
  PublishLater(1, {1, 1});
  PublishLater(1, {2, 2});
  RunHasherNewestFirst();  // the older publishes finish last, and lose
  EXPECT_EQ(Floats(*later_.Read(11, kW, 0)->value), (std::vector<float>{7, 7}));
  EXPECT_EQ(Floats(*later_.Read(11, kW, 1)->value), (std::vector<float>{2, 2}));
}

TEST_F(HashLaterTest, S2_DiscardedWhileHashing_ThePublishIsDropped) {
  PublishLater(0, {5, 6});
  later_.Discard(11);
  RunHasherNewestFirst();
  EXPECT_EQ(Floats(*later_.Read(11, kW, 0)->value), (std::vector<float>{1, 2}));
}

TEST_F(HashLaterTest, S3_CommitWaitsForTheHash_TheReportCountsThePublishedValue) {
  PlannedResolution().state = StepState::kCommitted;
  PlannedResolution().step = 3;
  PublishLater(1, {3, 4});
  std::atomic<bool> done = false;
  absl::StatusOr<StepResolution> r;
  std::thread t([&] {
    r = later_.Commit(3, 11, {}, absl::Now() + absl::Seconds(30));
    done = true;
  });
  // Until the commit waits for the hash (or, wrongly, answers without it).
  for (int64_t i = 0; i < 100'000'000 && later_.HashWaiters() == 0 && !done; ++i) {
    std::this_thread::yield();
  }
  EXPECT_FALSE(done);
  RunHasherNewestFirst();
  t.join();
  ASSERT_OK(r);
  ASSERT_EQ(link_.reports.size(), 1u);
  // Without the hashed copy the report would say nothing changed.
  EXPECT_EQ(link_.reports[0].changed, IndexRanges::All(1));
}

}  // namespace
}  // namespace repvar::worker

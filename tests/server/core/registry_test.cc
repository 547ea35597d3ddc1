// SPDX-License-Identifier: Apache-2.0
// Topology contract T1-T5 against the registry, with a fake clock: no
// sockets, no sleeps.
#include "server/core/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace repvar::server {
namespace {

using ::repvar::testing::StatusIs;

WorkerRegistration Tpu(const std::string& job, int task, int n, uint64_t inc = 7) {
  WorkerRegistration r{job, task, absl::StrCat("10.0.0.", task, ":1"), inc, {}};
  r.devices.push_back(absl::StrCat("/job:", job, "/replica:0/task:", task, "/device:CPU:0"));
  for (int i = 0; i < n; ++i) {
    r.devices.push_back(absl::StrCat("/job:", job, "/replica:0/task:", task, "/device:TPU:", i));
  }
  return r;
}

class MembershipTest : public ::testing::Test {
 protected:
  RegistryOptions Options() {
    RegistryOptions o;
    o.membership.heartbeat_timeout = absl::Seconds(10);
    o.membership.expected_tasks = {{"tpu_worker", 2}};
    return o;
  }
  repvar::testing::FakeClock clock_;
  VolatileStateLog log_;
  Registry m_{Options(), &clock_, &log_};
};

TEST_F(MembershipTest, T1_Register_MalformedDevice_InvalidArgumentAndNothingChanges) {
  for (const char* bad :
       {"/job:/device:TPU:", "/job:w/replica:0/task:-1/device:TPU:0",
        "/job:w/replica:0/task:1e3/device:TPU:0", "/job:w/replica:0/task:99999999999/device:TPU:0",
        "/job:w/replica:0/task:0/device:TPU:0/", "/job:w/replica:0/task:0/device:tpu:0",
        "/job:w/replica:0/task:00/device:TPU:0", "/job:W/replica:0/task:0/device:TPU:0"}) {
    WorkerRegistration r{"w", 0, "h:1", 1, {bad}};
    EXPECT_THAT(m_.Register(r), StatusIs(absl::StatusCode::kInvalidArgument, "devices[0]")) << bad;
  }
  EXPECT_EQ(m_.Snapshot().version, 0);
  EXPECT_TRUE(m_.Snapshot().tasks.empty());
}

TEST_F(MembershipTest, T1_Register_DuplicateDevice_InvalidArgument) {
  WorkerRegistration r = Tpu("tpu_worker", 0, 1);
  r.devices.push_back(r.devices.back());
  EXPECT_THAT(m_.Register(r), StatusIs(absl::StatusCode::kInvalidArgument, "listed twice"));
  EXPECT_EQ(m_.Snapshot().version, 0);
}

TEST_F(MembershipTest, T1_Register_DeviceOfAnotherTask_InvalidArgument) {
  WorkerRegistration r = Tpu("tpu_worker", 0, 1);
  r.devices.push_back("/job:tpu_worker/replica:0/task:1/device:TPU:0");
  EXPECT_THAT(m_.Register(r), StatusIs(absl::StatusCode::kInvalidArgument, "does not belong"));
}

TEST_F(MembershipTest, T1_Register_BadFields_InvalidArgument) {
  EXPECT_THAT(m_.Register({"", 0, "h:1", 1, {}}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(m_.Snapshot().version, 0);
  EXPECT_THAT(m_.Register({"w", -1, "h:1", 1, {}}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(m_.Register({"w", 0, "", 1, {}}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(m_.Register({"w", 0, "h:1", 0, {}}), StatusIs(absl::StatusCode::kInvalidArgument));
  // Bounded: what a registration carries is kept and recorded.
  EXPECT_THAT(m_.Register({"w", 0, std::string(300, 'h'), 1, {}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "address"));
  WorkerRegistration many = Tpu("w", 0, 1025);
  EXPECT_THAT(m_.Register(many), StatusIs(absl::StatusCode::kInvalidArgument, "at most 1024"));
  many.devices.resize(1024);
  ASSERT_OK(m_.Register(many));  // the bound itself is fine
  EXPECT_EQ(m_.Snapshot().version, 1);
}

TEST_F(MembershipTest, T1_Register_SameIncarnation_Idempotent) {
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 2)));
  int64_t v = m_.Snapshot().version;
  auto again = m_.Register(Tpu("tpu_worker", 0, 2));
  ASSERT_OK(again);
  EXPECT_EQ(*again, v);
  EXPECT_EQ(m_.Snapshot().version, v);
  EXPECT_EQ(m_.Snapshot().tasks.size(), 1u);
}

TEST_F(MembershipTest, T1_Register_SameIncarnationOtherDevices_InvalidArgument) {
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 2)));
  EXPECT_THAT(m_.Register(Tpu("tpu_worker", 0, 3)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(m_.Snapshot().accelerators.size(), 2u);
}

// T1: a newer process of a live task supersedes it at once; an
// older one (a paused process coming back) is refused and changes nothing.
TEST_F(MembershipTest, T1_Register_NewerIncarnationSupersedes_OlderOneAborted) {
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 2, 7)));
  int64_t v = m_.Snapshot().version;
  EXPECT_THAT(m_.Register(Tpu("tpu_worker", 0, 2, 6)),
              StatusIs(absl::StatusCode::kAborted, "superseded"));
  EXPECT_EQ(m_.Snapshot().version, v);
  EXPECT_EQ(m_.Snapshot().tasks[0].incarnation, 7u);

  std::optional<LiveTask> superseded;
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 2, 8), &superseded));
  ASSERT_TRUE(superseded.has_value());
  EXPECT_EQ(superseded->incarnation, 7u);
  EXPECT_EQ(m_.Snapshot().version, v + 1) << "one record: the old one dies, the new one joins";
  EXPECT_EQ(m_.Snapshot().tasks[0].incarnation, 8u);
  // The old process is fenced.
  EXPECT_THAT(m_.Heartbeat({"tpu_worker", 0}, 7), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(m_.Register(Tpu("tpu_worker", 0, 2, 7)), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(MembershipTest, T2_Ordinals_DeterministicWhateverTheRegistrationOrder) {
  std::vector<int> tasks = {0, 1, 2, 9, 10, 11};
  std::vector<std::string> reference;
  std::mt19937 rng(1);
  for (int trial = 0; trial < 5; ++trial) {
    Registry m(Options(), &clock_, &log_);
    std::shuffle(tasks.begin(), tasks.end(), rng);
    for (int t : tasks) ASSERT_OK(m.Register(Tpu("tpu_worker", t, 2)));
    std::vector<std::string> order;
    for (const auto& a : m.Snapshot().accelerators) order.push_back(a.device.ToString());
    if (reference.empty()) reference = order;
    EXPECT_EQ(order, reference);
  }
  ASSERT_EQ(reference.size(), 12u);
  EXPECT_EQ(reference[0], "/job:tpu_worker/replica:0/task:0/device:TPU:0");
  // task:10 sorts after task:9 (numeric, not lexicographic).
  EXPECT_EQ(reference[6], "/job:tpu_worker/replica:0/task:9/device:TPU:0");
  EXPECT_EQ(reference[8], "/job:tpu_worker/replica:0/task:10/device:TPU:0");
}

TEST_F(MembershipTest, T2_Ordinals_DeviceIdsNumeric) {
  WorkerRegistration r = Tpu("tpu_worker", 0, 11);
  ASSERT_OK(m_.Register(r));
  auto acc = m_.Snapshot().accelerators;
  ASSERT_EQ(acc.size(), 11u);
  EXPECT_EQ(acc[2].device.id, 2);
  EXPECT_EQ(acc[10].device.id, 10);
}

TEST_F(MembershipTest, T3_InfeedHost_IsTheJobThatOwnsTpu0NotADefault) {
  // A CPU-only "worker" job registers first and sorts first; it must not win.
  WorkerRegistration cpu{"worker", 0, "cpu:1", 3, {"/job:worker/replica:0/task:0/device:CPU:0"}};
  ASSERT_OK(m_.Register(cpu));
  EXPECT_FALSE(m_.Snapshot().infeed_host.has_value());
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 1, 2)));
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 2)));
  auto infeed = m_.Snapshot().infeed_host;
  ASSERT_TRUE(infeed.has_value());
  EXPECT_EQ(infeed->task.job, "tpu_worker");
  EXPECT_EQ(infeed->task.task, 0);
  EXPECT_EQ(infeed->address, "10.0.0.0:1");
  EXPECT_EQ(infeed->cpu_device, "/job:tpu_worker/replica:0/task:0/device:CPU:0");
}

TEST_F(MembershipTest, T4_Version_BumpsOnEveryMembershipChange) {
  EXPECT_EQ(m_.Snapshot().version, 0);
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 1)));
  EXPECT_EQ(m_.Snapshot().version, 1);
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 1, 1)));
  EXPECT_EQ(m_.Snapshot().version, 2);
  clock_.Advance(absl::Seconds(11));
  m_.CheckHeartbeats(clock_.Now());
  EXPECT_EQ(m_.Snapshot().version, 3);
  // A watcher behind the current version returns at once.
  EXPECT_EQ(m_.WaitForChange(2, absl::InfinitePast()).version, 3);
}

TEST_F(MembershipTest, T4_WaitForExpected_TimeoutNamesMissingTasks) {
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 1)));
  auto r = m_.WaitForExpected(absl::InfinitePast());
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kDeadlineExceeded, "tpu_worker:1"));
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 1, 1)));
  ASSERT_OK(m_.WaitForExpected(absl::InfinitePast()));
}

TEST_F(MembershipTest, T5_SilentWorker_DeclaredDeadSlotFreedVersionBumps) {
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 1, 7)));
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 1, 1)));
  clock_.Advance(absl::Seconds(6));
  ASSERT_OK(m_.Heartbeat({"tpu_worker", 1}, 7));
  clock_.Advance(absl::Seconds(6));  // task 0 silent 12s, task 1 silent 6s
  auto dead = m_.CheckHeartbeats(clock_.Now());
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].key.task, 0);
  EXPECT_EQ(m_.Snapshot().tasks.size(), 1u);
  EXPECT_EQ(m_.Snapshot().version, 3);
  EXPECT_THAT(m_.Heartbeat({"tpu_worker", 0}, 7), StatusIs(absl::StatusCode::kNotFound));
  // The slot is free: a new incarnation may take it.
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 1, 99)));
}

// C8: a newer incarnation takes the task over at once (T1), and the old
// one's read lease is kept as the time before which no new value may be
// committed (the old process may still be serving reads).
TEST_F(MembershipTest, C8_NewIncarnation_SupersededReadLeaseKept) {
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 1, 7)));
  // Without asking for a lease (no local reads), none is granted or waited for.
  auto none = m_.Heartbeat({"tpu_worker", 0}, 7);
  ASSERT_OK(none);
  EXPECT_EQ(none->read_lease, absl::ZeroDuration());
  auto grant = m_.Heartbeat({"tpu_worker", 0}, 7, /*read_lease=*/true);
  ASSERT_OK(grant);
  EXPECT_EQ(grant->read_lease, absl::Seconds(3));
  EXPECT_EQ(m_.SupersededLeasesEnd(), absl::InfinitePast());
  const absl::Time granted = clock_.Now();
  clock_.Advance(absl::Seconds(1));
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 1, 8)));
  EXPECT_EQ(m_.Find({"tpu_worker", 0})->incarnation, 8u);
  // Past the lease and its drift margin.
  EXPECT_GT(m_.SupersededLeasesEnd(), granted + absl::Seconds(3));
  EXPECT_LT(m_.SupersededLeasesEnd(), granted + absl::Seconds(4));
}

TEST_F(MembershipTest, C8_ReadLease_AtMostAThirdOfTheHeartbeatTimeout) {
  RegistryOptions o = Options();
  o.membership.heartbeat_timeout = absl::Seconds(1);
  Registry r(o, &clock_, &log_);
  ASSERT_OK(r.Register(Tpu("tpu_worker", 0, 1, 7)));
  auto grant = r.Heartbeat({"tpu_worker", 0}, 7, true);
  ASSERT_OK(grant);
  EXPECT_EQ(grant->read_lease, absl::Milliseconds(1000) / 3);
  EXPECT_THAT(r.Heartbeat({"tpu_worker", 0}, 7, true, std::vector<HeldValue>(4097)),
              StatusIs(absl::StatusCode::kInvalidArgument, "4096"));
}

TEST_F(MembershipTest, T5_Heartbeat_StaleIncarnation_Aborted) {
  ASSERT_OK(m_.Register(Tpu("tpu_worker", 0, 1, 7)));
  EXPECT_THAT(m_.Heartbeat({"tpu_worker", 0}, 8), StatusIs(absl::StatusCode::kAborted));
}

// A log whose syncs wait for the test: Durable(p) returns once p is released.
class GatedLog final : public StateLog {
 public:
  absl::StatusOr<uint64_t> Append(Record&) override {
    absl::MutexLock lock(&mu_);
    return ++appended_;
  }
  absl::Status Durable(uint64_t position) override {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    changed_.SignalAll();
    while (released_ < position) changed_.Wait(&mu_);
    --waiting_;
    return absl::OkStatus();
  }
  bool IsDurable(uint64_t position) override {
    absl::MutexLock lock(&mu_);
    return released_ >= position;
  }
  void Release(uint64_t position) {
    absl::MutexLock lock(&mu_);
    released_ = position;
    changed_.SignalAll();
  }
  // Blocks until `n` callers wait in Durable.
  void AwaitWaiting(int n) {
    absl::MutexLock lock(&mu_);
    while (waiting_ < n) changed_.Wait(&mu_);
  }

 private:
  absl::Mutex mu_;
  absl::CondVar changed_;
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// Group commit: a registration is applied at once (the next caller builds
// on it) but neither its answer nor a read that saw it returns before the
// log says it is durable; what was durable already is answered at once.
TEST(RegistryDurabilityTest, AnswersAndReadsWaitUntilWhatTheySawIsDurable) {
  repvar::testing::FakeClock clock;
  GatedLog log;
  Registry r(RegistryOptions{}, &clock, &log);
  EXPECT_EQ(r.Snapshot().version, 0);  // nothing recorded: no wait

  std::atomic<bool> registered{false}, read{false};
  std::thread writer([&] {
    EXPECT_OK(r.Register(Tpu("tpu_worker", 0, 2)));
    registered = true;
  });
  log.AwaitWaiting(1);
  std::thread reader([&] {
    EXPECT_EQ(r.Snapshot().tasks.size(), 1u);  // it sees the registration...
    read = true;
  });
  log.AwaitWaiting(2);  // ...and waits for it with the writer
  EXPECT_FALSE(registered);
  EXPECT_FALSE(read);
  log.Release(1);
  writer.join();
  reader.join();
  EXPECT_TRUE(registered && read);
  EXPECT_EQ(r.Snapshot().tasks.size(), 1u);  // durable now: answered at once
}

// A caller that must not wait (gRPC's callback thread) reads the state only
// once what it read is durable: ReadIfDurable gives nullopt while a record it
// would see waits for its sync, and the state once the sync is done.
TEST(RegistryDurabilityTest, ReadIfDurable_NothingBeforeWhatItSawIsDurable) {
  repvar::testing::FakeClock clock;
  GatedLog log;
  Registry r(RegistryOptions{}, &clock, &log);
  auto workers = [](const ClusterState& s) { return s.workers().size(); };
  EXPECT_EQ(r.ReadIfDurable(workers), std::optional<size_t>(0));  // nothing recorded
  std::thread writer([&] { EXPECT_OK(r.Register(Tpu("tpu_worker", 0, 2))); });
  log.AwaitWaiting(1);
  EXPECT_EQ(r.ReadIfDurable(workers), std::nullopt) << "record 1 applied, not yet durable";
  log.Release(1);
  writer.join();
  EXPECT_EQ(r.ReadIfDurable(workers), std::optional<size_t>(1));
}

// What a write decides on (Peek) and the fences it sends (NextFence, once
// its block's reservation is durable) do not wait for other writers'
// records to be synced: writers running together wait once, at their
// commits. AwaitDurable, which a refusal goes through, does wait.
TEST(RegistryDurabilityTest, PeekAndFencesDoNotWaitForOtherWritersSyncs) {
  repvar::testing::FakeClock clock;
  GatedLog log;
  Registry r(RegistryOptions{}, &clock, &log);
  std::thread reserve([&] { EXPECT_OK(r.NextFence()); });  // reserves a block: waits
  log.AwaitWaiting(1);
  log.Release(1);
  reserve.join();

  std::atomic<bool> registered{false};
  std::thread writer([&] {
    EXPECT_OK(r.Register(Tpu("tpu_worker", 0, 2)));  // record 2, not yet synced
    registered = true;
  });
  log.AwaitWaiting(1);
  EXPECT_EQ(r.Peek([](const ClusterState& s) { return s.workers().size(); }), 1u);
  auto fence = r.NextFence();
  EXPECT_OK(fence);
  EXPECT_FALSE(registered);
  std::atomic<bool> awaited{false};
  std::thread refusal([&] {
    EXPECT_OK(r.AwaitDurable());
    awaited = true;
  });
  log.AwaitWaiting(2);
  EXPECT_FALSE(awaited);
  log.Release(2);
  writer.join();
  refusal.join();
  EXPECT_TRUE(registered && awaited);
}

// A log that never blocks and remembers how far it was asked to be durable.
class AskedLog final : public StateLog {
 public:
  absl::StatusOr<uint64_t> Append(Record&) override { return ++appended_; }
  absl::Status Durable(uint64_t position) override {
    asked_ = std::max(asked_, position);
    return absl::OkStatus();
  }
  uint64_t asked() const { return asked_; }

 private:
  uint64_t appended_ = 0;
  uint64_t asked_ = 0;
};

// A record reserving fences up to `up_to`.
absl::StatusOr<Record> Reserve(uint64_t up_to) { return Record{{FencesReserved{up_to}}}; }

// Roll-forward commits: a WritePrepared is committed without a wait
// (Durability::kUnsynced) and synced while the write travels
// (AwaitDurable); the commit it decides (Durability::kDecided) is waited
// for by nobody - neither its writer nor a reader who sees it - until a
// later ordinary record, whose sync covers it.
TEST(RegistryDurabilityTest, ARecordADurableOneDecided_IsWaitedForByNobody) {
  repvar::testing::FakeClock clock;
  AskedLog log;
  Registry r(RegistryOptions{}, &clock, &log);
  auto prepared =
      r.Commit([](const ClusterState&) { return Reserve(100); }, Registry::Durability::kUnsynced);
  ASSERT_OK(prepared);
  EXPECT_EQ(*prepared, 1u);
  EXPECT_EQ(log.asked(), 0u) << "an unsynced commit waited";
  ASSERT_OK(r.AwaitDurable(*prepared));
  EXPECT_EQ(log.asked(), 1u);

  ASSERT_OK(r.Commit([](const ClusterState&) { return Reserve(200); },
                     Registry::Durability::kDecided));  // position 2
  EXPECT_EQ(r.Read([](const ClusterState& s) { return s.fences_reserved(); }), 200u);
  EXPECT_EQ(log.asked(), 1u) << "the decided record was waited for";

  // Position 3: waited for, and its sync covers 2.
  ASSERT_OK(r.Commit([](const ClusterState&) { return Reserve(300); }));
  EXPECT_EQ(log.asked(), 3u);
}

}  // namespace
}  // namespace repvar::server

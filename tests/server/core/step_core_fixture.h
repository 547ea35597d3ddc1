// SPDX-License-Identifier: Apache-2.0
// The fixture of the step core tests (step_coordinator_test.cc,
// step_coordinator_writes_test.cc): a coordinator core with a fake clock
// and fake workers, three workers of two accelerators, and helpers that make
// workers' reports and finishes by hand, as a worker would send them.
#ifndef REPVAR_TESTS_SERVER_CORE_STEP_CORE_FIXTURE_H_
#define REPVAR_TESTS_SERVER_CORE_STEP_CORE_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/core/coordinator.h"
#include "server/core/state_log.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_worker_client.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/step_waits.h"
#include "tests/testing/tensors.h"
#include "tests/testing/variables.h"

namespace repvar::server {

using ::repvar::testing::CreateZeroed;
using ::repvar::testing::F32;
using ::repvar::testing::StatusIs;

inline constexpr uint64_t kA = 0xA, kB = 0xB;  // stand-in checksums of local values

// What a restarted coordinator recovers; it can stop recording new values
// (the coordinator stopped between sending a value and recording it: the
// write's WritePrepared was written but lost unsynced, its commit never
// written).
class StoppableLog final : public StateLog {
 public:
  absl::StatusOr<uint64_t> Append(Record& record) override {
    for (const Change& c : record.changes) {
      if (refuse_values && std::holds_alternative<ValueCommitted>(c)) {
        return absl::UnavailableError("the coordinator stopped");
      }
      // Written, and lost by the stop before it was synced.
      if (refuse_values && std::holds_alternative<WritePrepared>(c)) return ++lost_;
    }
    return records_.Append(record);
  }
  absl::Status Recover(ClusterState& state) override { return records_.Recover(state); }
  // Durable never waits; IsDurable says what `durable` says (a sync under
  // way when false).
  bool IsDurable(uint64_t) override { return durable; }
  // A value whose checksum is in `unchecked` stands for a copy in a blob
  // file loaded at a restart: not checked until its first Check.
  absl::Status Check(const Tensor& value) override {
    ++checks;
    unchecked.erase(value.checksum);
    return absl::OkStatus();
  }
  std::optional<absl::Status> CheckIfKnown(const Tensor& value) override {
    if (unchecked.contains(value.checksum)) return std::nullopt;
    return absl::OkStatus();
  }
  bool refuse_values = false;
  bool durable = true;
  std::set<uint64_t> unchecked;
  int checks = 0;

 private:
  MemoryStateLog records_;
  uint64_t lost_ = 1000;
};

class StepCoreTest : public ::testing::Test {
 protected:
  void SetUp() override { RegisterHosts(core_); }
  // Three hosts with two TPUs each (6 replicas: 0,1 | 2,3 | 4,5), plus a
  // CPU-only host that holds nothing.
  static void RegisterHosts(Coordinator& c) {
    for (int t = 0; t < 3; ++t) ASSERT_OK(c.RegisterWorker(TpuWorker(t)));
    ASSERT_OK(
        c.RegisterWorker({"worker", 0, "cpu:1", 5, {"/job:worker/replica:0/task:0/device:CPU:0"}}));
  }
  static uint64_t Inc(int task) { return 100 + static_cast<uint64_t>(task); }
  // tpu_worker:`t`'s registration: two TPUs.
  static WorkerRegistration TpuWorker(int t) {
    WorkerRegistration r{"tpu_worker", t, absl::StrCat("h", t, ":1"), Inc(t), {}};
    for (int i = 0; i < 2; ++i) {
      r.devices.push_back(absl::StrCat("/job:tpu_worker/replica:0/task:", t, "/device:TPU:", i));
    }
    return r;
  }

  uint64_t Create(const std::string& name, Aggregation agg, DType dtype = DType::kFloat32) {
    return CreateZeroed(core_, name, agg, dtype);
  }

  // Task `task`'s participant index in `s`.
  static int32_t Me(const StepInfo& s, int task) {
    for (size_t i = 0; i < s.participants.size(); ++i) {
      if (s.participants[i].task == TaskKey{"tpu_worker", task}) return static_cast<int32_t>(i);
    }
    return -1;
  }
  // The report a worker sends with these replicas changed (SummarizeReport).
  WorkerReport Report(const StepInfo& s, int task, std::vector<ReplicaReport> rr = {},
                      bool detailed = false) {
    WorkerReport r = SummarizeReport(s.variables, Me(s, task), std::move(rr), detailed);
    r.step = s.step;
    r.epoch = s.epoch;
    r.task = TaskKey{"tpu_worker", task};
    r.incarnation = Inc(task);
    return r;
  }
  // The finish a worker sends with these values (SummarizeFinish).
  WorkerFinish Finish(const StepInfo& s, int task, std::vector<PreparedVariable> pv) {
    WorkerFinish f = SummarizeFinish(s.variables, Me(s, task), std::move(pv));
    f.step = s.step;
    f.epoch = s.epoch;
    f.task = TaskKey{"tpu_worker", task};
    f.incarnation = Inc(task);
    return f;
  }
  // Step `step` commits with every replica of `w` (NONE) reporting `value`.
  void CommitAgreedStep(uint64_t w, int64_t step, const Tensor& value, StepInfo* out) {
    auto s = testing::BeginStep(core_, step, absl::Seconds(10));
    ASSERT_OK(s);
    for (int t = 0; t < 3; ++t) {
      ASSERT_OK(core_.ReportStep(
          Report(*s, t, {{w, 2 * t, value.checksum, -1}, {w, 2 * t + 1, value.checksum, -1}})));
    }
    ASSERT_EQ(Resolution(s->epoch).state, StepState::kCommitted);
    *out = *s;
  }
  // "kept", whose value the coordinator holds, and "w" (returned), which a
  // step left at version 2 on its six replicas, each holding `value`: a
  // read of w asks a worker.
  uint64_t KeptAndStepLeft(const Tensor& value) {
    Create("kept", Aggregation::kNone);
    const uint64_t w = Create("w", Aggregation::kNone);
    StepInfo s;
    CommitAgreedStep(w, 1, value, &s);
    for (int i = 0; i < 6; ++i)
      workers_.Install(absl::StrCat("tpu_worker:", i / 2), w, i, 2, value);
    return w;
  }
  StepResolution Resolution(uint64_t epoch) {
    auto r = testing::ResolutionNow(core_, epoch);
    EXPECT_OK(r);
    return r.ok() ? *r : StepResolution{};
  }
  StepPlan Plan(uint64_t epoch, bool detailed = false) {
    auto p = testing::PlanNow(core_, epoch, detailed);
    EXPECT_OK(p);
    EXPECT_TRUE(p.ok() && std::holds_alternative<StepPlan>(*p));
    return p.ok() && std::holds_alternative<StepPlan>(*p) ? std::get<StepPlan>(*p) : StepPlan{};
  }
  // The read lease a heartbeat of tpu_worker:`task` is granted (zero: none).
  absl::Duration LeaseGranted(int task) {
    auto grant = core_.Heartbeat(TaskKey{"tpu_worker", task}, Inc(task), /*read_lease=*/true);
    EXPECT_OK(grant);
    return grant.ok() ? grant->read_lease : absl::ZeroDuration();
  }
  void HeartbeatAll(std::initializer_list<int> tasks) {
    for (int t : tasks) ASSERT_OK(core_.Heartbeat(TaskKey{"tpu_worker", t}, Inc(t)));
  }
  // tpu_worker:2 misses its heartbeats and is declared dead.
  void DeclareTpuWorker2Dead() {
    clock_.Advance(absl::Seconds(30));
    HeartbeatAll({0, 1});
    ASSERT_OK(core_.Heartbeat(TaskKey{"worker", 0}, 5));
    core_.Tick(clock_.Now());
  }

  repvar::testing::FakeClock clock_;
  repvar::testing::FakeWorkerClient workers_;
  static CoordinatorOptions Options() {
    CoordinatorOptions o;
    o.replication.read_cache_bytes = 32;  // four float32[2] values
    return o;
  }
  StoppableLog log_;  // what a restarted coordinator recovers
  Coordinator core_{Options(), &clock_, &workers_, &log_};
};

}  // namespace repvar::server

#endif  // REPVAR_TESTS_SERVER_CORE_STEP_CORE_FIXTURE_H_

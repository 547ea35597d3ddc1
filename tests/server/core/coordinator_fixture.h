// SPDX-License-Identifier: Apache-2.0
// The fixture of the coordinator core tests (coordinator_test.cc,
// coordinator_writes_test.cc): three hosts of two TPUs and a CPU-only host,
// registered with a fake clock and fake workers; no sockets, no sleeps.
#ifndef REPVAR_TESTS_SERVER_CORE_COORDINATOR_FIXTURE_H_
#define REPVAR_TESTS_SERVER_CORE_COORDINATOR_FIXTURE_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
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

namespace repvar::server {

using ::repvar::testing::F32;
using ::repvar::testing::Floats;
using ::repvar::testing::StatusIs;

inline VariableDef Def(const std::string& name, int replicas, std::vector<int64_t> dims = {3},
                       DType dtype = DType::kFloat32) {
  VariableDef d;
  d.name = name;
  d.tensor = TensorSpec{dtype, std::move(dims)};
  d.replica_count = replicas;
  return d;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Three hosts with two TPUs each, plus a CPU-only host.
    for (int t = 0; t < 3; ++t) Register("tpu_worker", t, 2, 100 + t);
    ASSERT_OK(core_.RegisterWorker(
        {"worker", 0, "cpu:1", 5, {"/job:worker/replica:0/task:0/device:CPU:0"}}));
  }
  void Register(const std::string& job, int task, int n, uint64_t inc) {
    WorkerRegistration r{job, task, absl::StrCat("h", task, ":1"), inc, {}};
    for (int i = 0; i < n; ++i) {
      r.devices.push_back(absl::StrCat("/job:", job, "/replica:0/task:", task, "/device:TPU:", i));
    }
    ASSERT_OK(core_.RegisterWorker(r));
  }
  // tpu_worker:`silent` stops heartbeating and is declared dead; the
  // others live on.
  void SilenceTpuWorker(int silent) {
    clock_.Advance(absl::Seconds(6));
    for (int t = 0; t < 3; ++t) {
      if (t == silent) continue;
      ASSERT_OK(core_.Heartbeat({"tpu_worker", t}, 100 + t));
    }
    ASSERT_OK(core_.Heartbeat({"worker", 0}, 5));
    clock_.Advance(absl::Seconds(6));
    core_.Tick(clock_.Now());
  }
  void Create(const VariableDef& def, Initializer init = {}) {
    ASSERT_OK(core_.CreateVariables({}, {{def, init}}));
  }
  absl::StatusOr<WriteResult> Assign(const std::string& name, std::shared_ptr<const Tensor> v,
                                     AssignOp op = AssignOp::kAssign, std::string id = "") {
    uint64_t digest = (v ? v->checksum : 0) ^ static_cast<uint64_t>(op);
    return core_.Assign(RequestKey{std::move(id), digest}, {name, op, std::move(v)});
  }

  repvar::testing::FakeClock clock_;
  repvar::testing::FakeWorkerClient workers_;
  MemoryStateLog log_;  // what a restarted coordinator recovers
  Coordinator core_{CoordinatorOptions{}, &clock_, &workers_, &log_};
};

}  // namespace repvar::server

#endif  // REPVAR_TESTS_SERVER_CORE_COORDINATOR_FIXTURE_H_

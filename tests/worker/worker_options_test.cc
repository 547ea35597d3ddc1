// SPDX-License-Identifier: Apache-2.0
// repvar-worker's settings: valid ones pass; each bad one is refused naming
// its flag; the devices and identity follow --devices or --tpu_devices.
#include "worker/worker_options.h"

#include <gtest/gtest.h>

#include <functional>

#include "tests/testing/status_matchers.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::StatusIs;

WorkerDaemonOptions Valid() {
  WorkerDaemonOptions o;
  o.coordinator_address = "127.0.0.1:1234";
  o.task = 3;
  o.tpu_devices = 2;
  return o;
}

TEST(WorkerOptionsTest, EachBadSetting_RefusedNamingItsFlag) {
  EXPECT_OK(ValidateOptions(Valid()));
  const struct {
    std::function<void(WorkerDaemonOptions&)> spoil;
    const char* names;
  } cases[] = {
      {[](auto& o) { o.coordinator_address.clear(); }, "--coordinator_address"},
      {[](auto& o) { o.job = "TPU"; }, "--job"},
      {[](auto& o) { o.task = -1; }, "--task"},
      {[](auto& o) { o.devices = "/job:tpu_worker/replica:0/task:3/device:TPU:0"; }, "not both"},
      {[](auto& o) {
         o.tpu_devices = -1;
         o.devices = "/job:tpu_worker/task:3/device:TPU:0";
       },
       "--devices"},
      {[](auto& o) { o.max_inflight_bytes = -1; }, "--max_inflight_bytes"},
  };
  for (const auto& c : cases) {
    WorkerDaemonOptions o = Valid();
    c.spoil(o);
    EXPECT_THAT(ValidateOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, c.names))
        << c.names;
  }
}

TEST(WorkerOptionsTest, Devices_VirtualTpusOrTheListGiven_IdentityNamesTheAccelerators) {
  EXPECT_EQ(DeviceNamesOf(Valid()),
            (std::vector<std::string>{"/job:tpu_worker/replica:0/task:3/device:CPU:0",
                                      "/job:tpu_worker/replica:0/task:3/device:TPU:0",
                                      "/job:tpu_worker/replica:0/task:3/device:TPU:1"}));
  WorkerDaemonOptions listed = Valid();
  listed.tpu_devices = -1;
  listed.devices =
      "/job:tpu_worker/replica:0/task:3/device:CPU:0,/job:tpu_worker/replica:0/task:3/device:GPU:1";
  EXPECT_OK(ValidateOptions(listed));
  const WorkerIdentity id = IdentityOf(listed, 77);
  EXPECT_EQ(id.job, "tpu_worker");
  EXPECT_EQ(id.task, 3);
  EXPECT_EQ(id.incarnation, 77u);
  EXPECT_EQ(id.accelerators, (std::vector<std::string>{"GPU:1"}));
}

}  // namespace
}  // namespace repvar::worker

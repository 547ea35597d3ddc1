// SPDX-License-Identifier: Apache-2.0
#include "common/model/device_name.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(DeviceName, Parse_FullName_RoundTrips) {
  auto d = DeviceName::Parse("/job:tpu_worker/replica:0/task:12/device:TPU:3");
  ASSERT_OK(d);
  EXPECT_EQ(d->job, "tpu_worker");
  EXPECT_EQ(d->task, 12);
  EXPECT_EQ(d->type, "TPU");
  EXPECT_EQ(d->id, 3);
  EXPECT_TRUE(d->IsAccelerator());
  EXPECT_EQ(d->ToString(), "/job:tpu_worker/replica:0/task:12/device:TPU:3");
  EXPECT_EQ(d->HostCpu(), "/job:tpu_worker/replica:0/task:12/device:CPU:0");
}

TEST(DeviceName, Parse_Malformed_InvalidArgument) {
  std::string nul("/job:w/replica:0/task:0/device:TPU:0\0", 37);
  for (std::string bad :
       {std::string(""), std::string("job:w/replica:0/task:0/device:TPU:0"),
        std::string("/job:w/replica:0/task:0/device:TPU:0/"),
        std::string("/job:w/task:0/device:TPU:0"),
        std::string("/job:w/replica:0/task:+1/device:TPU:0"),
        std::string("/job:w/replica:0/task:2147483648/device:TPU:0"),
        std::string("/job:ｊob/replica:0/task:0/device:TPU:0"),
        std::string("/job:w/replica:0/task:0/device:FPGA:0"),
        std::string("/job:w/replica:0/task:0/device:TPU:x"),
        std::string("/job:w/job:w/task:0/device:TPU:0"), nul, std::string(300, 'a')}) {
    EXPECT_THAT(DeviceName::Parse(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(DeviceName, Order_IsNumericPerField) {
  auto a = *DeviceName::Parse("/job:w/replica:0/task:9/device:TPU:0");
  auto b = *DeviceName::Parse("/job:w/replica:0/task:10/device:TPU:0");
  EXPECT_LT(a, b);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// V1: replica i on accelerator ordinal i, as Place decides it.
#include "server/core/placement.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace repvar::server {
namespace {

// Two hosts with two TPUs each, in ordinal order.
TopologySnapshot TwoHosts() {
  TopologySnapshot t;
  for (int task : {0, 1}) {
    for (int id : {0, 1}) {
      t.accelerators.push_back(
          Accelerator{static_cast<int32_t>(t.accelerators.size()),
                      *DeviceName::Parse(absl::StrCat("/job:tpu_worker/replica:0/task:", task,
                                                      "/device:TPU:", id)),
                      TaskKey{"tpu_worker", task}});
    }
  }
  return t;
}

TEST(PlacementTest, V1_Place_ReplicaIOnOrdinalI) {
  const TopologySnapshot t = TwoHosts();
  const Placements p = Place(t, 3);
  ASSERT_EQ(p.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p[i].device, t.accelerators[i].device) << i;
    EXPECT_EQ(p[i].task, t.accelerators[i].task) << i;
  }
}

TEST(PlacementTest, V1_OnOneHost_WhenTheFirstNOrdinalsShareATask) {
  const TopologySnapshot t = TwoHosts();
  EXPECT_TRUE(OnOneHost(t, 1));
  EXPECT_TRUE(OnOneHost(t, 2));
  EXPECT_FALSE(OnOneHost(t, 3));
}

}  // namespace
}  // namespace repvar::server

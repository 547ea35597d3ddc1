// SPDX-License-Identifier: Apache-2.0
// V5 at scale: a 1 GiB float32 variable with 2 replicas assigns and reads back
// bit-exactly through chunk streams. Labelled `large` (Release build).
#include <gtest/gtest.h>

#include <numeric>

#include "common/tensor/tensor.h"
#include "repvar/client.h"
#include "tests/testing/cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

TEST(LargeTest, V5_OneGibFloat32_TwoReplicas_RoundTripsBitExactly) {
  testing::TestCluster cluster({.tpu_workers = 2,
                                .tpu_per_worker = 1,
                                .cpu_host = false,
                                .heartbeat_timeout = absl::Seconds(10)});
  ASSERT_OK(cluster.Start());
  auto client = Client::Connect(
      {.coordinator_address = cluster.address(), .deadline = testing::Scaled(absl::Seconds(120))});
  ASSERT_OK(client);
  ASSERT_OK((*client)->WaitForTopology(testing::Scaled(absl::Seconds(20))));
  const int64_t n = int64_t{1} << 28;  // 2^28 floats = 1 GiB
  ASSERT_OK((*client)->CreateVariable(
      {.name = "huge", .dtype = DType::kFloat32, .shape = {n}, .replica_count = 2}));
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000003) * 0.5f;
  auto ack = (*client)->Assign("huge", std::span<const float>(v));
  ASSERT_OK(ack);
  EXPECT_EQ(ack->checksum, Checksum(std::as_bytes(std::span<const float>(v))));
  auto info = (*client)->GetVariable("huge");
  for (const auto& r : info->replicas) EXPECT_EQ(r.state, ReplicaState::kUpToDate);
  auto back = (*client)->Read("huge");
  ASSERT_OK(back);
  ASSERT_EQ(back->bytes.size(), size_t{1} << 30);
  EXPECT_EQ(back->checksum, ack->checksum);
  EXPECT_EQ(std::memcmp(back->bytes.data(), v.data(), back->bytes.size()), 0);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// A peer that stops answering (SIGSTOP here; a host gone or a partition
// alike) fails the calls in flight on our channels once their keepalive
// sees it (common/rpc/credentials.h: about 4 s), not at their deadlines
// (a registration's is 5 minutes). Found by repvar-sim, seed 56: a worker
// whose registration was lost waited out the whole deadline. The control,
// a channel without the keepalive, waits for its deadline.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "common/rpc/credentials.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

// GetTopology with `deadline` from now.
grpc::Status Topology(v1::CoordinatorTrainers::Stub& stub, absl::Duration deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::Topology topology;
  return stub.GetTopology(&ctx, {}, &topology);
}

TEST(KeepaliveTest, PausedCoordinator_CallsFailAtTheKeepalive_NotAtTheirDeadlines) {
  testing::TestCluster cluster(testing::ClusterOptions{.tpu_workers = 1, .cpu_host = false});
  ASSERT_OK(cluster.Start());
  auto ours = v1::CoordinatorTrainers::NewStub(OpenChannel(cluster.address(), {}));
  auto plain = v1::CoordinatorTrainers::NewStub(
      grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials()));
  // Both connected first: the pause then hits calls on live connections.
  ASSERT_TRUE(Topology(*ours, absl::Seconds(10)).ok());
  ASSERT_TRUE(Topology(*plain, absl::Seconds(10)).ok());

  cluster.coordinator().Kill(SIGSTOP);
  grpc::Status with_keepalive;
  grpc::Status without;
  std::thread control([&] { without = Topology(*plain, absl::Seconds(12)); });
  with_keepalive = Topology(*ours, absl::Seconds(45));
  control.join();
  cluster.coordinator().Kill(SIGCONT);

  EXPECT_EQ(with_keepalive.error_code(), grpc::StatusCode::UNAVAILABLE)
      << with_keepalive.error_message();
  EXPECT_EQ(without.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "the control: " << without.error_message();
  // Resumed, the coordinator answers on a fresh connection.
  EXPECT_TRUE(Topology(*ours, absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// Overload does not cost membership: with 1,000 idle streams open against
// the coordinator - more than its synchronous threads (--max_rpc_threads,
// 512 by default), so synchronous calls wait - the workers' heartbeats still
// arrive (they take no such thread), no worker is declared dead, and the
// coordinator serves as before once the streams go.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

class OverloadTest : public testing::StartedCluster {
 protected:
  // Long enough that a loaded 2-core CI machine does not miss heartbeats
  // for want of CPU; what is tested is the want of a thread.
  static constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(3);
  OverloadTest()
      : StartedCluster(testing::ClusterOptions{.heartbeat_timeout = kHeartbeatTimeout}) {}
};

TEST_F(OverloadTest, ThousandIdleStreams_HeartbeatsGetThrough_NoWorkerDeclaredDead) {
  auto before = client_->GetTopology();
  ASSERT_OK(before);
  ASSERT_EQ(before->tasks.size(), 4u);

  auto channel = grpc::CreateChannel(cluster_.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::CoordinatorTrainers::NewStub(channel);
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::Topology>> reader;
  };
  constexpr int kStreams = 1000;
  std::vector<std::unique_ptr<Stream>> streams;
  v1::WatchTopologyRequest req;
  req.set_after_version(before->version);  // nothing to send: they stay idle
  for (int i = 0; i < kStreams; ++i) {
    auto s = std::make_unique<Stream>();
    s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    s->reader = stub->WatchTopology(&s->ctx, req);
    streams.push_back(std::move(s));
  }
  // Three heartbeat timeouts with every synchronous thread taken: a worker
  // whose heartbeats waited for one would be declared dead.
  absl::SleepFor(3 * kHeartbeatTimeout);
  {
    // The control: the streams did take every synchronous thread - a
    // synchronous call gets no answer now.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::Topology topo;
    grpc::Status s = stub->GetTopology(&ctx, v1::GetTopologyRequest(), &topo);
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << "a synchronous call was answered under the load (" << s.error_message()
        << "): the streams did not exhaust the threads and the test proves nothing";
  }
  for (auto& s : streams) s->ctx.TryCancel();
  for (auto& s : streams) (void)s->reader->Finish();

  // The threads come back as their streams notice the cancellation (each
  // looks twice a second; later on a loaded machine).
  auto after = client_->GetTopology();
  for (int i = 0; i < 100 && absl::IsResourceExhausted(after.status()); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    after = client_->GetTopology();
  }
  ASSERT_OK(after);
  EXPECT_EQ(after->version, before->version) << "membership changed under the load";
  EXPECT_EQ(after->tasks.size(), 4u);
}

// One client connection may hold at most its share of the memory the
// coordinator lends (--max_inflight_bytes_per_connection): a 32 MiB value
// from one connection is refused at 16 MiB, an 8 MiB one goes through, and
// the refusal changes nothing.
class ConnectionShareTest : public testing::StartedCluster {
 protected:
  ConnectionShareTest()
      : StartedCluster(testing::ClusterOptions{
            .coordinator_flags = {"--max_inflight_bytes=67108864",
                                  "--max_inflight_bytes_per_connection=16777216"}}) {}
};

TEST_F(ConnectionShareTest, ValueOverTheConnectionsShare_ResourceExhausted_SmallerOneAccepted) {
  for (auto [name, elements] : {std::pair{"big", 8 << 20}, std::pair{"small", 2 << 20}}) {
    VariableSpec s{.name = name, .dtype = DType::kFloat32, .shape = {elements}};
    s.replica_count = 2;
    ASSERT_OK(client_->CreateVariable(s));
  }
  const std::vector<float> big(8 << 20, 1.0f), small(2 << 20, 2.0f);
  EXPECT_THAT(client_->Assign("big", std::span<const float>(big)),
              testing::StatusIs(absl::StatusCode::kResourceExhausted, "connection"));
  auto info = client_->GetVariable("big");
  ASSERT_OK(info);
  EXPECT_EQ(info->version, 0) << "the refused write changed nothing";
  auto ack = client_->Assign("small", std::span<const float>(small));
  ASSERT_OK(ack);
  EXPECT_EQ(ack->version, 1);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// The access policy as gRPC runs it (ServerCredentialsFor's processor), over
// 127.0.0.1: what it records on a connection's auth context stays the same
// however many calls the connection carries (the context is the
// connection's: a property per call would pile up and slow every lookup).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <iterator>

#include "common/rpc/security.h"
#include "repvar/v1/coordinator.grpc.pb.h"

namespace repvar {
namespace {

const std::string kWorker = "worker-token-0123456789";
const std::string kTrainer = "trainer-token-0123456789";

// Records how many properties each call's auth context holds.
class CountingTrainers final : public v1::CoordinatorTrainers::Service {
 public:
  grpc::Status GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest*,
                           v1::Topology*) override {
    auto auth = ctx->auth_context();
    properties = static_cast<int>(std::distance(auth->begin(), auth->end()));
    return grpc::Status::OK;
  }
  std::atomic<int> properties{-1};
};
class CountingWorkers final : public v1::CoordinatorWorkers::Service {
 public:
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse*) override {
    auto auth = ctx->auth_context();
    properties = static_cast<int>(std::distance(auth->begin(), auth->end()));
    return CheckCallerIsTask(*ctx, TaskKey{req->job(), req->task()});
  }
  std::atomic<int> properties{-1};
};

TEST(PolicyProcessor, X1_ManyCallsOnOneConnection_TheAuthContextDoesNotGrow) {
  AccessPolicy::Tokens tokens;
  tokens.worker = TokenSet::Of({kWorker});
  tokens.trainer = TokenSet::Of({kTrainer});
  ServerSecurity security;
  security.address = "127.0.0.1:0";
  security.policy = std::make_shared<AccessPolicy>(false, std::move(tokens));
  CountingTrainers trainers;
  CountingWorkers workers;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", ServerCredentialsFor(security), &port);
  builder.RegisterService(&trainers);
  builder.RegisterService(&workers);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  auto trainer = v1::CoordinatorTrainers::NewStub(OpenChannel(address, {.token = kTrainer}));
  auto worker = v1::CoordinatorWorkers::NewStub(OpenChannel(address, {.token = kWorker}));
  auto topology = [&] {
    grpc::ClientContext ctx;
    v1::Topology out;
    return trainer->GetTopology(&ctx, v1::GetTopologyRequest(), &out);
  };
  auto heartbeat = [&] {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    req.set_job("tpu_worker");
    req.set_task(0);
    v1::HeartbeatResponse out;
    return worker->Heartbeat(&ctx, req, &out);
  };
  ASSERT_TRUE(topology().ok());
  ASSERT_TRUE(heartbeat().ok());
  const int trainer_properties = trainers.properties;
  const int worker_properties = workers.properties;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(topology().ok());
    ASSERT_TRUE(heartbeat().ok());  // the task check still admits it
  }
  EXPECT_EQ(trainers.properties, trainer_properties);
  EXPECT_EQ(workers.properties, worker_properties);
  // And a call without the token is still refused on the same listener.
  auto anonymous = v1::CoordinatorTrainers::NewStub(OpenChannel(address, {}));
  grpc::ClientContext ctx;
  v1::Topology out;
  EXPECT_EQ(anonymous->GetTopology(&ctx, v1::GetTopologyRequest(), &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  server->Shutdown();
}

}  // namespace
}  // namespace repvar

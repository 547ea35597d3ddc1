// SPDX-License-Identifier: Apache-2.0
// The fixture of the cluster tests: a started TestCluster and a client that
// has seen it form; plus direct looks at a worker's replicas.
#ifndef REPVAR_TESTS_TESTING_STARTED_CLUSTER_H_
#define REPVAR_TESTS_TESTING_STARTED_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "repvar/client.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar::testing {

// The coordinator-facing and the trainer-facing services of a worker.
inline std::unique_ptr<v1::WorkerReplicas::Stub> WorkerStub(const std::string& address) {
  return v1::WorkerReplicas::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}
inline std::unique_ptr<v1::WorkerSteps::Stub> WorkerStepsStub(const std::string& address) {
  return v1::WorkerSteps::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

inline v1::GetReplicaStatusResponse WorkerStatus(const std::string& address) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetReplicaStatusResponse resp;
  EXPECT_TRUE(WorkerStub(address)->GetReplicaStatus(&ctx, {}, &resp).ok());
  return resp;
}

// The worker process's incarnation, as it answers the coordinator (X1: no
// trainer-facing answer shows it); 0 when it does not answer.
inline uint64_t WorkerIncarnation(const std::string& address) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetReplicaStatusResponse resp;
  if (!WorkerStub(address)->GetReplicaStatus(&ctx, {}, &resp).ok()) return 0;
  return resp.incarnation();
}

// A started cluster and a client that has seen it form.
class StartedCluster : public ::testing::Test {
 protected:
  explicit StartedCluster(ClusterOptions options = {}) : cluster_(std::move(options)) {}
  void SetUp() override {
    ASSERT_OK(cluster_.Start());
    auto c = Client::Connect(ClientOptionsFor("admin.token"));
    ASSERT_OK(c);
    client_ = *std::move(c);
    ASSERT_OK(client_->WaitForTopology(Scaled(absl::Seconds(20))));
  }

  // Options of a client of this cluster; with TLS, trusting its CA and
  // sending the token in `token_file` (empty: none).
  ClientOptions ClientOptionsFor(const std::string& token_file) {
    ClientOptions options{.coordinator_address = cluster_.address()};
    if (cluster_.tls()) {
      options.tls_ca_file = cluster_.cert("ca.pem");
      if (!token_file.empty()) options.token_file = cluster_.cert(token_file);
    }
    return options;
  }

  TestCluster cluster_;
  std::unique_ptr<Client> client_;
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_STARTED_CLUSTER_H_

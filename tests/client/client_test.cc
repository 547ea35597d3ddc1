// SPDX-License-Identifier: Apache-2.0
// The C++ client library against a real coordinator gRPC server on
// 127.0.0.1:0 in this process (its core with fake workers): options, scopes,
// the trainer- and admin-facing calls, and statuses as the API documents them.
#include "repvar/client.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "repvar/step.h"
#include "tests/testing/in_process_coordinator.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_.RegisterWorkers(2, 2);
    auto c = Client::Connect({.coordinator_address = coordinator_.address()});
    ASSERT_OK(c);
    client_ = *std::move(c);
  }
  repvar::testing::InProcessCoordinator coordinator_{/*listen=*/true};
  std::unique_ptr<Client> client_;
};

TEST(ClientConnect, NoAddress_InvalidArgument) {
  unsetenv("REPVAR_COORDINATOR_ADDRESS");
  EXPECT_THAT(Client::Connect({}),
              StatusIs(absl::StatusCode::kInvalidArgument, "REPVAR_COORDINATOR_ADDRESS"));
  EXPECT_THAT(Client::Connect({.coordinator_address = "x:1", .chunk_bytes = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_bytes"));
}

TEST_F(ClientTest, V4_ReplicatedScope_PrefixAndReplicaCount) {
  {
    ReplicatedScope outer(4, "model");
    ReplicatedScope inner(2, "layer1");
    auto v = client_->CreateVariable({.name = "w",
                                      .dtype = DType::kFloat32,
                                      .shape = {3},
                                      .initializer = InitializerSpec::Ones()});
    ASSERT_OK(v);
    EXPECT_EQ(v->spec.name, "model/layer1/w");
    EXPECT_EQ(v->spec.replica_count, 2);
    EXPECT_TRUE(v->created);
  }
  auto topo = client_->GetTopology();
  ASSERT_OK(topo);
  EXPECT_EQ(topo->accelerators.size(), 4u);
  EXPECT_EQ(topo->infeed_host->job, "tpu_worker");
}

// S4 (issue 5): a trainer whose host sits the step out (its replicas are
// being resynced) is refused at begin, naming why, instead of being told
// COMMITTED at the end for writes that count for nothing.
TEST_F(ClientTest, S4_TrainerOnAHostSittingTheStepOut_RefusedAtBegin) {
  ASSERT_OK(client_->CreateVariable({.name = "w",
                                     .dtype = DType::kFloat32,
                                     .shape = {2},
                                     .replica_count = 4,
                                     .initializer = InitializerSpec::Zeros()}));
  ASSERT_OK(client_->Initialize({"w"}));
  coordinator_.workers().Fail("tpu_worker:1", absl::UnavailableError("down for a moment"));
  const std::vector<float> v = {1, 2};
  EXPECT_THAT(client_->Assign("w", std::span<const float>(v)),
              StatusIs(absl::StatusCode::kUnavailable));
  coordinator_.workers().Heal("tpu_worker:1");
  // Every replica is STALE now; verify tpu_worker:0 only (it holds version 1).
  coordinator_.workers().Fail("tpu_worker:1", absl::UnavailableError("still busy"));
  coordinator_.core().ResyncStale();
  coordinator_.workers().Heal("tpu_worker:1");
  EXPECT_THAT(StepScope::Begin(*client_, 1, {.worker = "tpu_worker:1"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "sits step 1 out"));
}

TEST_F(ClientTest, WriteRead_RoundTrip_AndDtypeChecked) {
  ASSERT_OK(client_->CreateVariable(
      {.name = "w", .dtype = DType::kFloat32, .shape = {2}, .replica_count = 4}));
  std::vector<float> v = {1.5f, -2};
  auto ack = client_->Assign<float>("w", v, /*read_value=*/true);
  ASSERT_OK(ack);
  EXPECT_EQ(ack->version, 1);
  ASSERT_TRUE(ack->value.has_value());
  auto back = client_->Read("w");
  ASSERT_OK(back);
  EXPECT_EQ(std::vector<float>(back->as<float>().begin(), back->as<float>().end()), v);
  std::vector<int32_t> ints = {1, 2};
  EXPECT_THAT(client_->Assign<int32_t>("w", ints),
              StatusIs(absl::StatusCode::kFailedPrecondition, "int32"));
  EXPECT_THAT(client_->Read("nope"), StatusIs(absl::StatusCode::kNotFound));
}

// A write of at most 1 MiB goes in one unary call, a larger one in a
// stream: both answer the same way (version, checksum, the value when asked
// for) and a retried request id is applied once on either.
TEST_F(ClientTest, SmallAndLargeWrites_UnaryAndStream_AnswerAlike) {
  for (int64_t n : {int64_t{3}, int64_t{(1 << 20) / 4 + 1}}) {
    const std::string name = absl::StrCat("w", n);
    ASSERT_OK(client_->CreateVariable(
        {.name = name, .dtype = DType::kFloat32, .shape = {n}, .replica_count = 4}));
    std::vector<float> v(static_cast<size_t>(n), 0.5f);
    v.back() = 7;
    auto ack = client_->Assign<float>(name, v, /*read_value=*/true);
    ASSERT_OK(ack);
    EXPECT_EQ(ack->version, 1) << n;
    ASSERT_TRUE(ack->value.has_value()) << n;
    EXPECT_EQ(std::vector<float>(ack->value->as<float>().begin(), ack->value->as<float>().end()), v)
        << n;
    auto added = client_->AssignAdd<float>(name, v);
    ASSERT_OK(added);
    EXPECT_EQ(added->version, 2) << n;
    auto back = client_->Read(name);
    ASSERT_OK(back);
    EXPECT_EQ(back->as<float>()[static_cast<size_t>(n - 1)], 14.0f) << n;
    EXPECT_EQ(client_->GetVariable(name)->checksum, added->checksum) << n;
  }
}

TEST_F(ClientTest, Admin_DeleteAndClusterStatus) {
  ASSERT_OK(client_->CreateVariable(
      {.name = "w", .dtype = DType::kFloat32, .shape = {2}, .replica_count = 2}));
  auto status = client_->GetClusterStatus();
  ASSERT_OK(status);
  EXPECT_EQ(status->topology.tasks.size(), 2u);
  ASSERT_EQ(status->variables.size(), 1u);
  EXPECT_EQ(status->steps.front(), "last committed step: 0");
  ASSERT_OK(client_->DeleteVariable("w"));
  EXPECT_THAT(client_->DeleteVariable("w"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(client_->GetClusterStatus()->variables.empty());
}

}  // namespace
}  // namespace repvar

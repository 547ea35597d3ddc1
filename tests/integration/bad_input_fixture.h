// SPDX-License-Identifier: Apache-2.0
// The fixture of the bad-input tests (bad_input_test.cc,
// bad_input_streams_test.cc): one real cluster for the suite and raw stubs,
// and after every test the variable "w" exactly as it was.
#ifndef REPVAR_TESTS_INTEGRATION_BAD_INPUT_FIXTURE_H_
#define REPVAR_TESTS_INTEGRATION_BAD_INPUT_FIXTURE_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/tensor/tensor.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar {

using ::repvar::testing::FloatBytes;
using ::repvar::testing::Scaled;
using ::repvar::testing::StatusIs;
using Code = absl::StatusCode;

class BadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new testing::TestCluster();
    ASSERT_OK(cluster_->Start());
    auto c = Client::Connect({.coordinator_address = cluster_->address()});
    ASSERT_OK(c);
    client_ = c->release();
    ASSERT_OK(client_->WaitForTopology(Scaled(absl::Seconds(20))));
    auto channel = grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::CoordinatorTrainers::NewStub(channel).release();
    workers_stub_ = v1::CoordinatorWorkers::NewStub(channel).release();
    ASSERT_OK(client_->CreateVariable(
        {.name = "w", .dtype = DType::kFloat32, .shape = {4}, .replica_count = 6}));
    std::vector<float> v = {1, 2, 3, 4};
    ASSERT_OK(client_->Assign("w", std::span<const float>(v)));
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete client_;
    delete cluster_;
  }
  void TearDown() override {
    // Whatever was refused, w is exactly as it was.
    auto r = client_->Read("w");
    ASSERT_OK(r);
    EXPECT_EQ(r->version, 1);
    EXPECT_EQ(std::vector<float>(r->as<float>().begin(), r->as<float>().end()),
              (std::vector<float>{1, 2, 3, 4}));
  }

  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }

  static v1::TensorHeader HeaderFor(const std::string& bytes, std::vector<int64_t> dims,
                                    v1::DType dtype = v1::DTYPE_FLOAT32) {
    v1::TensorHeader h;
    h.mutable_spec()->set_dtype(dtype);
    for (int64_t d : dims) h.mutable_spec()->add_dims(d);
    h.set_byte_size(bytes.size());
    h.set_checksum(Checksum(std::as_bytes(std::span(bytes.data(), bytes.size()))));
    return h;
  }
  static v1::TensorChunk Chunk(uint64_t offset, const std::string& data) {
    v1::TensorChunk c;
    c.set_offset(offset);
    c.set_data(data);
    c.set_checksum(Checksum(std::as_bytes(std::span(data.data(), data.size()))));
    return c;
  }

  // Sends an AssignVariable stream made of `msgs` and returns its status.
  static absl::Status SendAssign(const std::vector<v1::AssignVariableRequest>& msgs) {
    auto ctx = Ctx();
    v1::AssignVariableResponse resp;
    auto stream = stub_->AssignVariable(ctx.get(), &resp);
    for (const auto& m : msgs) {
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
    return FromGrpcStatus(stream->Finish());
  }
  static v1::AssignVariableRequest Head(const v1::TensorHeader& h, const std::string& name = "w",
                                        const std::string& request_id = "") {
    v1::AssignVariableRequest m;
    m.mutable_header()->set_name(name);
    m.mutable_header()->set_request_id(request_id);
    *m.mutable_header()->mutable_tensor() = h;
    return m;
  }
  static v1::AssignVariableRequest Body(const v1::TensorChunk& c) {
    v1::AssignVariableRequest m;
    *m.mutable_chunk() = c;
    return m;
  }
  static inline testing::TestCluster* cluster_ = nullptr;
  static inline Client* client_ = nullptr;
  static inline v1::CoordinatorTrainers::Stub* stub_ = nullptr;
  static inline v1::CoordinatorWorkers::Stub* workers_stub_ = nullptr;
};

}  // namespace repvar

#endif  // REPVAR_TESTS_INTEGRATION_BAD_INPUT_FIXTURE_H_

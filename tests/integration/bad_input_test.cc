// SPDX-License-Identifier: Apache-2.0
// X2: bad inputs to membership, variables and writes get their documented
// status and change nothing. Streams and memory are in
// bad_input_streams_test.cc; every_rpc_test.cc has a bad input for every
// method of every service.
#include "tests/integration/bad_input_fixture.h"

namespace repvar {
namespace {

TEST_F(BadInputTest, RegisterWorker_MalformedDeviceNames_InvalidArgument) {
  int64_t version = client_->GetTopology()->version;
  for (const char* bad :
       {"/job:/device:TPU:", "/job:w/replica:0/task:-1/device:TPU:0",
        "/job:w/replica:0/task:1e3/device:TPU:0", "/job:w/replica:0/task:0/device:TPU:0/",
        "/job:w/replica:0/task:0/device:tpu:0", "/jоb:w/replica:0/task:0/device:TPU:0"}) {
    v1::RegisterWorkerRequest req;
    req.set_job("w");
    req.set_task(0);
    req.set_address("127.0.0.1:1");
    req.set_incarnation(1);
    req.add_devices(bad);
    v1::RegisterWorkerResponse resp;
    EXPECT_THAT(FromGrpcStatus(workers_stub_->RegisterWorker(Ctx().get(), req, &resp)),
                StatusIs(Code::kInvalidArgument))
        << bad;
  }
  EXPECT_EQ(client_->GetTopology()->version, version);
}

TEST_F(BadInputTest, RegisterWorker_DuplicateDeviceAndLiveTaskOtherIncarnation) {
  int64_t version = client_->GetTopology()->version;
  v1::RegisterWorkerRequest req;
  req.set_job("tpu_worker");
  req.set_task(0);
  req.set_address("127.0.0.1:1");
  req.set_incarnation(12345);
  req.add_devices("/job:tpu_worker/replica:0/task:0/device:TPU:0");
  v1::RegisterWorkerResponse resp;
  // tpu_worker:0 is live under another incarnation.
  EXPECT_THAT(FromGrpcStatus(workers_stub_->RegisterWorker(Ctx().get(), req, &resp)),
              StatusIs(Code::kAborted));
  req.add_devices("/job:tpu_worker/replica:0/task:0/device:TPU:0");
  req.set_task(9);
  req.set_job("other");
  EXPECT_THAT(FromGrpcStatus(workers_stub_->RegisterWorker(Ctx().get(), req, &resp)),
              StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(client_->GetTopology()->version, version);
}

TEST_F(BadInputTest, Heartbeat_UnknownTask_NotFound) {
  v1::HeartbeatRequest req;
  req.set_job("tpu_worker");
  req.set_task(77);
  req.set_incarnation(1);
  v1::HeartbeatResponse resp;
  EXPECT_THAT(FromGrpcStatus(workers_stub_->Heartbeat(Ctx().get(), req, &resp)),
              StatusIs(Code::kNotFound));
}

TEST_F(BadInputTest, CreateVariables_BadSpecs_RefusedAndNothingCreated) {
  struct Case {
    std::function<void(v1::VariableSpec*)> edit;
    Code code;
  };
  std::vector<Case> cases = {
      {[](v1::VariableSpec* s) { s->mutable_tensor()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       Code::kInvalidArgument},
      {[](v1::VariableSpec* s) { s->mutable_tensor()->set_dtype(static_cast<v1::DType>(99)); },
       Code::kInvalidArgument},
      {[](v1::VariableSpec* s) { s->mutable_tensor()->add_dims(-2); }, Code::kInvalidArgument},
      {[](v1::VariableSpec* s) {
         s->mutable_tensor()->add_dims(int64_t{1} << 40);
         s->mutable_tensor()->add_dims(int64_t{1} << 40);
       },
       Code::kInvalidArgument},
      {[](v1::VariableSpec* s) { s->set_name("../etc/passwd"); }, Code::kInvalidArgument},
      {[](v1::VariableSpec* s) { s->set_name(""); }, Code::kInvalidArgument},
      {[](v1::VariableSpec* s) { s->set_replica_count(0); }, Code::kInvalidArgument},
      {[](v1::VariableSpec* s) { s->set_replica_count(7); }, Code::kFailedPrecondition},
      {[](v1::VariableSpec* s) { s->set_aggregation(static_cast<v1::Aggregation>(42)); },
       Code::kInvalidArgument},
      {[](v1::VariableSpec* s) { s->set_name("w"); }, Code::kAlreadyExists},  // w is float32[4]
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::CreateVariablesRequest req;
    v1::VariableSpec* s = req.add_items()->mutable_spec();
    s->set_name("fresh");
    s->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    s->set_replica_count(2);
    cases[i].edit(s);
    v1::CreateVariablesResponse resp;
    EXPECT_THAT(FromGrpcStatus(stub_->CreateVariables(Ctx().get(), req, &resp)),
                StatusIs(cases[i].code))
        << "case " << i;
  }
  EXPECT_THAT(client_->GetVariable("fresh"), StatusIs(Code::kNotFound));
}

TEST_F(BadInputTest, CreateVariables_InitializerValueOfAnotherShape_InvalidArgument) {
  v1::CreateVariablesRequest req;
  auto* item = req.add_items();
  item->mutable_spec()->set_name("fresh2");
  item->mutable_spec()->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  item->mutable_spec()->mutable_tensor()->add_dims(4);
  item->mutable_spec()->set_replica_count(1);
  std::string three = FloatBytes({1, 2, 3});
  *item->mutable_initializer()->mutable_value()->mutable_header() = HeaderFor(three, {3});
  item->mutable_initializer()->mutable_value()->set_data(three);
  v1::CreateVariablesResponse resp;
  EXPECT_THAT(FromGrpcStatus(stub_->CreateVariables(Ctx().get(), req, &resp)),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(client_->GetVariable("fresh2"), StatusIs(Code::kNotFound));
}

TEST_F(BadInputTest, UnknownVariable_NotFoundEverywhere) {
  EXPECT_THAT(client_->GetVariable("nope"), StatusIs(Code::kNotFound));
  EXPECT_THAT(client_->Read("nope"), StatusIs(Code::kNotFound));
  EXPECT_THAT(client_->Initialize({"nope"}), StatusIs(Code::kNotFound));
  EXPECT_THAT(client_->IsInitialized({"nope"}), StatusIs(Code::kNotFound));
  EXPECT_THAT(client_->DeleteVariable("nope"), StatusIs(Code::kNotFound));
  std::string data = FloatBytes({1, 2, 3, 4});
  EXPECT_THAT(SendAssign({Head(HeaderFor(data, {4}), "nope"), Body(Chunk(0, data))}),
              StatusIs(Code::kNotFound));
}

TEST_F(BadInputTest, ReadUninitialized_FailedPrecondition) {
  ASSERT_OK(
      client_->CreateVariable({.name = "uninit", .dtype = DType::kFloat32, .replica_count = 2}));
  EXPECT_THAT(client_->Read("uninit"), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(client_->ReadBatch({"w", "uninit"}), StatusIs(Code::kFailedPrecondition));
}

TEST_F(BadInputTest, AssignVariable_DtypeOrShapeMismatch_FailedPrecondition) {
  std::string data = FloatBytes({1, 2, 3, 4});
  EXPECT_THAT(SendAssign({Head(HeaderFor(data, {2, 2})), Body(Chunk(0, data))}),
              StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(SendAssign({Head(HeaderFor(data, {2}, v1::DTYPE_FLOAT64)), Body(Chunk(0, data))}),
              StatusIs(Code::kFailedPrecondition));
  std::vector<double> d = {1, 2, 3, 4};
  EXPECT_THAT(client_->Assign("w", std::span<const double>(d)),
              StatusIs(Code::kFailedPrecondition));
}

TEST_F(BadInputTest, AssignVariable_MalformedStreams_InvalidArgument) {
  std::string data = FloatBytes({5, 6, 7, 8});
  v1::TensorHeader h = HeaderFor(data, {4});
  // No header first.
  EXPECT_THAT(SendAssign({Body(Chunk(0, data))}), StatusIs(Code::kInvalidArgument, "AssignHeader"));
  EXPECT_THAT(SendAssign({}), StatusIs(Code::kInvalidArgument));
  // Truncated: 8 of 16 bytes.
  EXPECT_THAT(SendAssign({Head(h), Body(Chunk(0, data.substr(0, 8)))}),
              StatusIs(Code::kInvalidArgument, "truncated"));
  // Out of order.
  EXPECT_THAT(
      SendAssign({Head(h), Body(Chunk(8, data.substr(8))), Body(Chunk(0, data.substr(0, 8)))}),
      StatusIs(Code::kInvalidArgument, "out of order"));
  // Overrun (oversized for the tensor).
  EXPECT_THAT(SendAssign({Head(h), Body(Chunk(0, data + data))}),
              StatusIs(Code::kInvalidArgument, "overruns"));
  // Bad chunk checksum.
  v1::TensorChunk bad = Chunk(0, data);
  bad.set_checksum(bad.checksum() ^ 1);
  EXPECT_THAT(SendAssign({Head(h), Body(bad)}), StatusIs(Code::kInvalidArgument, "checksum"));
  // Bad whole-tensor checksum.
  v1::TensorHeader wrong = h;
  wrong.set_checksum(h.checksum() ^ 1);
  EXPECT_THAT(SendAssign({Head(wrong), Body(Chunk(0, data))}),
              StatusIs(Code::kInvalidArgument, "checksum"));
  // Header byte_size disagrees with the shape.
  v1::TensorHeader lying = h;
  lying.set_byte_size(12);
  EXPECT_THAT(SendAssign({Head(lying), Body(Chunk(0, data.substr(0, 12)))}),
              StatusIs(Code::kInvalidArgument));
  // A second header in one stream.
  EXPECT_THAT(SendAssign({Head(h), Body(Chunk(0, data)), Head(h)}),
              StatusIs(Code::kInvalidArgument));
  // Overlong request id.
  EXPECT_THAT(SendAssign({Head(h, "w", std::string(100, 'x')), Body(Chunk(0, data))}),
              StatusIs(Code::kInvalidArgument, "request_id"));
}

TEST_F(BadInputTest, AssignVariable_ChunkOver4MiB_InvalidArgument) {
  ASSERT_OK(client_->CreateVariable(
      {.name = "big", .dtype = DType::kFloat32, .shape = {2 << 20}, .replica_count = 2}));
  std::string data(8 << 20, '\0');
  EXPECT_THAT(SendAssign({Head(HeaderFor(data, {2 << 20}), "big"),
                          Body(Chunk(0, data.substr(0, 5 << 20)))}),
              StatusIs(Code::kInvalidArgument, "exceeds"));
  EXPECT_THAT(client_->Read("big"), StatusIs(Code::kFailedPrecondition));
}

TEST_F(BadInputTest, AssignVariable_NonFinite_InvalidArgument) {
  std::vector<float> v = {1, NAN, 3, 4};
  EXPECT_THAT(client_->Assign("w", std::span<const float>(v)),
              StatusIs(Code::kInvalidArgument, "non-finite"));
  std::vector<float> inf = {INFINITY, 0, 0, 0};
  EXPECT_THAT(client_->AssignAdd("w", std::span<const float>(inf)),
              StatusIs(Code::kInvalidArgument));
}

TEST_F(BadInputTest, AssignVariable_RequestIdReusedWithOtherPayload_InvalidArgument) {
  ASSERT_OK(client_->CreateVariable(
      {.name = "dedup", .dtype = DType::kFloat32, .shape = {4}, .replica_count = 6}));
  std::string a = FloatBytes({1, 1, 1, 1});
  std::string b = FloatBytes({2, 2, 2, 2});
  ASSERT_OK(SendAssign({Head(HeaderFor(a, {4}), "dedup", "rid-1"), Body(Chunk(0, a))}));
  // Same id, same payload: the original answer, no second version.
  ASSERT_OK(SendAssign({Head(HeaderFor(a, {4}), "dedup", "rid-1"), Body(Chunk(0, a))}));
  EXPECT_EQ(client_->Read("dedup")->version, 1);
  EXPECT_THAT(SendAssign({Head(HeaderFor(b, {4}), "dedup", "rid-1"), Body(Chunk(0, b))}),
              StatusIs(Code::kInvalidArgument, "rid-1"));
  EXPECT_EQ(client_->Read("dedup")->as<float>()[0], 1.0f);
}

TEST_F(BadInputTest, AssignVariables_CorruptInlineTensor_InvalidArgument) {
  v1::AssignVariablesRequest req;
  auto* item = req.add_items();
  item->set_name("w");
  std::string data = FloatBytes({7, 7, 7, 7});
  *item->mutable_value()->mutable_header() = HeaderFor(data, {4});
  data[0] ^= 1;
  item->mutable_value()->set_data(data);
  v1::AssignVariablesResponse resp;
  EXPECT_THAT(FromGrpcStatus(stub_->AssignVariables(Ctx().get(), req, &resp)),
              StatusIs(Code::kInvalidArgument, "checksum"));
}

TEST_F(BadInputTest, WorkerWriteReplicas_StaleIncarnation_Aborted) {
  auto stub = v1::WorkerReplicas::NewStub(
      grpc::CreateChannel(cluster_->worker_address(0), grpc::InsecureChannelCredentials()));
  auto ctx = Ctx();
  v1::WriteReplicasResponse resp;
  auto stream = stub->WriteReplicas(ctx.get(), &resp);
  v1::WriteReplicasRequest m;
  m.mutable_header()->set_incarnation(1);  // not the worker's
  m.mutable_header()->set_stream_writes(1);
  m.mutable_header()->set_variable_id(client_->GetVariable("w")->id);
  m.mutable_header()->add_replicas(0);
  std::string data = FloatBytes({0, 0, 0, 0});
  *m.mutable_header()->mutable_tensor() = HeaderFor(data, {4});
  stream->Write(m);
  stream->WritesDone();
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), StatusIs(Code::kAborted));
}

}  // namespace
}  // namespace repvar

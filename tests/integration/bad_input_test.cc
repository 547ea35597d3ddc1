// SPDX-License-Identifier: Apache-2.0
// X2: bad inputs that need a sequence, a real stream or memory to watch get
// their documented status and change nothing (every_rpc_test.cc has a bad
// input for every method of every service). Raw stubs, one real cluster for
// the suite.
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
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar {
namespace {

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
  static testing::TestCluster* cluster_;
  static Client* client_;
  static v1::CoordinatorTrainers::Stub* stub_;
  static v1::CoordinatorWorkers::Stub* workers_stub_;
};

testing::TestCluster* BadInputTest::cluster_ = nullptr;
Client* BadInputTest::client_ = nullptr;
v1::CoordinatorTrainers::Stub* BadInputTest::stub_ = nullptr;
v1::CoordinatorWorkers::Stub* BadInputTest::workers_stub_ = nullptr;

// Sends `messages` (wire bytes) on the streaming `method` at `address`,
// then reads every answer; returns the call's status and the answers' bytes.
std::pair<grpc::Status, std::vector<std::string>> RawStream(
    const std::string& address, const std::string& method,
    const std::vector<std::string>& messages) {
  grpc::GenericStub generic(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  intptr_t tag = 1;
  auto next = [&cq, &tag]() {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&got, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(got), tag);
    return ok;
  };
  auto call = generic.PrepareCall(&ctx, method, &cq);
  call->StartCall(reinterpret_cast<void*>(tag));
  EXPECT_TRUE(next());
  for (const std::string& m : messages) {
    grpc::Slice slice(m);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(++tag));
    if (!next()) break;
  }
  call->WritesDone(reinterpret_cast<void*>(++tag));
  next();
  std::vector<std::string> answers;
  grpc::ByteBuffer answer;
  while (true) {
    call->Read(&answer, reinterpret_cast<void*>(++tag));
    if (!next()) break;
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(answer.Dump(&slices).ok());
    answers.emplace_back();
    for (const grpc::Slice& piece : slices) {
      answers.back().append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
  }
  grpc::Status finished;
  call->Finish(&finished, reinterpret_cast<void*>(++tag));
  next();
  return {finished, answers};
}

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

// Resident memory of a daemon, from /proc.
uint64_t RssOf(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/statm").c_str(), "r");
  unsigned long pages = 0, resident = 0;
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%lu %lu", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return resident * 4096;
}

// A few bytes announcing a GiB, then silence: neither daemon takes the GiB
// (memory follows the bytes that arrive, not the header's size). Both serve
// on afterwards.
TEST_F(BadInputTest, AnnouncedGiB_NoBytes_MemoryStaysFlat_DaemonsServeOn) {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of float32
  ASSERT_OK(client_->CreateVariable(
      {.name = "huge", .dtype = DType::kFloat32, .shape = {n}, .replica_count = 1}));
  const uint64_t id = client_->GetVariable("huge")->id;
  v1::TensorHeader announced;
  announced.mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  announced.mutable_spec()->add_dims(n);
  announced.set_byte_size(uint64_t(n) * 4);
  announced.set_checksum(1);
  const pid_t coordinator = cluster_->coordinator().pid();
  const pid_t worker = cluster_->worker(0).pid();
  const uint64_t coordinator_before = RssOf(coordinator);
  const uint64_t worker_before = RssOf(worker);

  auto ctx = Ctx();
  v1::AssignVariableResponse resp;
  auto assign = stub_->AssignVariable(ctx.get(), &resp);
  ASSERT_TRUE(assign->Write(Head(announced, "huge")));

  auto wstub = v1::WorkerReplicas::NewStub(
      grpc::CreateChannel(cluster_->worker_address(0), grpc::InsecureChannelCredentials()));
  v1::GetReplicaStatusResponse status;
  ASSERT_TRUE(wstub->GetReplicaStatus(Ctx().get(), {}, &status).ok());
  auto wctx = Ctx();
  v1::WriteReplicasResponse wresp;
  auto write = wstub->WriteReplicas(wctx.get(), &wresp);
  v1::WriteReplicasRequest m;
  m.mutable_header()->set_incarnation(status.incarnation());
  m.mutable_header()->set_variable_id(id);
  m.mutable_header()->set_version(1);
  m.mutable_header()->set_fence(UINT64_MAX);
  m.mutable_header()->add_replicas(0);
  m.mutable_header()->set_stream_writes(1);
  *m.mutable_header()->mutable_tensor() = announced;
  ASSERT_TRUE(write->Write(m));

  // Give both time to act on the headers (a pre-fault of 1 GiB takes well
  // under this), watching memory all along.
  uint64_t coordinator_peak = 0, worker_peak = 0;
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    coordinator_peak = std::max(coordinator_peak, RssOf(coordinator));
    worker_peak = std::max(worker_peak, RssOf(worker));
  }
  EXPECT_LT(coordinator_peak, coordinator_before + (uint64_t{64} << 20));
  EXPECT_LT(worker_peak, worker_before + (uint64_t{64} << 20));
  ctx->TryCancel();
  wctx->TryCancel();
  assign->Finish();
  write->Finish();
  ASSERT_OK(client_->Read("w"));
  ASSERT_TRUE(wstub->GetReplicaStatus(Ctx().get(), {}, &status).ok());
  ASSERT_OK(client_->DeleteVariable("huge"));
}

// A message that cannot be parsed refuses the whole stream (the worker reads
// its messages as byte buffers and parses them itself), and nothing applies.
TEST_F(BadInputTest, WorkerWriteReplicas_UnparseableMessage_InvalidArgument_NothingApplied) {
  auto channel =
      grpc::CreateChannel(cluster_->worker_address(0), grpc::InsecureChannelCredentials());
  auto stub = v1::WorkerReplicas::NewStub(channel);
  v1::GetReplicaStatusResponse status;
  ASSERT_TRUE(stub->GetReplicaStatus(Ctx().get(), {}, &status).ok());
  const std::string data = FloatBytes({9, 9, 9, 9});
  v1::WriteReplicasRequest m;
  v1::WriteReplicasHeader* h = m.mutable_header();
  h->set_incarnation(status.incarnation());
  h->set_variable_id(client_->GetVariable("w")->id);
  h->set_version(1);
  h->set_fence(UINT64_MAX);
  h->add_replicas(0);
  *h->mutable_tensor() = HeaderFor(data, {4});
  h->set_inline_data(data);
  h->set_stream_writes(2);  // a second write follows ... as bytes that do not parse
  const grpc::Status finished =
      RawStream(cluster_->worker_address(0), "/repvar.v1.WorkerReplicas/WriteReplicas",
                {m.SerializeAsString(), std::string("\xff\xff\xff", 3)})
          .first;
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << finished.error_message();
  EXPECT_NE(finished.error_message().find("does not parse"), std::string::npos)
      << finished.error_message();
  v1::GetReplicaStatusResponse after;
  ASSERT_TRUE(stub->GetReplicaStatus(Ctx().get(), {}, &after).ok());
  EXPECT_EQ(after.DebugString(), status.DebugString());
}

// AssignVariable reads its chunks in place when they are laid out as
// protobuf writes them; any other valid layout is parsed by protobuf and
// means the same (a chunk with its checksum before its data is taken), and a
// message that does not parse refuses the stream with nothing changed.
TEST_F(BadInputTest, AssignVariable_ChunkInAnotherLayout_Taken_UnparseableMessage_Refused) {
  ASSERT_OK(client_->CreateVariable(
      {.name = "layout", .dtype = DType::kFloat32, .shape = {4}, .replica_count = 2}));
  const std::string data = FloatBytes({5, 6, 7, 8});
  v1::AssignVariableRequest head;
  head.mutable_header()->set_request_id("layout-1");
  head.mutable_header()->set_name("layout");
  head.mutable_header()->set_op(v1::ASSIGN_OP_ASSIGN);
  *head.mutable_header()->mutable_tensor() = HeaderFor(data, {4});
  // chunk {checksum = 3, data = 2}: offset 0 left out, fields out of order.
  const uint64_t sum = Checksum(std::as_bytes(std::span(data.data(), data.size())));
  std::string inner = "\x18";
  for (uint64_t v = sum;; v >>= 7) {
    inner += static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    if (v < 0x80) break;
  }
  inner += '\x12';
  inner += static_cast<char>(data.size());
  inner += data;
  const std::string reordered = std::string("\x12") + static_cast<char>(inner.size()) + inner;
  v1::AssignVariableRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(reordered));
  ASSERT_EQ(parsed.chunk().data(), data);

  const std::string method = "/repvar.v1.CoordinatorTrainers/AssignVariable";
  v1::AssignVariableRequest head2 = head;
  head2.mutable_header()->set_request_id("layout-2");
  const grpc::Status refused =
      RawStream(cluster_->address(), method,
                {head2.SerializeAsString(), std::string("\xff\xff\xff", 3)})
          .first;
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_NE(refused.error_message().find("does not parse"), std::string::npos)
      << refused.error_message();
  EXPECT_THAT(client_->Read("layout").status(), StatusIs(Code::kFailedPrecondition));

  const grpc::Status taken =
      RawStream(cluster_->address(), method, {head.SerializeAsString(), reordered}).first;
  EXPECT_TRUE(taken.ok()) << taken.error_message();
  auto r = client_->Read("layout");
  ASSERT_OK(r);
  EXPECT_EQ(std::vector<float>(r->as<float>().begin(), r->as<float>().end()),
            (std::vector<float>{5, 6, 7, 8}));
}

// The reads answered in chunk frames (ReadVariable, ReadReplica, StepRead)
// read their one request themselves: one that does not parse is refused
// as INVALID_ARGUMENT, with no answer; a good one beside it is answered,
// its frames parsing as the messages the methods declare.
TEST_F(BadInputTest, FramedReads_UnparseableRequest_InvalidArgument_GoodOneAnswered) {
  const std::string garbage("\xff\xff\xff", 3);
  v1::ReadVariableRequest read;
  read.set_name("w");
  v1::ReadReplicaRequest replica;
  replica.set_variable_id(client_->GetVariable("w")->id);
  const struct {
    std::string address, method, good;
  } cases[] = {
      {cluster_->address(), "/repvar.v1.CoordinatorTrainers/ReadVariable",
       read.SerializeAsString()},
      {cluster_->worker_address(0), "/repvar.v1.WorkerReplicas/ReadReplica",
       replica.SerializeAsString()},
      {cluster_->worker_address(0), "/repvar.v1.WorkerSteps/StepRead", ""},
  };
  for (const auto& c : cases) {
    auto [refused, none] = RawStream(c.address, c.method, {garbage});
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.method << ": " << refused.error_message();
    EXPECT_TRUE(none.empty()) << c.method;
    auto [answered, messages] = RawStream(c.address, c.method, {c.good});
    if (c.method.ends_with("StepRead")) {
      // An empty request parses; no step is open, so the worker says which.
      EXPECT_NE(answered.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << answered.error_message();
      continue;
    }
    EXPECT_TRUE(answered.ok()) << c.method << ": " << answered.error_message();
    ASSERT_EQ(messages.size(), 2u) << c.method << ": a header, then one chunk";
    v1::TensorChunk chunk;
    if (c.method.ends_with("ReadVariable")) {
      v1::ReadVariableResponse head, body;
      ASSERT_TRUE(head.ParseFromString(messages[0]) && body.ParseFromString(messages[1]));
      EXPECT_EQ(head.header().version(), 1);
      chunk = body.chunk();
    } else {
      v1::ReadVariableChunk head, body;
      ASSERT_TRUE(head.ParseFromString(messages[0]) && body.ParseFromString(messages[1]));
      EXPECT_EQ(head.version(), 1);
      chunk = body.chunk();
    }
    EXPECT_EQ(chunk.offset(), 0u);
    EXPECT_EQ(chunk.data(), FloatBytes({1, 2, 3, 4})) << c.method;
    EXPECT_EQ(chunk.checksum(), Checksum(std::as_bytes(std::span(chunk.data()))));
  }
}

TEST_F(BadInputTest, WorkerWriteSmallReplicas_BadColumns_RefusedAndNothingApplied) {
  auto stub = v1::WorkerReplicas::NewStub(
      grpc::CreateChannel(cluster_->worker_address(0), grpc::InsecureChannelCredentials()));
  uint64_t id = client_->GetVariable("w")->id;
  std::string data = FloatBytes({9, 9, 9, 9});
  v1::GetReplicaStatusResponse status;
  ASSERT_TRUE(stub->GetReplicaStatus(Ctx().get(), {}, &status).ok());
  // One write of w's replica 0, as the coordinator sends it.
  auto request = [&](uint64_t incarnation) {
    v1::WriteSmallReplicasRequest req;
    req.set_incarnation(incarnation);
    req.add_variable_ids(id);
    req.add_names("w");
    req.add_versions(1);
    req.add_fences(UINT64_MAX);  // above any floor: only the case at hand refuses it
    req.add_replica_counts(1);
    req.add_replicas(0);
    *req.add_specs() = HeaderFor(data, {4}).spec();
    req.add_spec_index(0);
    req.add_checksums(HeaderFor(data, {4}).checksum());
    req.set_data(data);
    return req;
  };
  v1::WriteReplicasResponse resp;
  // Another incarnation: fenced.
  EXPECT_THAT(FromGrpcStatus(stub->WriteSmallReplicas(Ctx().get(), request(1), &resp)),
              StatusIs(Code::kAborted));
  struct Bad {
    const char* what;
    std::function<void(v1::WriteSmallReplicasRequest&)> spoil;
  };
  for (const Bad& bad : std::vector<Bad>{
           // Columns that do not line up.
           {"names", [](auto& r) { *r.add_names() = std::string(1, 'x'); }},
           {"fences", [](auto& r) { r.clear_fences(); }},
           {"checksums", [](auto& r) { r.add_checksums(1); }},
           {"replica entries are left", [](auto& r) { r.set_replica_counts(0, 2); }},
           {"replica_counts[0] is -1", [](auto& r) { r.set_replica_counts(0, -1); }},
           {"belong to no write", [](auto& r) { r.add_replicas(1); }},
           {"spec_index[0] is 1", [](auto& r) { r.set_spec_index(0, 1); }},
           {"dtype", [](auto& r) { r.mutable_specs(0)->set_dtype(v1::DTYPE_UNSPECIFIED); }},
           // Values shorter or longer than their specs.
           {"bytes of data are left", [](auto& r) { r.mutable_data()->resize(8); }},
           {"belong to no write", [](auto& r) { r.mutable_data()->resize(20); }},
           // Fields a worker checks before taking any byte.
           {"version", [](auto& r) { r.set_versions(0, -1); }},
           {"replica index", [](auto& r) { r.set_replicas(0, -1); }},
           {"replica index", [](auto& r) { r.set_replica_counts(0, 2), r.add_replicas(0); }},
           {"no replica", [](auto& r) { r.set_replica_counts(0, 0), r.clear_replicas(); }},
           {"variable id 0", [](auto& r) { r.set_variable_ids(0, 0); }},
           {"without a fence", [](auto& r) { r.set_fences(0, 0); }},
           // Corrupt bytes: the checksum catches them.
           {"checksum", [](auto& r) { r.mutable_data()->at(0) ^= 1; }},
           // Shared values: one number per write, none past the next new one.
           {"value_index[0] is 1", [](auto& r) { r.add_value_index(1); }},
           {"1 variable ids but 2 value_index",
            [](auto& r) { r.add_value_index(0), r.add_value_index(0); }},
       }) {
    v1::WriteSmallReplicasRequest req = request(status.incarnation());
    bad.spoil(req);
    EXPECT_THAT(FromGrpcStatus(stub->WriteSmallReplicas(Ctx().get(), req, &resp)),
                StatusIs(Code::kInvalidArgument, bad.what));
  }
  v1::GetReplicaStatusResponse after;
  ASSERT_TRUE(stub->GetReplicaStatus(Ctx().get(), {}, &after).ok());
  EXPECT_EQ(after.DebugString(), status.DebugString());
  // The same write, unspoiled, goes through, with its value numbered too.
  EXPECT_OK(
      FromGrpcStatus(stub->WriteSmallReplicas(Ctx().get(), request(status.incarnation()), &resp)));
  EXPECT_EQ(resp.checksum(), HeaderFor(data, {4}).checksum());
  v1::WriteSmallReplicasRequest numbered = request(status.incarnation());
  numbered.add_value_index(0);
  EXPECT_OK(FromGrpcStatus(stub->WriteSmallReplicas(Ctx().get(), numbered, &resp)));
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// The C++ client library against a real coordinator gRPC server on
// 127.0.0.1:0 in this process (its core with fake workers): options, scopes,
// the trainer- and admin-facing calls, and statuses as the API documents them.
#include "repvar/client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/to_proto.h"
#include "common/tensor/tensor.h"
#include "repvar/step.h"
#include "repvar/v1/coordinator.grpc.pb.h"
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

// S4: a trainer whose host sits the step out (its replicas are
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

// The seed's defaults: Assign answers without the value, AssignAdd and
// AssignSub with the new one (unary, streamed and batched alike); an explicit
// read_value is obeyed.
TEST_F(ClientTest, AssignDefaults_AddAndSubReturnNewValue_AssignDoesNot) {
  for (int64_t n : {int64_t{2}, int64_t{(1 << 20) / 4 + 1}}) {
    const std::string name = absl::StrCat("d", n);
    ASSERT_OK(client_->CreateVariable(
        {.name = name, .dtype = DType::kFloat32, .shape = {n}, .replica_count = 4}));
    std::vector<float> v(static_cast<size_t>(n), 1.5f);
    auto assigned = client_->Assign<float>(name, v);
    ASSERT_OK(assigned);
    EXPECT_FALSE(assigned->value.has_value()) << n;
    auto added = client_->AssignAdd<float>(name, v);
    ASSERT_OK(added);
    ASSERT_TRUE(added->value.has_value()) << n;
    EXPECT_EQ(added->value->as<float>()[0], 3.0f) << n;
    EXPECT_EQ(added->value->version, 2) << n;
    auto subtracted = client_->AssignSub<float>(name, v);
    ASSERT_OK(subtracted);
    ASSERT_TRUE(subtracted->value.has_value()) << n;
    EXPECT_EQ(subtracted->value->as<float>()[0], 1.5f) << n;
    auto quiet = client_->AssignAdd<float>(name, v, /*read_value=*/false);
    ASSERT_OK(quiet);
    EXPECT_FALSE(quiet->value.has_value()) << n;
  }
  const std::vector<float> one = {1, 1};
  const auto bytes = std::as_bytes(std::span(one));
  auto batch = client_->AssignBatch({{.name = "d2", .op = AssignOp::kAssign, .bytes = bytes},
                                     {.name = "d2", .op = AssignOp::kAdd, .bytes = bytes}});
  // A name twice in one batch is refused; one item each is not.
  EXPECT_THAT(batch, StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
  batch = client_->AssignBatch({{.name = "d2", .op = AssignOp::kAdd, .bytes = bytes}});
  ASSERT_OK(batch);
  ASSERT_TRUE((*batch)[0].value.has_value());
  batch = client_->AssignBatch(
      {{.name = "d2", .op = AssignOp::kAdd, .bytes = bytes, .read_value = false}});
  ASSERT_OK(batch);
  EXPECT_FALSE((*batch)[0].value.has_value());
  batch = client_->AssignBatch({{.name = "d2", .op = AssignOp::kAssign, .bytes = bytes}});
  ASSERT_OK(batch);
  EXPECT_FALSE((*batch)[0].value.has_value());
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

// Read and ReadInto (C1): the value as written, in a fresh vector or the
// caller's buffer, whether it comes in one unary call (small, its spec
// known) or a stream of chunks (large, or a client that has not seen the
// variable).
TEST_F(ClientTest, C1_ReadInto_TheValueReadGives_InTheCallersBuffer) {
  auto fresh = Client::Connect({.coordinator_address = coordinator_.address(),
                                .chunk_bytes = 64 << 10});  // knows no spec: streams
  ASSERT_OK(fresh);
  for (int64_t n : {int64_t{3}, int64_t{(1 << 20) / 4 + 5}}) {
    const std::string name = absl::StrCat("w", n);
    ASSERT_OK(client_->CreateVariable(
        {.name = name, .dtype = DType::kFloat32, .shape = {n}, .replica_count = 4}));
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f;
    ASSERT_OK(client_->Assign<float>(name, v));
    // A client that knows no spec streams its first read, whichever it is.
    auto into_first =
        Client::Connect({.coordinator_address = coordinator_.address(), .chunk_bytes = 64 << 10});
    ASSERT_OK(into_first);
    std::vector<float> first(v.size(), -1);
    auto streamed = (*into_first)->ReadInto(name, std::as_writable_bytes(std::span<float>(first)));
    ASSERT_OK(streamed);
    EXPECT_EQ(first, v) << n;
    for (Client* c : {client_.get(), fresh->get(), into_first->get()}) {
      auto read = c->Read(name);
      ASSERT_OK(read);
      EXPECT_EQ(std::vector<float>(read->as<float>().begin(), read->as<float>().end()), v) << n;
      EXPECT_EQ(read->shape, std::vector<int64_t>{n});
      std::vector<float> out(v.size(), -1);
      auto info = c->ReadInto(name, std::as_writable_bytes(std::span<float>(out)));
      ASSERT_OK(info);
      EXPECT_EQ(out, v) << n;
      EXPECT_EQ(info->dtype, DType::kFloat32);
      EXPECT_EQ(info->shape, std::vector<int64_t>{n});
      EXPECT_EQ(info->version, read->version);
      EXPECT_EQ(info->checksum, read->checksum);
    }
  }
  std::vector<float> out(3);
  EXPECT_THAT(client_->ReadInto("nope", std::as_writable_bytes(std::span<float>(out))),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(client_->CreateVariable(
      {.name = "unset", .dtype = DType::kFloat32, .shape = {3}, .replica_count = 4}));
  EXPECT_THAT((*fresh)->ReadInto("unset", std::as_writable_bytes(std::span<float>(out))),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// A buffer of another size than the value is refused before a byte of it is
// written, on either path.
TEST_F(ClientTest, ReadInto_BufferOfAnotherSize_InvalidArgument_Untouched) {
  auto fresh = Client::Connect({.coordinator_address = coordinator_.address()});
  ASSERT_OK(fresh);
  for (int64_t n : {int64_t{3}, int64_t{(1 << 20) / 4 + 5}}) {
    const std::string name = absl::StrCat("w", n);
    ASSERT_OK(client_->CreateVariable(
        {.name = name, .dtype = DType::kFloat32, .shape = {n}, .replica_count = 4}));
    ASSERT_OK(client_->Assign<float>(name, std::vector<float>(static_cast<size_t>(n), 2)));
    for (Client* c : {client_.get(), fresh->get()}) {
      for (int64_t size : {n - 1, n + 1}) {
        std::vector<float> out(static_cast<size_t>(size), -1);
        EXPECT_THAT(c->ReadInto(name, std::as_writable_bytes(std::span<float>(out))),
                    StatusIs(absl::StatusCode::kInvalidArgument, "bytes"))
            << n << " into " << size;
        EXPECT_EQ(out, std::vector<float>(static_cast<size_t>(size), -1)) << n << " into " << size;
      }
    }
  }
}

// A coordinator whose ReadVariable answers are scripted per name, to damage
// them the ways a reader must catch.
class ScriptedReads final : public v1::CoordinatorTrainers::Service {
 public:
  explicit ScriptedReads(std::map<std::string, std::vector<v1::ReadVariableResponse>> script)
      : script_(std::move(script)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedReads() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status ReadVariable(grpc::ServerContext*, const v1::ReadVariableRequest* req,
                            grpc::ServerWriter<v1::ReadVariableResponse>* writer) override {
    calls_.push_back("stream " + req->name());
    auto it = script_.find(req->name());
    if (it == script_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, req->name());
    for (const auto& m : it->second) writer->Write(m);
    return grpc::Status::OK;
  }
  // The unary read of values a client knows to be small: `unary` answers
  // by name (one name a call), else RESOURCE_EXHAUSTED, as for a value
  // too large for one answer.
  grpc::Status ReadVariables(grpc::ServerContext*, const v1::ReadVariablesRequest* req,
                             v1::ReadVariablesResponse* resp) override {
    const std::string name = req->names_size() == 1 ? req->names(0) : "";
    calls_.push_back("unary " + name);
    auto it = unary_.find(name);
    if (it == unary_.end()) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too large for one answer");
    }
    *resp = it->second;
    return grpc::Status::OK;
  }
  // As a coordinator from before the columns answered: a result per name.
  void SetUnary(const std::string& name, v1::ReadResult result) {
    *unary_[name].add_results() = std::move(result);
  }
  void SetUnaryColumns(const std::string& name, v1::ReadColumns columns) {
    *unary_[name].mutable_columns() = std::move(columns);
  }
  std::vector<std::string> TakeCalls() { return std::exchange(calls_, {}); }

 private:
  std::map<std::string, v1::ReadVariablesResponse> unary_;
  std::vector<std::string> calls_;  // one client thread calls at a time
  std::map<std::string, std::vector<v1::ReadVariableResponse>> script_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

v1::ReadVariableResponse Header(const std::string& bytes, uint64_t checksum) {
  v1::ReadVariableResponse m;
  m.mutable_header()->set_version(7);
  v1::TensorHeader* t = m.mutable_header()->mutable_tensor();
  t->mutable_spec()->set_dtype(static_cast<v1::DType>(DType::kFloat32));
  t->mutable_spec()->add_dims(static_cast<int64_t>(bytes.size() / 4));
  t->set_byte_size(bytes.size());
  t->set_checksum(checksum);
  return m;
}

v1::ReadVariableResponse Chunk(const std::string& bytes, uint64_t offset, size_t size,
                               uint64_t checksum_xor = 0) {
  v1::ReadVariableResponse m;
  std::string data = bytes.substr(offset, size);
  m.mutable_chunk()->set_offset(offset);
  m.mutable_chunk()->set_checksum(
      Checksum(std::as_bytes(std::span<const char>(data.data(), data.size()))) ^ checksum_xor);
  m.mutable_chunk()->set_data(std::move(data));
  return m;
}

// The unary answer of a coordinator before the columns: `bytes` under
// `header`'s tensor, at version 7.
v1::ReadResult Result(const v1::ReadVariableResponse& header, const std::string& bytes) {
  v1::ReadResult r;
  *r.mutable_value()->mutable_header() = header.header().tensor();
  r.mutable_value()->set_data(bytes);
  r.set_version(7);
  return r;
}

// Read and ReadInto check what a stream delivers: a damaged chunk, a chunk
// out of place or before the header, a value cut short, one whose whole
// checksum fails, a header whose size is not its shape's (or that has no
// valid dtype) and one without the value's checksum (repvar sends every
// checksum: 0 is not "not given" to a reader) are each DATA_LOSS; the
// undamaged stream beside them reads.
TEST(ClientReads, DamagedStream_DataLoss_TheSameStreamUndamagedReads) {
  std::string bytes(32, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  const uint64_t sum = Checksum(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
  const auto header = Header(bytes, sum);
  auto oversized = header;  // a size its shape does not have, never reserved
  oversized.mutable_header()->mutable_tensor()->set_byte_size(uint64_t{1} << 60);
  auto unspecified = header;
  unspecified.mutable_header()->mutable_tensor()->mutable_spec()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ScriptedReads coordinator({
      {"good", {header, Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
      {"flipped", {header, Chunk(bytes, 0, 16), Chunk(bytes, 16, 16, /*checksum_xor=*/1)}},
      {"gap", {header, Chunk(bytes, 0, 8), Chunk(bytes, 16, 16)}},
      {"overlap", {header, Chunk(bytes, 0, 16), Chunk(bytes, 8, 24)}},
      {"headless", {Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
      {"short", {header, Chunk(bytes, 0, 16)}},
      {"whole", {Header(bytes, sum ^ 1), Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
      {"oversized", {oversized, Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
      {"unspecified", {unspecified, Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
      {"unsummed", {Header(bytes, 0), Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
  });
  auto c = Client::Connect({.coordinator_address = coordinator.address(), .max_attempts = 1});
  ASSERT_OK(c);
  std::vector<std::byte> out(bytes.size());
  auto good = (*c)->ReadInto("good", out);
  ASSERT_OK(good);
  EXPECT_EQ(std::memcmp(out.data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(good->version, 7);
  EXPECT_EQ(good->checksum, sum);
  // A client that has read "good" knows it is small and would ask for it
  // in one unary call, which this coordinator does not script: read it
  // with one that has not.
  auto other = Client::Connect({.coordinator_address = coordinator.address(), .max_attempts = 1});
  ASSERT_OK(other);
  auto read = (*other)->Read("good");
  ASSERT_OK(read);
  EXPECT_EQ(read->checksum, sum);
  for (const char* name : {"flipped", "gap", "overlap", "headless", "short", "whole", "oversized",
                           "unspecified", "unsummed"}) {
    EXPECT_THAT((*c)->ReadInto(name, out), StatusIs(absl::StatusCode::kDataLoss, name)) << name;
    EXPECT_THAT((*c)->Read(name), StatusIs(absl::StatusCode::kDataLoss)) << name;
  }
  EXPECT_THAT((*c)->ReadInto("absent", out), StatusIs(absl::StatusCode::kNotFound));
}

// A value read through a stream is known to this client from then on: if
// small, it is next read in one unary call. One created again too large for
// a unary answer since (RESOURCE_EXHAUSTED) is streamed instead.
TEST(ClientReads, AStreamedSmallValueIsNextReadInOneUnaryCall_OneTooLargeIsStreamed) {
  std::string bytes(32, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 3 + 2);
  const uint64_t sum = Checksum(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
  const auto header = Header(bytes, sum);
  ScriptedReads coordinator({
      {"small", {header, Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
      {"regrown", {header, Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
  });
  coordinator.SetUnary("small", Result(header, bytes));
  auto c = Client::Connect({.coordinator_address = coordinator.address(), .max_attempts = 1});
  ASSERT_OK(c);
  std::vector<std::byte> out(bytes.size());
  for (const char* name : {"small", "regrown"}) {
    ASSERT_OK((*c)->ReadInto(name, out));
    auto read = (*c)->Read(name);
    ASSERT_OK(read) << name;
    EXPECT_EQ(read->checksum, sum);
    EXPECT_EQ(read->version, 7);
    auto into = (*c)->ReadInto(name, out);
    ASSERT_OK(into) << name;
    EXPECT_EQ(std::memcmp(out.data(), bytes.data(), bytes.size()), 0);
  }
  EXPECT_EQ(coordinator.TakeCalls(),
            (std::vector<std::string>{"stream small", "unary small", "unary small",
                                      "stream regrown", "unary regrown", "stream regrown",
                                      "unary regrown", "stream regrown"}));
}

// A small value this client knows is read from its one unary answer straight
// into the caller's buffer and checked there, whether the answer comes by
// column or, from a coordinator before the columns, as a result. A value
// that fails its checksum is DATA_LOSS; an answer whose columns do not add
// up is DATA_LOSS before a byte of it is written.
TEST(ClientReads, KnownSmallReadInto_FromTheAnswerIntoTheBuffer_CheckedThere) {
  std::string bytes(32, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 5 + 3);
  const auto span = std::as_bytes(std::span<const char>(bytes.data(), bytes.size()));
  const uint64_t sum = Checksum(span);
  const auto header = Header(bytes, sum);
  const std::vector<v1::ReadVariableResponse> stream = {header, Chunk(bytes, 0, 16),
                                                        Chunk(bytes, 16, 16)};
  ScriptedReads coordinator(
      {{"columns", stream}, {"result", stream}, {"flipped", stream}, {"spare", stream}});
  auto tensor = Tensor::FromBytes(TensorSpec{DType::kFloat32, {8}}, span);
  ASSERT_OK(tensor);
  v1::ReadColumns columns;
  ReadColumnsToProto({ReadResult{7, std::make_shared<const Tensor>(*std::move(tensor))}}, &columns);
  coordinator.SetUnaryColumns("columns", columns);
  v1::ReadColumns flipped = columns;
  flipped.set_checksums(0, sum ^ 1);
  coordinator.SetUnaryColumns("flipped", flipped);
  v1::ReadColumns spare = columns;
  spare.mutable_data()->push_back('x');
  coordinator.SetUnaryColumns("spare", spare);
  coordinator.SetUnary("result", Result(header, bytes));

  auto c = Client::Connect({.coordinator_address = coordinator.address(), .max_attempts = 1});
  ASSERT_OK(c);
  std::vector<std::byte> out(bytes.size());
  for (const char* name : {"columns", "result", "flipped", "spare"}) {
    ASSERT_OK((*c)->ReadInto(name, out)) << name;  // streamed: now known small
  }
  for (const char* name : {"columns", "result"}) {
    std::fill(out.begin(), out.end(), std::byte{0xab});
    auto info = (*c)->ReadInto(name, out);
    ASSERT_OK(info) << name;
    EXPECT_EQ(std::memcmp(out.data(), bytes.data(), bytes.size()), 0) << name;
    EXPECT_EQ(info->version, 7);
    EXPECT_EQ(info->checksum, sum);
    EXPECT_EQ(info->dtype, DType::kFloat32);
    EXPECT_EQ(info->shape, std::vector<int64_t>{8});
  }
  EXPECT_THAT((*c)->ReadInto("flipped", out),
              StatusIs(absl::StatusCode::kDataLoss, "fails its checksum"));
  std::fill(out.begin(), out.end(), std::byte{0xab});
  EXPECT_THAT((*c)->ReadInto("spare", out), StatusIs(absl::StatusCode::kDataLoss, "left over"));
  EXPECT_EQ(out, std::vector<std::byte>(bytes.size(), std::byte{0xab}));
  EXPECT_EQ(
      coordinator.TakeCalls(),
      (std::vector<std::string>{"stream columns", "stream result", "stream flipped", "stream spare",
                                "unary columns", "unary result", "unary flipped", "unary spare"}));
}

// A header consistent with itself but announcing more than this process may
// hold (2^62 bytes: its shape's size) is refused before any room is
// reserved for it; the same stream at its true size reads.
TEST(ClientReads, HeaderAnnouncingMoreThanTheProcessMayHold_ResourceExhausted) {
  std::string bytes(32, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 5 + 3);
  const uint64_t sum = Checksum(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
  auto huge = Header(bytes, sum);
  v1::TensorHeader* t = huge.mutable_header()->mutable_tensor();
  t->mutable_spec()->set_dims(0, int64_t{1} << 60);
  t->set_byte_size(uint64_t{1} << 62);
  ScriptedReads coordinator({
      {"true", {Header(bytes, sum), Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
      {"huge", {huge, Chunk(bytes, 0, 16), Chunk(bytes, 16, 16)}},
  });
  auto c = Client::Connect({.coordinator_address = coordinator.address(), .max_attempts = 1});
  ASSERT_OK(c);
  auto read = (*c)->Read("true");
  ASSERT_OK(read);
  EXPECT_EQ(read->bytes.size(), bytes.size());
  EXPECT_THAT((*c)->Read("huge"), StatusIs(absl::StatusCode::kResourceExhausted, "huge"));
  std::vector<std::byte> out(bytes.size());
  EXPECT_THAT((*c)->ReadInto("huge", out), StatusIs(absl::StatusCode::kInvalidArgument));
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

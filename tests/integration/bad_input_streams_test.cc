// SPDX-License-Identifier: Apache-2.0
// X2 on streams and memory: announced sizes that never come, messages that
// do not parse, chunks in another layout, framed reads, small writes by
// column; each refused with nothing changed, a good one answered.
#include "tests/integration/bad_input_fixture.h"

namespace repvar {
namespace {

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
      testing::RawCall(cluster_->worker_address(0), "/repvar.v1.WorkerReplicas/WriteReplicas",
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
      testing::RawCall(cluster_->address(), method,
                       {head2.SerializeAsString(), std::string("\xff\xff\xff", 3)})
          .first;
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_NE(refused.error_message().find("does not parse"), std::string::npos)
      << refused.error_message();
  EXPECT_THAT(client_->Read("layout").status(), StatusIs(Code::kFailedPrecondition));

  const grpc::Status taken =
      testing::RawCall(cluster_->address(), method, {head.SerializeAsString(), reordered}).first;
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
    auto [refused, none] = testing::RawCall(c.address, c.method, {garbage});
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.method << ": " << refused.error_message();
    EXPECT_TRUE(none.empty()) << c.method;
    auto [answered, messages] = testing::RawCall(c.address, c.method, {c.good});
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

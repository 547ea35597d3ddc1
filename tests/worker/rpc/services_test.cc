// SPDX-License-Identifier: Apache-2.0
// A worker's two gRPC adapters over an in-process channel, backed by the
// real replica store and step table (the coordinator and the step resolver
// are fakes): conversion, status mapping, bad input refused with nothing
// applied.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/base/random.h"
#include "common/base/status_util.h"
#include "common/rpc/grpc_status.h"
#include "common/tensor/tensor.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"
#include "worker/rpc/replicas_service.h"
#include "worker/rpc/steps_service.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::FloatBytes;
using ::repvar::testing::StatusIs;

constexpr uint64_t kInc = 7;

std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration d = absl::Seconds(10)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  return ctx;
}

uint64_t Sum(const std::string& s) {
  return Checksum(std::as_bytes(std::span(s.data(), s.size())));
}

void Tensor2(const std::string& data, v1::TensorHeader* h) {
  h->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  h->mutable_spec()->add_dims(2);
  h->set_byte_size(data.size());
  h->set_checksum(Sum(data));
}
v1::TensorHeader TensorHeaderOf(const std::string& data) {
  v1::TensorHeader h;
  Tensor2(data, &h);
  return h;
}

// Step 3 (epoch 11): this worker holds replica 0 of variable 1.
class OneStepLink final : public StepLink {
 public:
  absl::StatusOr<StepInfo> GetStep(uint64_t, uint64_t) override {
    StepInfo info;
    info.step = 3;
    info.epoch = 11;
    info.barrier_timeout = absl::Seconds(5);
    info.layout_id = 5;
    StepParticipant me;
    me.task = TaskKey{"tpu_worker", 0};
    me.incarnation_digest = IncarnationDigest(kInc);  // what the wire carries
    info.participants.push_back(me);
    StepVariable v;
    v.id = 1;
    v.name = "w";
    v.spec = TensorSpec{DType::kFloat32, {2}};
    v.replica_participant = {0};
    info.variables.push_back(v);
    return info;
  }
  absl::StatusOr<std::variant<StepPlan, StepResolution>> ReportStep(const WorkerReport&,
                                                                    absl::Duration) override {
    return absl::UnimplementedError("the resolver is a fake");
  }
  absl::StatusOr<StepResolution> FinishStep(const WorkerFinish&, absl::Duration) override {
    return absl::UnimplementedError("the resolver is a fake");
  }
  absl::StatusOr<StepResolution> WaitStep(uint64_t, absl::Duration, bool) override {
    return absl::UnimplementedError("the resolver is a fake");
  }
};

class CommittingResolver final : public Resolver {
 public:
  StepResolution Resolve(const LocalStep& step) override {
    StepResolution r;
    r.step = step.header.step;
    r.epoch = step.header.epoch;
    r.state = StepState::kCommitted;
    r.changed.push_back(CommittedVariable{1, "w", 9, 42});
    return r;
  }
};

class WorkerServicesTest : public ::testing::Test {
 protected:
  WorkerServicesTest() {
    grpc::ServerBuilder builder;
    builder.RegisterService(&replicas_);
    builder.RegisterService(&steps_service_);
    server_ = builder.BuildAndStart();
    auto channel = server_->InProcessChannel(grpc::ChannelArguments());
    replicas_stub_ = v1::WorkerReplicas::NewStub(channel);
    steps_stub_ = v1::WorkerSteps::NewStub(channel);
  }
  ~WorkerServicesTest() override {
    server_->Shutdown();
    server_->Wait();
  }

  absl::Status Write(uint64_t incarnation, const std::string& data, uint64_t chunk_sum) {
    auto ctx = Ctx();
    v1::WriteReplicasResponse resp;
    auto stream = replicas_stub_->WriteReplicas(ctx.get(), &resp);
    v1::WriteReplicasRequest head;
    head.mutable_header()->set_incarnation(incarnation);
    head.mutable_header()->set_variable_id(1);
    head.mutable_header()->set_name("w");
    head.mutable_header()->set_version(4);
    head.mutable_header()->set_fence(1);
    head.mutable_header()->set_stream_writes(1);
    head.mutable_header()->add_replicas(0);
    Tensor2(data, head.mutable_header()->mutable_tensor());
    v1::WriteReplicasRequest chunk;
    chunk.mutable_chunk()->set_data(data);
    chunk.mutable_chunk()->set_checksum(chunk_sum);
    stream->Write(head);
    stream->Write(chunk);
    stream->WritesDone();
    return FromGrpcStatus(stream->Finish());
  }
  absl::StatusOr<std::string> Read(int64_t min_version, absl::Duration wait) {
    auto ctx = Ctx(wait);
    v1::ReadReplicaRequest req;
    req.set_variable_id(1);
    req.set_min_version(min_version);
    auto reader = replicas_stub_->ReadReplica(ctx.get(), req);
    v1::ReadVariableChunk msg;
    std::string out;
    while (reader->Read(&msg)) {
      if (msg.has_chunk()) out += msg.chunk().data();
    }
    REPVAR_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    return out;
  }

  // Replica 0 of w (float32[2], version 1) is here; `req` writes `data` to
  // it in step 3 (epoch 11).
  void StepThreeWritesReplicaZero(const std::string& data, v1::StepWriteSmallRequest* req) {
    ASSERT_OK(store_.Apply({ReplicaWrite{
        1,
        "w",
        1,
        {0},
        std::make_shared<const Tensor>(*Tensor::Zeros(TensorSpec{DType::kFloat32, {2}}))}}));
    v1::StepWriteHeader* h = req->add_writes();
    h->set_step(3);
    h->set_epoch(11);
    h->set_variable_id(1);
    Tensor2(data, h->mutable_tensor());
    h->set_inline_data(data);
  }

  ReplicaStore store_;
  OneStepLink link_;
  CommittingResolver resolver_;
  StepTable steps_{WorkerIdentity{"tpu_worker", 0, kInc, {"TPU:0"}}, &store_, &link_, &resolver_};
  ReplicasService replicas_{kInc, &store_, nullptr};
  StepsService steps_service_{&steps_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::WorkerReplicas::Stub> replicas_stub_;
  std::unique_ptr<v1::WorkerSteps::Stub> steps_stub_;
};

TEST_F(WorkerServicesTest, Replicas_WriteRead_StaleIncarnationAndBadChunkRefused) {
  const std::string data = FloatBytes({3, 4});
  EXPECT_THAT(Write(kInc + 1, data, Sum(data)),
              StatusIs(absl::StatusCode::kAborted, "incarnation"));
  EXPECT_THAT(Write(kInc, data, Sum(data) + 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(store_.List().empty()) << "nothing applied";
  ASSERT_OK(Write(kInc, data, Sum(data)));
  EXPECT_EQ(*Read(4, absl::Seconds(5)), data);
  // A version the replica does not reach in time: UNAVAILABLE, not a wrong
  // value, and answered before the caller's deadline (the worker gives up
  // when half of the call's time is left).
  EXPECT_THAT(Read(5, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kUnavailable, "not yet 5"));
  v1::GetReplicaStatusResponse status;
  ASSERT_OK(FromGrpcStatus(replicas_stub_->GetReplicaStatus(Ctx().get(), {}, &status)));
  EXPECT_EQ(status.incarnation(), kInc);
  ASSERT_EQ(status.replicas_size(), 1);
  EXPECT_EQ(status.replicas(0).version(), 4);
  v1::DropVariableRequest drop;
  drop.set_variable_id(1);
  drop.set_incarnation(kInc + 1);
  v1::DropVariableResponse dropped;
  EXPECT_THAT(FromGrpcStatus(replicas_stub_->DropVariable(Ctx().get(), drop, &dropped)),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(store_.List().size(), 1u);
}

TEST_F(WorkerServicesTest, Replicas_WriteSmall_ByColumn_EveryValueWhole) {
  const std::string data = FloatBytes({3, 4});
  v1::WriteSmallReplicasRequest req;
  req.set_incarnation(kInc);
  req.add_variable_ids(1);
  req.add_names("w");
  req.add_versions(1);
  req.add_fences(1);
  req.add_replica_counts(1);
  req.add_replicas(0);
  req.add_specs()->CopyFrom(TensorHeaderOf(data).spec());
  req.add_spec_index(0);
  req.add_checksums(Sum(data));
  req.set_data(data.substr(0, 4));  // half of it
  v1::WriteReplicasResponse resp;
  EXPECT_THAT(FromGrpcStatus(replicas_stub_->WriteSmallReplicas(Ctx().get(), req, &resp)),
              StatusIs(absl::StatusCode::kInvalidArgument, "bytes of data are left"));
  req.set_data(data);
  ASSERT_OK(FromGrpcStatus(replicas_stub_->WriteSmallReplicas(Ctx().get(), req, &resp)));
  EXPECT_EQ(resp.checksum(), Sum(data));
  EXPECT_EQ(store_.Get(1, 0)->version, 1);
}

// One trainer connection holds at most its share of what the worker lends
// to tensors being received: a write over it is RESOURCE_EXHAUSTED naming
// the connection, and changes nothing; one within it goes through.
TEST_F(WorkerServicesTest, Steps_WriteOverTheConnectionsShare_ResourceExhausted) {
  MemoryBudget budget(1 << 20, nullptr, "the worker's budget");
  const std::string data = FloatBytes({5, 6});
  v1::StepWriteSmallRequest req;
  ASSERT_NO_FATAL_FAILURE(StepThreeWritesReplicaZero(data, &req));
  for (uint64_t share : {4, 8}) {
    StepsService limited(&steps_, &budget, share);
    grpc::ServerBuilder builder;
    builder.RegisterService(&limited);
    auto server = builder.BuildAndStart();
    auto stub = v1::WorkerSteps::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
    v1::StepWriteResponse resp;
    const absl::Status s = FromGrpcStatus(stub->StepWriteSmall(Ctx().get(), req, &resp));
    if (share == 4) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "connection"));
      auto view = steps_.Read(11, 1, 0);
      EXPECT_TRUE(!view.ok() || view->checksum != Sum(data)) << "the refused write changed nothing";
    } else {
      EXPECT_OK(s);
    }
    EXPECT_EQ(budget.used(), 0u);
    server->Shutdown();
    server->Wait();
  }
}

TEST_F(WorkerServicesTest, Steps_WriteReadCommit_Converted_BadHeaderRefused) {
  const std::string data = FloatBytes({5, 6});
  v1::StepWriteSmallRequest req;
  ASSERT_NO_FATAL_FAILURE(StepThreeWritesReplicaZero(data, &req));
  v1::StepWriteHeader* h = req.mutable_writes(0);
  h->mutable_tensor()->set_checksum(1);
  v1::StepWriteResponse resp;
  EXPECT_THAT(FromGrpcStatus(steps_stub_->StepWriteSmall(Ctx().get(), req, &resp)),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  h->mutable_tensor()->set_checksum(Sum(data));
  ASSERT_OK(FromGrpcStatus(steps_stub_->StepWriteSmall(Ctx().get(), req, &resp)));
  auto ctx = Ctx();
  v1::StepReadRequest read;
  read.set_step(3);
  read.set_epoch(11);
  read.set_variable_id(1);
  auto reader = steps_stub_->StepRead(ctx.get(), read);
  v1::ReadVariableChunk msg;
  std::string back;
  while (reader->Read(&msg)) {
    if (msg.has_chunk()) back += msg.chunk().data();
    if (msg.has_header()) back += msg.header().has_spec() ? "" : "?";
  }
  ASSERT_OK(FromGrpcStatus(reader->Finish()));
  EXPECT_EQ(back, data) << "the step's view: its own write";
  v1::CommitStepRequest commit;
  commit.set_step(3);
  commit.set_epoch(11);
  v1::StepResolution res;
  ASSERT_OK(FromGrpcStatus(steps_stub_->CommitStep(Ctx().get(), commit, &res)));
  EXPECT_EQ(res.state(), v1::STEP_STATE_COMMITTED);
  ASSERT_EQ(res.changed_size(), 1);
  EXPECT_EQ(res.changed(0).version(), 9);
  commit.add_devices("GPU:7");
  EXPECT_THAT(FromGrpcStatus(steps_stub_->CommitStep(Ctx().get(), commit, &res)),
              StatusIs(absl::StatusCode::kInvalidArgument, "GPU:7"));
}

// StepReadSmall answers each read as StepRead gives the value (the step's
// own write, the committed value at epoch 0), whole and checked, in order;
// a refused read, a value over 1 MiB, answers over 3 MiB in all or too many
// reads fail the whole call, and the reads within the bounds beside them
// are answered.
TEST_F(WorkerServicesTest, Steps_ReadSmall_EachAsStepReadGivesIt_OverTheBoundsRefusedWhole) {
  const std::string data = FloatBytes({5, 6});
  v1::StepWriteSmallRequest write;
  ASSERT_NO_FATAL_FAILURE(StepThreeWritesReplicaZero(data, &write));
  v1::StepWriteResponse written;
  ASSERT_OK(FromGrpcStatus(steps_stub_->StepWriteSmall(Ctx().get(), write, &written)));
  for (auto [id, floats] : {std::pair<uint64_t, int64_t>{2, 300 << 10}, {3, 225 << 10}}) {
    ASSERT_OK(store_.Apply({ReplicaWrite{
        id,
        absl::StrCat("v", id),
        1,
        {0},
        std::make_shared<const Tensor>(*Tensor::Zeros(TensorSpec{DType::kFloat32, {floats}}))}}));
  }
  auto read = [](uint64_t epoch, uint64_t id, int32_t replica = 0) {
    v1::StepReadRequest r;
    r.set_step(epoch == 0 ? 0 : 3);
    r.set_epoch(epoch);
    r.set_variable_id(id);
    r.set_replica(replica);
    return r;
  };
  auto call = [&](std::vector<v1::StepReadRequest> reads, v1::StepReadSmallResponse* resp) {
    v1::StepReadSmallRequest req;
    for (auto& r : reads) *req.add_reads() = std::move(r);
    return FromGrpcStatus(steps_stub_->StepReadSmall(Ctx().get(), req, resp));
  };
  v1::StepReadSmallResponse resp;
  ASSERT_OK(call({read(11, 1), read(0, 1), read(11, 1)}, &resp));
  ASSERT_EQ(resp.values_size(), 3);
  const std::string zeros(8, '\0');
  for (int i : {0, 1, 2}) {
    const v1::Tensor& t = resp.values(i).value();
    EXPECT_EQ(t.data(), i == 1 ? zeros : data) << i;
    EXPECT_EQ(t.header().checksum(), Sum(t.data())) << i;
    EXPECT_EQ(t.header().byte_size(), 8u) << i;
    EXPECT_EQ(resp.values(i).version(), 1) << i;
  }
  // 3 x 900 KiB fit in the 3 MiB; a fourth does not; 1.2 MiB is over 1 MiB.
  resp.Clear();
  ASSERT_OK(call({read(0, 3), read(0, 3), read(0, 3), read(11, 1)}, &resp));
  EXPECT_EQ(resp.values_size(), 4);
  EXPECT_THAT(call({read(0, 3), read(0, 3), read(0, 3), read(0, 3)}, &resp),
              StatusIs(absl::StatusCode::kResourceExhausted, "3 MiB in all"));
  EXPECT_THAT(call({read(11, 1), read(0, 2)}, &resp),
              StatusIs(absl::StatusCode::kResourceExhausted, "1 MiB a value"));
  EXPECT_THAT(call({read(11, 1), read(11, 1, 5)}, &resp), StatusIs(absl::StatusCode::kNotFound));
  std::vector<v1::StepReadRequest> many(StepsService::kMaxSmallReads + 1, read(0, 1));
  EXPECT_THAT(call(many, &resp), StatusIs(absl::StatusCode::kResourceExhausted, "reads"));
  many.pop_back();
  resp.Clear();
  ASSERT_OK(call(many, &resp));
  EXPECT_EQ(static_cast<uint64_t>(resp.values_size()), StepsService::kMaxSmallReads);
}

}  // namespace
}  // namespace repvar::worker

// SPDX-License-Identifier: Apache-2.0
// The coordinator's three gRPC adapters over an in-process channel, backed
// by the real core with fake workers: proto <-> model conversion, status
// mapping, bad input answered with a clear status and nothing changed. The
// logic itself is tested in tests/server/core.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/tensor/tensor.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "tests/testing/in_process_coordinator.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar::server {
namespace {

using ::repvar::testing::FloatBytes;
using ::repvar::testing::StatusIs;

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

class ServicesTest : public ::testing::Test {
 protected:
  void SetUp() override { coordinator_.RegisterWorkers(2, 2); }

  v1::CreateVariablesRequest CreateW() {
    v1::CreateVariablesRequest req;
    req.set_request_id("create-w");
    v1::VariableSpec* s = req.add_items()->mutable_spec();
    s->set_name("w");
    s->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    s->mutable_tensor()->add_dims(2);
    s->set_replica_count(4);
    s->add_collections("extra");
    s->set_aggregation(v1::AGGREGATION_MEAN);
    return req;
  }
  absl::Status Assign(const std::vector<v1::AssignVariableRequest>& msgs,
                      v1::AssignVariableResponse* resp) {
    auto ctx = Ctx();
    auto stream = trainers_->AssignVariable(ctx.get(), resp);
    for (const auto& m : msgs) stream->Write(m);
    stream->WritesDone();
    return FromGrpcStatus(stream->Finish());
  }
  v1::AssignVariableRequest Header(const std::string& data, uint64_t checksum) {
    v1::AssignVariableRequest m;
    v1::AssignHeader* h = m.mutable_header();
    h->set_name("w");
    h->set_read_value(true);
    h->mutable_tensor()->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
    h->mutable_tensor()->mutable_spec()->add_dims(2);
    h->mutable_tensor()->set_byte_size(data.size());
    h->mutable_tensor()->set_checksum(checksum);
    return m;
  }
  v1::AssignVariableRequest Chunk(const std::string& data, uint64_t checksum) {
    v1::AssignVariableRequest m;
    m.mutable_chunk()->set_offset(0);
    m.mutable_chunk()->set_data(data);
    m.mutable_chunk()->set_checksum(checksum);
    return m;
  }
  static v1::BeginStepRequest StepOne() {
    v1::BeginStepRequest begin;
    begin.set_step(1);
    begin.set_barrier_timeout_ms(10000);
    return begin;
  }
  // w created and zero-initialized over gRPC, then step 1 begun: its StepInfo.
  void BeginStepOneOnW(v1::StepInfo* info) {
    v1::CreateVariablesResponse created;
    ASSERT_OK(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), CreateW(), &created)));
    v1::InitializeVariablesRequest init;
    init.add_items()->set_name("w");
    init.mutable_items(0)->mutable_initializer()->set_zeros(true);
    v1::InitializeVariablesResponse initialized;
    ASSERT_OK(FromGrpcStatus(trainers_->InitializeVariables(Ctx().get(), init, &initialized)));
    ASSERT_OK(FromGrpcStatus(trainers_->BeginStep(Ctx().get(), StepOne(), info)));
  }
  static uint64_t Sum(const std::string& s) {
    return Checksum(std::as_bytes(std::span(s.data(), s.size())));
  }

  repvar::testing::InProcessCoordinator coordinator_;
  std::unique_ptr<v1::CoordinatorWorkers::Stub> workers_ =
      v1::CoordinatorWorkers::NewStub(coordinator_.channel());
  std::unique_ptr<v1::CoordinatorTrainers::Stub> trainers_ =
      v1::CoordinatorTrainers::NewStub(coordinator_.channel());
  std::unique_ptr<v1::CoordinatorAdmin::Stub> admin_ =
      v1::CoordinatorAdmin::NewStub(coordinator_.channel());
};

TEST_F(ServicesTest, Workers_RegisterWorker_ConvertedAndBadDevicesRefusedUnchanged) {
  v1::RegisterWorkerRequest req;
  req.set_job("tpu_worker");
  req.set_task(2);
  req.set_address("h2:1");
  req.set_incarnation(7);
  req.add_devices("/job:tpu_worker/replica:0/task:2/device:TPU:0");
  v1::RegisterWorkerResponse resp;
  ASSERT_OK(FromGrpcStatus(workers_->RegisterWorker(Ctx().get(), req, &resp)));
  // Two versions per registration: registered, then listed once resynced.
  EXPECT_EQ(resp.topology_version(), 6);
  EXPECT_EQ(resp.heartbeat_interval_ms(), 2500);  // a quarter of the 10 s timeout
  req.set_task(3);
  req.set_devices(0, "/job:tpu_worker/replica:0/task:3/device:tpu:0");
  EXPECT_THAT(FromGrpcStatus(workers_->RegisterWorker(Ctx().get(), req, &resp)),
              StatusIs(absl::StatusCode::kInvalidArgument, "devices[0]"));
  v1::Topology topo;
  ASSERT_OK(FromGrpcStatus(trainers_->GetTopology(Ctx().get(), {}, &topo)));
  EXPECT_EQ(topo.version(), 6);
  EXPECT_EQ(topo.tasks_size(), 3);
  EXPECT_EQ(topo.infeed_host().cpu_device(), "/job:tpu_worker/replica:0/task:0/device:CPU:0");
}

TEST_F(ServicesTest, Trainers_CreateVariables_SpecAndViewsConverted_BadSpecRefused) {
  v1::CreateVariablesResponse resp;
  ASSERT_OK(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), CreateW(), &resp)));
  ASSERT_EQ(resp.variables_size(), 1);
  const v1::VariableInfo& v = resp.variables(0);
  EXPECT_TRUE(resp.created(0));
  EXPECT_EQ(v.spec().aggregation(), v1::AGGREGATION_MEAN);
  EXPECT_EQ(v.replicas_size(), 4);
  EXPECT_EQ(v.replicas(3).device(), "/job:tpu_worker/replica:0/task:1/device:TPU:1");
  EXPECT_EQ(v.replicas(3).state(), v1::REPLICA_STATE_UNINITIALIZED);
  EXPECT_EQ(v.collections_size(), 2);  // GLOBAL_VARIABLES and "extra" (not trainable)
  v1::CreateVariablesRequest bad = CreateW();
  bad.mutable_items(0)->mutable_spec()->set_name("x");
  bad.mutable_items(0)->mutable_spec()->set_aggregation(static_cast<v1::Aggregation>(9));
  EXPECT_THAT(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), bad, &resp)),
              StatusIs(absl::StatusCode::kInvalidArgument, "aggregation"));
  bad = CreateW();
  bad.set_request_id("create-y");
  bad.mutable_items(0)->mutable_spec()->set_name("y");
  bad.mutable_items(0)->mutable_spec()->set_replica_count(5);  // 4 accelerators
  EXPECT_THAT(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), bad, &resp)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "4 accelerators"));
  v1::ListVariablesResponse list;
  ASSERT_OK(FromGrpcStatus(trainers_->ListVariables(Ctx().get(), {}, &list)));
  EXPECT_EQ(list.variables_size(), 1);
}

// VARIABLE_DETAIL_BASIC answers without the replicas, everything else as
// FULL (the default); an unknown detail is refused with nothing created.
TEST_F(ServicesTest, Trainers_VariableDetail_BasicLeavesReplicasOut_FullByDefault_UnknownRefused) {
  v1::CreateVariablesRequest req = CreateW();
  req.set_detail(v1::VARIABLE_DETAIL_BASIC);
  v1::CreateVariablesResponse basic;
  ASSERT_OK(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), req, &basic)));
  ASSERT_EQ(basic.variables_size(), 1);
  EXPECT_TRUE(basic.created(0));
  EXPECT_EQ(basic.variables(0).replicas_size(), 0);
  EXPECT_EQ(basic.variables(0).spec().replica_count(), 4);
  EXPECT_GT(basic.variables(0).id(), 0u);
  EXPECT_EQ(basic.variables(0).collections_size(), 2);

  v1::ListVariablesRequest list_req;
  v1::ListVariablesResponse list;
  ASSERT_OK(FromGrpcStatus(trainers_->ListVariables(Ctx().get(), list_req, &list)));
  ASSERT_EQ(list.variables_size(), 1);
  EXPECT_EQ(list.variables(0).replicas_size(), 4);  // UNSPECIFIED: FULL
  list_req.set_detail(v1::VARIABLE_DETAIL_BASIC);
  ASSERT_OK(FromGrpcStatus(trainers_->ListVariables(Ctx().get(), list_req, &list)));
  EXPECT_EQ(list.variables(0).replicas_size(), 0);
  list_req.set_detail(v1::VARIABLE_DETAIL_FULL);
  ASSERT_OK(FromGrpcStatus(trainers_->ListVariables(Ctx().get(), list_req, &list)));
  EXPECT_EQ(list.variables(0).replicas_size(), 4);

  v1::CreateVariablesRequest unknown = CreateW();
  unknown.set_request_id("create-z");
  unknown.mutable_items(0)->mutable_spec()->set_name("z");
  unknown.set_detail(static_cast<v1::VariableDetail>(7));
  EXPECT_THAT(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), unknown, &basic)),
              StatusIs(absl::StatusCode::kInvalidArgument, "variable detail 7"));
  list_req.set_detail(static_cast<v1::VariableDetail>(7));
  EXPECT_THAT(FromGrpcStatus(trainers_->ListVariables(Ctx().get(), list_req, &list)),
              StatusIs(absl::StatusCode::kInvalidArgument, "variable detail 7"));
  list_req.set_detail(v1::VARIABLE_DETAIL_BASIC);
  ASSERT_OK(FromGrpcStatus(trainers_->ListVariables(Ctx().get(), list_req, &list)));
  EXPECT_EQ(list.variables_size(), 1);  // no "z"
}

TEST_F(ServicesTest, Trainers_AssignAndRead_ChunkStreams_BadChunkRefusedNothingChanged) {
  v1::CreateVariablesResponse created;
  ASSERT_OK(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), CreateW(), &created)));
  const std::string data = FloatBytes({1.5f, -2});
  v1::AssignVariableResponse resp;
  EXPECT_THAT(Assign({Header(data, Sum(data)), Chunk(data, Sum(data) + 1)}, &resp),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  EXPECT_THAT(Assign({Chunk(data, Sum(data))}, &resp),
              StatusIs(absl::StatusCode::kInvalidArgument, "AssignHeader"));
  EXPECT_EQ(coordinator_.core().GetVariable("w")->version, 0);
  ASSERT_OK(Assign({Header(data, Sum(data)), Chunk(data, Sum(data))}, &resp));
  EXPECT_EQ(resp.version(), 1);
  EXPECT_EQ(resp.value().data(), data);  // read_value
  auto ctx = Ctx();
  v1::ReadVariableRequest read;
  read.set_name("w");
  auto reader = trainers_->ReadVariable(ctx.get(), read);
  v1::ReadVariableResponse msg;
  std::string back;
  int64_t version = 0;
  while (reader->Read(&msg)) {
    if (msg.has_header()) version = msg.header().version();
    if (msg.has_chunk()) back += msg.chunk().data();
  }
  ASSERT_OK(FromGrpcStatus(reader->Finish()));
  EXPECT_EQ(version, 1);
  EXPECT_EQ(back, data);
}

// C4 with the seed's defaults: an unset read_value answers ADD and SUB with
// the new value and ASSIGN without; a set one is obeyed either way, on the
// stream and on the batched call alike.
TEST_F(ServicesTest, Trainers_AssignReadValueUnset_SeedDefaultPerOp_SetObeyed) {
  v1::CreateVariablesResponse created;
  ASSERT_OK(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), CreateW(), &created)));
  const std::string data = FloatBytes({1.5f, -2});
  auto streamed = [&](v1::AssignOp op, std::optional<bool> read_value) {
    v1::AssignVariableRequest head = Header(data, Sum(data));
    head.mutable_header()->set_op(op);
    head.mutable_header()->set_request_id(
        absl::StrCat("stream-", op, "-", read_value.has_value(), read_value.value_or(false)));
    if (read_value) {
      head.mutable_header()->set_read_value(*read_value);
    } else {
      head.mutable_header()->clear_read_value();
    }
    v1::AssignVariableResponse resp;
    EXPECT_OK(Assign({head, Chunk(data, Sum(data))}, &resp));
    return resp;
  };
  auto batched = [&](v1::AssignOp op, std::optional<bool> read_value) {
    v1::AssignVariablesRequest req;
    req.set_request_id(
        absl::StrCat("batch-", op, "-", read_value.has_value(), read_value.value_or(false)));
    v1::AssignItem* item = req.add_items();
    item->set_name("w");
    item->set_op(op);
    if (read_value) item->set_read_value(*read_value);
    *item->mutable_value()->mutable_header() = Header(data, Sum(data)).header().tensor();
    item->mutable_value()->set_data(data);
    v1::AssignVariablesResponse resp;
    EXPECT_OK(FromGrpcStatus(trainers_->AssignVariables(Ctx().get(), req, &resp)));
    EXPECT_EQ(resp.results_size(), 1);
    return resp.results_size() == 1 ? resp.results(0) : v1::AssignVariableResponse();
  };
  for (auto write : {std::function(streamed), std::function(batched)}) {
    EXPECT_FALSE(write(v1::ASSIGN_OP_ASSIGN, std::nullopt).has_value());
    v1::AssignVariableResponse added = write(v1::ASSIGN_OP_ADD, std::nullopt);
    ASSERT_TRUE(added.has_value());
    EXPECT_EQ(added.value().data(), FloatBytes({3, -4}));  // 1.5 + 1.5, -2 + -2
    v1::AssignVariableResponse subtracted = write(v1::ASSIGN_OP_SUB, std::nullopt);
    ASSERT_TRUE(subtracted.has_value());
    EXPECT_EQ(subtracted.value().data(), data);
    EXPECT_FALSE(write(v1::ASSIGN_OP_ADD, false).has_value());
    EXPECT_FALSE(write(v1::ASSIGN_OP_SUB, false).has_value());
    EXPECT_TRUE(write(v1::ASSIGN_OP_ASSIGN, true).has_value());
  }
}

TEST_F(ServicesTest, Admin_DeleteAndClusterStatus) {
  v1::DeleteVariableRequest del;
  del.set_name("nope");
  v1::DeleteVariableResponse deleted;
  EXPECT_THAT(FromGrpcStatus(admin_->DeleteVariable(Ctx().get(), del, &deleted)),
              StatusIs(absl::StatusCode::kNotFound, "nope"));
  del.set_request_id(std::string(80, 'x'));
  EXPECT_THAT(FromGrpcStatus(admin_->DeleteVariable(Ctx().get(), del, &deleted)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  v1::CreateVariablesResponse created;
  ASSERT_OK(FromGrpcStatus(trainers_->CreateVariables(Ctx().get(), CreateW(), &created)));
  v1::ClusterStatus status;
  ASSERT_OK(FromGrpcStatus(admin_->GetClusterStatus(Ctx().get(), {}, &status)));
  EXPECT_EQ(status.topology().tasks_size(), 2);
  ASSERT_EQ(status.variables_size(), 1);
  EXPECT_EQ(status.variables(0).spec().name(), "w");
  EXPECT_FALSE(status.steps().has_open());
  del.set_request_id("");
  del.set_name("w");
  ASSERT_OK(FromGrpcStatus(admin_->DeleteVariable(Ctx().get(), del, &deleted)));
  ASSERT_OK(FromGrpcStatus(admin_->GetClusterStatus(Ctx().get(), {}, &status)));
  EXPECT_EQ(status.variables_size(), 0);
}

TEST_F(ServicesTest, Steps_BeginOnTrainers_ReportOnWorkers_ResolvedAndListed) {
  v1::StepInfo info;
  ASSERT_NO_FATAL_FAILURE(BeginStepOneOnW(&info));
  ASSERT_EQ(info.participants_size(), 2);
  // The same layout again: the answer leaves it out.
  v1::BeginStepRequest begin = StepOne();
  begin.set_known_layout(info.layout_id());
  v1::StepInfo again;
  ASSERT_OK(FromGrpcStatus(trainers_->BeginStep(Ctx().get(), begin, &again)));
  EXPECT_TRUE(again.layout_omitted());
  EXPECT_EQ(again.participants_size(), 0);
  // Nothing changed: the second report resolves the step, and both long
  // polls are answered with the resolution.
  auto report = [&](int task, v1::StepPlan* plan) {
    v1::ReportStepRequest req;
    req.set_step(1);
    req.set_epoch(info.epoch());
    req.set_job("tpu_worker");
    req.set_task(task);
    req.set_incarnation(100 + task);
    return FromGrpcStatus(workers_->ReportStep(Ctx().get(), req, plan));
  };
  v1::StepPlan first, second;
  absl::Status first_status;
  std::thread waiting([&] { first_status = report(0, &first); });
  ASSERT_OK(report(1, &second));
  waiting.join();
  ASSERT_OK(first_status);
  EXPECT_EQ(first.resolution().state(), v1::STEP_STATE_COMMITTED);
  EXPECT_EQ(second.resolution().state(), v1::STEP_STATE_COMMITTED);
  v1::StepsStatus steps;
  ASSERT_OK(FromGrpcStatus(trainers_->GetSteps(Ctx().get(), {}, &steps)));
  EXPECT_EQ(steps.last_committed_step(), 1);
  // A report from a stranger maps to PERMISSION_DENIED or a closed step.
  v1::ReportStepRequest stranger;
  stranger.set_step(1);
  stranger.set_epoch(info.epoch());
  stranger.set_job("other");
  v1::StepPlan plan;
  EXPECT_THAT(FromGrpcStatus(workers_->ReportStep(Ctx().get(), stranger, &plan)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "closed"));
}

v1::StepStreamRequest StreamReport(uint64_t tag, uint64_t epoch, const std::string& job, int task) {
  v1::StepStreamRequest m;
  m.set_tag(tag);
  v1::ReportStepRequest* r = m.mutable_report();
  r->set_step(1);
  r->set_epoch(epoch);
  r->set_job(job);
  r->set_task(task);
  r->set_incarnation(100 + task);
  return m;
}

v1::StepStreamRequest StreamGetStep(uint64_t tag, uint64_t epoch) {
  v1::StepStreamRequest m;
  m.set_tag(tag);
  m.mutable_get_step()->set_epoch(epoch);
  return m;
}

TEST_F(ServicesTest, Workers_StepStream_AnswersByTagWhenReady_ARefusalIsItsAnswer_StreamStaysOpen) {
  v1::StepInfo info;
  ASSERT_NO_FATAL_FAILURE(BeginStepOneOnW(&info));

  auto ctx0 = Ctx();
  auto worker0 = workers_->StepStream(ctx0.get());
  v1::StepStreamResponse got;
  // GetStep: answered at once, with the step.
  ASSERT_TRUE(worker0->Write(StreamGetStep(1, info.epoch())));
  ASSERT_TRUE(worker0->Read(&got));
  EXPECT_EQ(got.tag(), 1u);
  EXPECT_EQ(got.code(), 0);
  EXPECT_EQ(got.step().step(), 1);
  EXPECT_EQ(got.step().participants_size(), 2);
  // Worker 0's report waits for the barrier; a stranger's report sent after
  // it on the same stream is refused at once: its answer comes first.
  ASSERT_TRUE(worker0->Write(StreamReport(2, info.epoch(), "tpu_worker", 0)));
  ASSERT_TRUE(worker0->Write(StreamReport(3, info.epoch(), "other", 0)));
  ASSERT_TRUE(worker0->Read(&got));
  EXPECT_EQ(got.tag(), 3u);
  EXPECT_EQ(got.code(), grpc::StatusCode::PERMISSION_DENIED) << got.message();
  EXPECT_FALSE(got.has_plan());
  // A message with no call is refused the same way.
  v1::StepStreamRequest empty;
  empty.set_tag(4);
  ASSERT_TRUE(worker0->Write(empty));
  ASSERT_TRUE(worker0->Read(&got));
  EXPECT_EQ(got.tag(), 4u);
  EXPECT_EQ(got.code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Worker 1 reports on its own stream: the barrier resolves, both answer.
  auto ctx1 = Ctx();
  auto worker1 = workers_->StepStream(ctx1.get());
  ASSERT_TRUE(worker1->Write(StreamReport(1, info.epoch(), "tpu_worker", 1)));
  ASSERT_TRUE(worker1->Read(&got));
  EXPECT_EQ(got.tag(), 1u);
  EXPECT_EQ(got.plan().resolution().state(), v1::STEP_STATE_COMMITTED);
  ASSERT_TRUE(worker0->Read(&got));
  EXPECT_EQ(got.tag(), 2u);
  EXPECT_EQ(got.code(), 0) << got.message();
  EXPECT_EQ(got.plan().resolution().state(), v1::STEP_STATE_COMMITTED);
  // After the refusals, the stream still carries calls.
  ASSERT_TRUE(worker0->Write(StreamGetStep(5, info.epoch())));
  ASSERT_TRUE(worker0->Read(&got));
  EXPECT_EQ(got.tag(), 5u);
  EXPECT_EQ(got.step().state(), v1::STEP_STATE_COMMITTED);
  // An unknown epoch: NOT_FOUND, as the unary GetStep.
  ASSERT_TRUE(worker0->Write(StreamGetStep(6, info.epoch() + 100)));
  ASSERT_TRUE(worker0->Read(&got));
  EXPECT_EQ(got.code(), grpc::StatusCode::NOT_FOUND);
  for (auto* stream : {worker0.get(), worker1.get()}) {
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_FALSE(stream->Read(&got));
    EXPECT_OK(FromGrpcStatus(stream->Finish()));
  }
  v1::StepsStatus steps;
  ASSERT_OK(FromGrpcStatus(trainers_->GetSteps(Ctx().get(), {}, &steps)));
  EXPECT_EQ(steps.last_committed_step(), 1);
}

TEST_F(ServicesTest, Workers_StepStream_EndedWithAReportWaiting_ClosesWithoutItsAnswer) {
  v1::StepInfo info;
  ASSERT_NO_FATAL_FAILURE(BeginStepOneOnW(&info));
  {
    // The worker cancels its stream while its report waits for the barrier.
    grpc::ClientContext ctx;
    auto stream = workers_->StepStream(&ctx);
    ASSERT_TRUE(stream->Write(StreamReport(1, info.epoch(), "tpu_worker", 0)));
    v1::StepStreamResponse got;
    ASSERT_TRUE(stream->Write(StreamGetStep(2, info.epoch())));  // served after the report
    ASSERT_TRUE(stream->Read(&got));
    ASSERT_EQ(got.tag(), 2u);
    ctx.TryCancel();
    EXPECT_FALSE(stream->Read(&got));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The barrier resolves later; the answer that has no stream left is
  // dropped (the coordinator neither blocks nor crashes), and the step
  // commits for the other worker.
  v1::ReportStepRequest req = StreamReport(0, info.epoch(), "tpu_worker", 1).report();
  v1::StepPlan plan;
  ASSERT_OK(FromGrpcStatus(workers_->ReportStep(Ctx().get(), req, &plan)));
  EXPECT_EQ(plan.resolution().state(), v1::STEP_STATE_COMMITTED);
}

}  // namespace
}  // namespace repvar::server

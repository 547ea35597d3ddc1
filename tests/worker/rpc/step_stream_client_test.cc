// SPDX-License-Identifier: Apache-2.0
// The worker's step stream against the coordinator's real StepStream (in
// this process, fake workers and clock): many calls share one stream, a
// refusal is that call's status, a call not answered in time drops the
// stream and the next call opens another, a stream that ends fails the
// calls waiting on it, a coordinator that is not there yet (restarting) is
// waited for, and a coordinator that stops reading does not hold a call
// past its deadline.
#include "worker/rpc/step_stream_client.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/in_process_coordinator.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/variables.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::StatusIs;

v1::StepStreamRequest GetStep(uint64_t epoch) {
  v1::StepStreamRequest m;
  m.mutable_get_step()->set_epoch(epoch);
  return m;
}

class StepStreamClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_->RegisterWorkers(2, 1);
    ASSERT_NE(repvar::testing::CreateZeroed(coordinator_->core(), "w", Aggregation::kNone,
                                            DType::kFloat32, /*replicas=*/2),
              0u);
  }
  uint64_t BeginStep() {
    auto s = coordinator_->core().BeginStep(1, absl::Seconds(60));
    EXPECT_OK(s);
    return s.ok() ? s->info->epoch : 0;
  }
  static v1::StepStreamRequest Report(uint64_t epoch, int task) {
    v1::StepStreamRequest m;
    m.mutable_report()->set_step(1);
    m.mutable_report()->set_epoch(epoch);
    m.mutable_report()->set_job("tpu_worker");
    m.mutable_report()->set_task(task);
    m.mutable_report()->set_incarnation(100 + task);
    return m;
  }

  std::unique_ptr<repvar::testing::InProcessCoordinator> coordinator_ =
      std::make_unique<repvar::testing::InProcessCoordinator>();
  std::unique_ptr<v1::CoordinatorWorkers::Stub> stub_ =
      v1::CoordinatorWorkers::NewStub(coordinator_->channel());
};

TEST_F(StepStreamClientTest, ManyCallsOneStream_ARefusalIsThatCallsStatus) {
  StepStreamClient client(stub_.get());
  EXPECT_THAT(client.Call(GetStep(77), absl::Seconds(10)), StatusIs(absl::StatusCode::kNotFound));
  const uint64_t epoch = BeginStep();
  auto got = client.Call(GetStep(epoch), absl::Seconds(10));
  ASSERT_OK(got);
  EXPECT_EQ(got->step().epoch(), epoch);
  EXPECT_EQ(got->step().participants_size(), 2);
  // Two reports from two threads on the one stream: each gets its own
  // answer, the plan (here: the resolution) once both are in.
  std::optional<absl::StatusOr<v1::StepStreamResponse>> first;
  std::thread waiting([&] { first = client.Call(Report(epoch, 0), absl::Seconds(10)); });
  auto second = client.Call(Report(epoch, 1), absl::Seconds(10));
  waiting.join();
  ASSERT_OK(second);
  ASSERT_OK(*first);
  EXPECT_EQ((*first)->plan().resolution().state(), v1::STEP_STATE_COMMITTED);
  EXPECT_EQ(second->plan().resolution().state(), v1::STEP_STATE_COMMITTED);
  EXPECT_EQ(client.streams_opened(), 1);
}

TEST_F(StepStreamClientTest, NotAnsweredInTime_DeadlineExceeded_TheNextCallOpensANewStream) {
  StepStreamClient client(stub_.get());
  const uint64_t epoch = BeginStep();
  // Worker 1 never reports: worker 0's answer does not come in time.
  EXPECT_THAT(client.Call(Report(epoch, 0), absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(client.streams_opened(), 1);
  ASSERT_OK(client.Call(GetStep(epoch), absl::Seconds(10)));
  EXPECT_EQ(client.streams_opened(), 2);
  ASSERT_OK(client.Call(GetStep(epoch), absl::Seconds(10)));
  EXPECT_EQ(client.streams_opened(), 2);
}

// CallAsync returns before the answer; each callback runs once, with the
// answer, or at the call's deadline with DEADLINE_EXCEEDED (the client's
// deadline thread), and no caller waits for either.
TEST_F(StepStreamClientTest, CallAsync_ReturnsAtOnce_TheAnswerOrTheDeadlineCallsBackOnce) {
  StepStreamClient client(stub_.get());
  const uint64_t epoch = BeginStep();
  absl::Mutex mu;
  std::optional<StepStreamClient::Answer> report, step;
  int callbacks = 0;
  // Worker 1 never reports: worker 0's report is not answered in time.
  client.CallAsync(Report(epoch, 0), absl::Milliseconds(300), [&](StepStreamClient::Answer a) {
    absl::MutexLock lock(&mu);
    report = std::move(a);
    ++callbacks;
  });
  client.CallAsync(GetStep(epoch), absl::Seconds(10), [&](StepStreamClient::Answer a) {
    absl::MutexLock lock(&mu);
    step = std::move(a);
    ++callbacks;
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(report.has_value());  // it cannot be answered before the deadline
    mu.Await(absl::Condition(
        +[](int* n) { return *n == 2; }, &callbacks));
  }
  ASSERT_OK(*step);
  EXPECT_EQ((*step)->step().epoch(), epoch);
  EXPECT_THAT(*report, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(callbacks, 2);
}

TEST_F(StepStreamClientTest, TheCoordinatorStops_ACallWaitingFailsUnavailable) {
  StepStreamClient client(stub_.get());
  const uint64_t epoch = BeginStep();
  std::optional<absl::StatusOr<v1::StepStreamResponse>> waiting_report;
  std::thread waiting([&] { waiting_report = client.Call(Report(epoch, 0), absl::Seconds(30)); });
  // Once the report is in (the barrier has it), stop the coordinator.
  for (int i = 0; i < 1000; ++i) {
    auto status = coordinator_->core().GetSteps();
    bool reported = false;
    for (const auto& p : status.progress) reported |= p.task.task == 0 && p.reported;
    if (reported) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  coordinator_.reset();
  waiting.join();
  EXPECT_THAT(*waiting_report, StatusIs(absl::StatusCode::kUnavailable));
}

using StepStreamReactor = grpc::ServerBidiReactor<v1::StepStreamRequest, v1::StepStreamResponse>;

// A coordinator whose StepStream is a new `Reactor` per stream.
template <typename Reactor>
class StepStreamOnly final : public v1::CoordinatorWorkers::CallbackService {
 public:
  StepStreamReactor* StepStream(grpc::CallbackServerContext*) override { return new Reactor(); }
};

// Answers every call at once (code 0, the call's tag), whatever the call.
class AnswersAll final : public StepStreamReactor {
 public:
  AnswersAll() { StartRead(&in_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    out_.set_tag(in_.tag());
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone() override { delete this; }

 private:
  v1::StepStreamRequest in_;
  v1::StepStreamResponse out_;
};

// F6 at the worker's end: a coordinator restarting is not there for a
// moment, and the step calls made then (a worker's report of the step
// begun just before) wait for it instead of failing at once, when the
// channel is between reconnection attempts; the CI failure of
// RestartTest.F6_* was such a report, lost, and the barrier timing out.
TEST(StepStreamClientRestartTest, TheCoordinatorIsNotThereYet_TheCallWaitsForIt) {
  int port = 0;
  {  // a free port: nothing listens there until the "restarted" server
    StepStreamOnly<AnswersAll> probe;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&probe);
    builder.BuildAndStart()->Shutdown();
  }
  ASSERT_NE(port, 0);
  auto stub = v1::CoordinatorWorkers::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  StepStreamOnly<AnswersAll> service;
  std::unique_ptr<grpc::Server> server;
  {
    StepStreamClient client(stub.get());
    // Nobody there: the call waits until its deadline (it does not fail at
    // once), and the channel is left between attempts to connect.
    EXPECT_THAT(client.Call(GetStep(1), absl::Milliseconds(300)),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    // The coordinator is back: the next call is answered, once the channel
    // connects again.
    EXPECT_OK(client.Call(GetStep(2), absl::Seconds(30)));
  }  // the client's stream ends before the server shuts down
  server->Shutdown();
}

// Never reads: the worker's writes stop once HTTP/2's flow-control windows
// are full.
class NeverReads final : public StepStreamReactor {
 public:
  void OnCancel() override { Finish(grpc::Status::CANCELLED); }
  void OnDone() override { delete this; }
};

TEST(StepStreamClientStalledTest, ACoordinatorThatStopsReading_TheCallEndsAtItsDeadline) {
  StepStreamOnly<NeverReads> service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::CoordinatorWorkers::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  // A report of about 64 MB, far more than HTTP/2's flow-control windows
  // and the sockets' buffers take in while the coordinator does not read:
  // its write cannot complete (with 1,000,000 entries the synchronous
  // client hung here).
  v1::StepStreamRequest big;
  v1::ReportStepRequest* r = big.mutable_report();
  r->set_step(1);
  r->set_epoch(1);
  for (int i = 0; i < 4'000'000; ++i) {
    v1::ReplicaReport* rr = r->add_replicas();
    rr->set_variable_id(static_cast<uint64_t>(i) + 1);
    rr->set_checksum(0x0123456789abcdefULL + static_cast<uint64_t>(i));
  }
  const absl::Time start = absl::Now();
  {
    StepStreamClient client(stub.get());
    EXPECT_THAT(client.Call(big, absl::Milliseconds(500)),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  }  // the client's destructor waits for gRPC to be done with the stream
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  server->Shutdown();
}

}  // namespace
}  // namespace repvar::worker

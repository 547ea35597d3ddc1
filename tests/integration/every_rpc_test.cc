// SPDX-License-Identifier: Apache-2.0
// X2, every RPC of every service: a table with, for each method the protos
// declare, bad inputs (as text-format requests, or bytes that do not parse)
// and the status each must get; after each, the cluster holds what it held.
// A method without a row fails the test: a new RPC needs its bad inputs
// written down here.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/text_format.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::Scaled;

constexpr const char* kServices[] = {"repvar.v1.CoordinatorWorkers",
                                     "repvar.v1.CoordinatorTrainers", "repvar.v1.CoordinatorAdmin",
                                     "repvar.v1.WorkerReplicas", "repvar.v1.WorkerSteps"};

// Bytes no message parses from: a field 1 of wire type 7 (there is none).
const std::string kGarbage("\x0f\xff\xff", 3);

enum class At { kCoordinator, kWorker };

// One bad input to one method: the request messages (text format of the
// method's input type, "$ID" standing for w's variable id; or kGarbage as
// it is), the code the call ends
// with, and a piece of its message. A streaming answer that refuses inside
// the stream (StepStream) is checked by `answered` instead.
struct Row {
  std::string method;  // "Service/Method"
  std::string what;
  std::vector<std::string> requests;
  grpc::StatusCode code;
  std::string message;
  std::function<void(const std::vector<std::string>& answers)> answered = nullptr;
};

At Where(const std::string& method) {
  return method.starts_with("Worker") ? At::kWorker : At::kCoordinator;
}

// The wire bytes of `text`, a request of `method`'s input type.
std::string Encode(const std::string& method, const std::string& text) {
  if (text == kGarbage) return text;
  const std::string full = "repvar.v1." + absl::StrReplaceAll(method, {{"/", "."}});
  const auto* m = google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full);
  EXPECT_NE(m, nullptr) << full;
  if (m == nullptr) return "";
  std::unique_ptr<google::protobuf::Message> msg(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(m->input_type())->New());
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, msg.get()))
      << method << ": " << text;
  return msg->SerializeAsString();
}

class EveryRpcTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new testing::TestCluster();
    ASSERT_OK(cluster_->Start());
    auto c = Client::Connect({.coordinator_address = cluster_->address()});
    ASSERT_OK(c);
    client_ = c->release();
    ASSERT_OK(client_->WaitForTopology(Scaled(absl::Seconds(20))));
    ASSERT_OK(client_->CreateVariable(
        {.name = "w", .dtype = DType::kFloat32, .shape = {4}, .replica_count = 6}));
    std::vector<float> v = {1, 2, 3, 4};
    ASSERT_OK(client_->Assign("w", std::span<const float>(v)));
  }
  static void TearDownTestSuite() {
    delete client_;
    delete cluster_;
  }

  // Everything a refused call could have touched is as it was.
  static void ExpectNothingChanged(const std::string& after) {
    auto r = client_->Read("w");
    ASSERT_OK(r) << after;
    EXPECT_EQ(r->version, 1) << after;
    EXPECT_EQ(std::vector<float>(r->as<float>().begin(), r->as<float>().end()),
              (std::vector<float>{1, 2, 3, 4}))
        << after;
    auto vars = client_->ListVariables();
    ASSERT_OK(vars) << after;
    EXPECT_EQ(vars->size(), 1u) << after;
    auto topology = client_->GetTopology();
    ASSERT_OK(topology) << after;
    EXPECT_EQ(topology->tasks.size(), 4u) << after;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StepsStatus steps;
    ASSERT_TRUE(v1::CoordinatorTrainers::NewStub(
                    grpc::CreateChannel(cluster_->address(), grpc::InsecureChannelCredentials()))
                    ->GetSteps(&ctx, {}, &steps)
                    .ok())
        << after;
    EXPECT_FALSE(steps.has_open()) << after;
    EXPECT_EQ(steps.last_committed_step(), 0) << after;
  }

  static testing::TestCluster* cluster_;
  static Client* client_;
};

testing::TestCluster* EveryRpcTest::cluster_ = nullptr;
Client* EveryRpcTest::client_ = nullptr;

// A StepStream answer refusing its call with `code`, naming `message`.
std::function<void(const std::vector<std::string>&)> StreamRefuses(grpc::StatusCode code,
                                                                   std::string message) {
  return [code, message](const std::vector<std::string>& answers) {
    ASSERT_EQ(answers.size(), 1u);
    v1::StepStreamResponse r;
    ASSERT_TRUE(r.ParseFromString(answers[0]));
    EXPECT_EQ(r.tag(), 7u);
    EXPECT_EQ(r.code(), static_cast<int>(code)) << r.message();
    EXPECT_NE(r.message().find(message), std::string::npos) << r.message();
  };
}

std::vector<Row> Rows() {
  using C = grpc::StatusCode;
  const std::string g = kGarbage;
  const std::string parse = "does not parse";
  return {
      // ---- CoordinatorWorkers ----
      {"CoordinatorWorkers/RegisterWorker",
       "a malformed device name",
       {R"(job: "tpu_worker" task: 9 address: "h9:1" incarnation: 1
           devices: "/job:tpu_worker/replica:0/task:9/device:tpu:0")"},
       C::INVALID_ARGUMENT,
       "devices[0]"},
      {"CoordinatorWorkers/RegisterWorker",
       "incarnation 0",
       {R"(job: "tpu_worker" task: 9 address: "h9:1"
           devices: "/job:tpu_worker/replica:0/task:9/device:TPU:0")"},
       C::INVALID_ARGUMENT,
       "incarnation"},
      {"CoordinatorWorkers/RegisterWorker", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorWorkers/Heartbeat",
       "an unknown task",
       {R"(job: "tpu_worker" task: 99 incarnation: 1)"},
       C::NOT_FOUND,
       "tpu_worker:99"},
      {"CoordinatorWorkers/Heartbeat", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorWorkers/GetStep", "an unknown epoch", {"epoch: 12345"}, C::NOT_FOUND, "12345"},
      {"CoordinatorWorkers/GetStep", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorWorkers/ReportStep",
       "a step that is not open",
       {R"(step: 1 epoch: 1 job: "tpu_worker" task: 0 incarnation: 1)"},
       C::FAILED_PRECONDITION,
       "closed"},
      {"CoordinatorWorkers/ReportStep", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorWorkers/FinishStep",
       "a step that is not open",
       {R"(step: 1 epoch: 1 job: "tpu_worker" task: 0 incarnation: 1)"},
       C::FAILED_PRECONDITION,
       "closed"},
      {"CoordinatorWorkers/FinishStep", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorWorkers/WaitStep",
       "an unknown epoch",
       {"epoch: 12345 timeout_ms: 10"},
       C::NOT_FOUND,
       "12345"},
      {"CoordinatorWorkers/WaitStep", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorWorkers/StepStream",
       "an unknown epoch, answered in the stream",
       {"tag: 7 get_step { epoch: 12345 }"},
       C::OK,
       "",
       StreamRefuses(C::NOT_FOUND, "12345")},
      // gRPC's callback API takes a stream message that does not parse for
      // the stream's end: nothing is answered and nothing changes.
      {"CoordinatorWorkers/StepStream",
       "unparseable",
       {g},
       C::OK,
       "",
       [](const std::vector<std::string>& answers) { EXPECT_TRUE(answers.empty()); }},
      {"CoordinatorWorkers/StoreSet",
       "an empty key",
       {R"(key: "" value: "x")"},
       C::INVALID_ARGUMENT,
       "key"},
      {"CoordinatorWorkers/StoreSet", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorWorkers/StoreGet",
       "an empty key",
       {R"(key: "" timeout_ms: 10000)"},
       C::INVALID_ARGUMENT,
       "key"},
      {"CoordinatorWorkers/StoreGet", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      // ---- CoordinatorTrainers ----
      {"CoordinatorTrainers/GetTopology",
       "unparseable (it takes no field)",
       {g},
       C::INVALID_ARGUMENT,
       parse},
      {"CoordinatorTrainers/WatchTopology", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/WaitForTopology",
       "a negative timeout",
       {"timeout_ms: -1"},
       C::INVALID_ARGUMENT,
       "timeout"},
      {"CoordinatorTrainers/WaitForTopology", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/CreateVariables",
       "no dtype",
       {R"(request_id: "r1" items { spec { name: "x" tensor { dims: 2 } replica_count: 1 } })"},
       C::INVALID_ARGUMENT,
       "dtype"},
      {"CoordinatorTrainers/CreateVariables", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/GetVariable",
       "an unknown name",
       {R"(name: "nope")"},
       C::NOT_FOUND,
       "nope"},
      {"CoordinatorTrainers/GetVariable", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/ListVariables",
       "an unknown detail",
       {"detail: 7"},
       C::INVALID_ARGUMENT,
       "variable detail 7"},
      {"CoordinatorTrainers/ListVariables", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/InitializeVariables",
       "an unknown name",
       {R"(request_id: "r2" items { name: "nope" })"},
       C::NOT_FOUND,
       "nope"},
      {"CoordinatorTrainers/InitializeVariables", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/IsInitialized",
       "an unknown name",
       {R"(names: "nope")"},
       C::NOT_FOUND,
       "nope"},
      {"CoordinatorTrainers/IsInitialized", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/AssignVariable",
       "a chunk before the header",
       {R"(chunk { offset: 0 data: "abcd" })"},
       C::INVALID_ARGUMENT,
       "AssignHeader"},
      {"CoordinatorTrainers/AssignVariable", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"CoordinatorTrainers/AssignVariables",
       "a shape of another size",
       {R"(request_id: "r3" items { name: "w" value { header { spec { dtype: DTYPE_FLOAT32
           dims: 2 } byte_size: 8 } data: "abcdefgh" } })"},
       C::FAILED_PRECONDITION,
       "w"},
      {"CoordinatorTrainers/AssignVariables", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/ReadVariable",
       "an unknown name",
       {R"(name: "nope")"},
       C::NOT_FOUND,
       "nope"},
      {"CoordinatorTrainers/ReadVariable",
       "a negative chunk size",
       {R"(name: "w" chunk_bytes: -1)"},
       C::INVALID_ARGUMENT,
       "chunk_bytes"},
      {"CoordinatorTrainers/ReadVariable", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"CoordinatorTrainers/ReadVariables",
       "an unknown name",
       {R"(names: "w" names: "nope")"},
       C::NOT_FOUND,
       "nope"},
      {"CoordinatorTrainers/ReadVariables", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"CoordinatorTrainers/BeginStep",
       "step 0",
       {"step: 0 barrier_timeout_ms: 1000"},
       C::INVALID_ARGUMENT,
       "step"},
      {"CoordinatorTrainers/BeginStep",
       "no barrier timeout",
       {"step: 1"},
       C::INVALID_ARGUMENT,
       "timeout"},
      {"CoordinatorTrainers/BeginStep", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/AbortStep",
       "an unknown epoch",
       {R"(epoch: 12345 reason: "x")"},
       C::NOT_FOUND,
       "12345"},
      {"CoordinatorTrainers/AbortStep", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/GetSteps",
       "unparseable (it takes no field)",
       {g},
       C::INVALID_ARGUMENT,
       parse},
      {"CoordinatorTrainers/WatchSteps", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorTrainers/PublishScalars",
       "a name out of the alphabet",
       {R"(points { name: "a b" step: 1 value: 1 })"},
       C::INVALID_ARGUMENT,
       "a b"},
      {"CoordinatorTrainers/PublishScalars",
       "a negative step",
       {R"(points { name: "loss" step: -1 value: 1 })"},
       C::INVALID_ARGUMENT,
       "step"},
      {"CoordinatorTrainers/PublishScalars", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      // ---- CoordinatorAdmin ----
      {"CoordinatorAdmin/DeleteVariable",
       "an unknown name",
       {R"(request_id: "r4" name: "nope")"},
       C::NOT_FOUND,
       "nope"},
      {"CoordinatorAdmin/DeleteVariable", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorAdmin/GetClusterStatus",
       "a negative max_variables",
       {"max_variables: -1"},
       C::INVALID_ARGUMENT,
       "max_variables"},
      {"CoordinatorAdmin/GetClusterStatus", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorAdmin/SaveCheckpoint",
       "a negative chunk size",
       {"chunk_bytes: -1"},
       C::INVALID_ARGUMENT,
       "chunk_bytes"},
      {"CoordinatorAdmin/SaveCheckpoint", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"CoordinatorAdmin/Drain",
       "unparseable (its one field is a bool)",
       {g},
       C::INVALID_ARGUMENT,
       parse},
      // ---- WorkerReplicas (the coordinator's calls) ----
      {"WorkerReplicas/WriteReplicas",
       "an earlier incarnation",
       {R"(header { incarnation: 1 variable_id: $ID name: "w" version: 9 replicas: 0
           tensor { spec { dtype: DTYPE_FLOAT32 dims: 4 } byte_size: 16 }
           inline_data: "0123456789abcdef" fence: 999999999 })"},
       C::ABORTED,
       "incarnation"},
      {"WorkerReplicas/WriteReplicas", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"WorkerReplicas/WriteSmallReplicas",
       "an earlier incarnation",
       {R"(incarnation: 1 variable_ids: $ID names: "w" versions: 9 fences: 999999999
           replica_counts: 1 replicas: 0 specs { dtype: DTYPE_FLOAT32 dims: 4 } spec_index: 0
           checksums: 0 data: "0123456789abcdef" value_index: 0)"},
       C::ABORTED,
       "incarnation"},
      {"WorkerReplicas/WriteSmallReplicas", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"WorkerReplicas/ReadReplica",
       "a replica it does not hold",
       {"variable_id: 999999 replica: 0"},
       C::NOT_FOUND,
       "999999"},
      {"WorkerReplicas/ReadReplica",
       "a negative chunk size",
       {"variable_id: $ID replica: 0 chunk_bytes: -1"},
       C::INVALID_ARGUMENT,
       "chunk_bytes"},
      {"WorkerReplicas/ReadReplica", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"WorkerReplicas/DropVariable",
       "an earlier incarnation",
       {"incarnation: 1 variable_id: $ID"},
       C::ABORTED,
       "incarnation"},
      {"WorkerReplicas/DropVariable", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"WorkerReplicas/GetReplicaStatus",
       "a fence floor for an earlier incarnation",
       {"incarnation: 1 fence_floor: 999999999"},
       C::ABORTED,
       "incarnation"},
      {"WorkerReplicas/GetReplicaStatus", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      // ---- WorkerSteps (a trainer's calls inside a step) ----
      // (A step read needs no step the worker knows: outside one it reads
      // the committed value, as a read outside a step does.)
      {"WorkerSteps/StepRead",
       "a replica it does not hold",
       {"step: 1 epoch: 1 variable_id: 999999 replica: 0"},
       C::NOT_FOUND,
       "999999"},
      {"WorkerSteps/StepRead",
       "a negative chunk size",
       {"step: 1 epoch: 1 variable_id: $ID replica: 0 chunk_bytes: -1"},
       C::INVALID_ARGUMENT,
       "chunk_bytes"},
      {"WorkerSteps/StepRead", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"WorkerSteps/StepReadSmall",
       "a replica it does not hold",
       {"reads { step: 1 epoch: 1 variable_id: 999999 replica: 0 }"},
       C::NOT_FOUND,
       "999999"},
      {"WorkerSteps/StepReadSmall", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"WorkerSteps/StepWrite",
       "a chunk before the header",
       {R"(chunk { offset: 0 data: "abcd" })"},
       C::INVALID_ARGUMENT,
       "header"},
      {"WorkerSteps/StepWrite", "unparseable", {g}, C::INVALID_ARGUMENT, "parse"},
      {"WorkerSteps/StepWriteSmall",
       "an unknown step",
       {R"(writes { step: 1 epoch: 1 variable_id: $ID replica: 0
           tensor { spec { dtype: DTYPE_FLOAT32 dims: 4 } byte_size: 16 }
           inline_data: "0123456789abcdef" })"},
       C::NOT_FOUND,
       "epoch 1"},
      {"WorkerSteps/StepWriteSmall", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"WorkerSteps/CommitStep",
       "an unknown step",
       {"step: 1 epoch: 1 timeout_ms: 100"},
       C::NOT_FOUND,
       "epoch 1"},
      {"WorkerSteps/CommitStep", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"WorkerSteps/DiscardStep",
       "unparseable (an unknown epoch is a no-op)",
       {g},
       C::INVALID_ARGUMENT,
       parse},
      {"WorkerSteps/StepMap",
       "an unknown step",
       {"step: 1 epoch: 1 variable_id: $ID replica: 0"},
       C::NOT_FOUND,
       "epoch 1"},
      {"WorkerSteps/StepMap", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"WorkerSteps/StepUnmap", "an unknown lease", {"lease: 424242"}, C::NOT_FOUND, "424242"},
      {"WorkerSteps/StepUnmap", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
      {"WorkerSteps/MapLocalReads", "unparseable", {g}, C::INVALID_ARGUMENT, parse},
  };
}

TEST_F(EveryRpcTest, X2_EveryMethodOfEveryService_HasBadInputRows_EachRefusedNothingChanged) {
  const std::vector<Row> rows = Rows();
  std::set<std::string> covered;
  for (const Row& r : rows) covered.insert(r.method);
  std::vector<std::string> missing;
  for (const char* service : kServices) {
    const auto* s = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    ASSERT_NE(s, nullptr) << service;
    for (int i = 0; i < s->method_count(); ++i) {
      const std::string m = absl::StrCat(s->name(), "/", s->method(i)->name());
      if (!covered.contains(m)) missing.push_back(m);
    }
  }
  EXPECT_TRUE(missing.empty()) << "methods with no bad-input row: "
                               << ::testing::PrintToString(missing);

  const std::string id = absl::StrCat(client_->GetVariable("w")->id);
  for (const Row& r : rows) {
    const std::string name = absl::StrCat(r.method, " (", r.what, ")");
    std::vector<std::string> wire;
    for (std::string text : r.requests) {
      wire.push_back(Encode(r.method, absl::StrReplaceAll(text, {{"$ID", id}})));
    }
    const std::string address =
        Where(r.method) == At::kWorker ? cluster_->worker_address(0) : cluster_->address();
    auto [status, answers] = testing::RawCall(address, "/repvar.v1." + r.method, wire);
    EXPECT_EQ(status.error_code(), r.code) << name << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(r.message), std::string::npos)
        << name << ": \"" << status.error_message() << "\" does not name \"" << r.message << "\"";
    if (r.answered) {
      r.answered(answers);
    } else if (r.code != grpc::StatusCode::OK) {
      EXPECT_TRUE(answers.empty()) << name << ": a refused call answered";
    }
    ExpectNothingChanged(name);
  }
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// Contract X1 against real daemons serving TLS with tokens, certificates made
// by deploy/make-certs.sh (openssl) at test time. Every refused case sits
// next to the same call with valid credentials, and checks that nothing
// changed.
#include "common/rpc/security.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/random.h"
#include "repvar/client.h"
#include "repvar/step.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::Scaled;
using ::repvar::testing::StatusIs;

testing::ClusterOptions SecureCluster() {
  testing::ClusterOptions o;
  o.tpu_workers = 2;
  o.tpu_per_worker = 1;
  o.cpu_host = false;
  o.tls = true;
  return o;
}

class SecurityTest : public testing::StartedCluster {
 protected:
  SecurityTest() : StartedCluster(SecureCluster()) {}

  // A client trusting `ca` and sending the token in `token` ("" : none).
  std::unique_ptr<Client> ClientWith(const std::string& token, const std::string& ca = "ca.pem") {
    ClientOptions o = ClientOptionsFor(token);
    o.tls_ca_file = cluster_.cert(ca);
    o.max_attempts = 1;
    o.deadline = Scaled(absl::Seconds(10));
    auto c = Client::Connect(o);
    EXPECT_OK(c);
    return c.ok() ? *std::move(c) : nullptr;
  }

  // A channel to `address` presenting the certificate `cert` ("" : none)
  // and the token in `token` ("" : none), trusting the cluster's CA.
  std::shared_ptr<grpc::Channel> ChannelAs(const std::string& address, const std::string& cert,
                                           const std::string& token) {
    auto security = LoadChannelSecurity(cluster_.cert("ca.pem"),
                                        cert.empty() ? "" : cluster_.cert(cert + ".pem"),
                                        cert.empty() ? "" : cluster_.cert(cert + ".key"),
                                        token.empty() ? "" : cluster_.cert(token));
    EXPECT_OK(security);
    return OpenChannel(address, security.ok() ? *security : ChannelSecurity{});
  }
  std::unique_ptr<v1::CoordinatorWorkers::Stub> WorkersStubAs(const std::string& cert,
                                                              const std::string& token) {
    return v1::CoordinatorWorkers::NewStub(ChannelAs(cluster_.address(), cert, token));
  }

  // tpu_worker:`host`'s incarnation, asked as the coordinator.
  uint64_t Incarnation(int host) {
    auto stub = v1::WorkerReplicas::NewStub(
        ChannelAs(cluster_.worker_address(host), "coordinator", "worker.token"));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(10))));
    v1::GetReplicaStatusResponse resp;
    EXPECT_TRUE(stub->GetReplicaStatus(&ctx, {}, &resp).ok());
    return resp.incarnation();
  }

  static grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(10))));
    return ctx;
  }

  absl::Status CreateW(Client& c, const std::string& name) {
    VariableSpec s{.name = name, .dtype = DType::kFloat32, .shape = {4}};
    s.replica_count = 2;
    s.initializer = InitializerSpec::Zeros();
    return c.CreateVariable(s).status();
  }

  // The names of the variables, as the admin sees them.
  std::vector<std::string> Names() {
    std::vector<std::string> out;
    auto list = client_->ListVariables();
    EXPECT_OK(list);
    for (const VariableInfo& v : list.ok() ? *list : std::vector<VariableInfo>{}) {
      out.push_back(v.spec.name);
    }
    return out;
  }
};

TEST_F(SecurityTest, X1_TrainerWithToken_CreatesWritesReadsAndSteps) {
  auto trainer = ClientWith("trainer.token");
  ASSERT_NE(trainer, nullptr);
  ASSERT_OK(CreateW(*trainer, "w"));
  ASSERT_OK(trainer->Initialize({"w"}));
  const std::array<float, 4> v = {1, 2, 3, 4};
  ASSERT_OK(trainer->Assign<float>("w", std::span<const float>(v)));
  auto back = trainer->Read("w");
  ASSERT_OK(back);
  EXPECT_EQ(std::memcmp(back->bytes.data(), v.data(), sizeof(v)), 0);
  // A step: trainers call the workers' WorkerSteps with their token, the
  // workers report to the coordinator with their certificates.
  std::vector<absl::Status> out(2);
  std::vector<std::thread> threads;
  for (int h = 0; h < 2; ++h) {
    threads.emplace_back([&, h] {
      auto scope = StepScope::Begin(*trainer, 1,
                                    StepOptions{.worker = absl::StrCat("tpu_worker:", h),
                                                .barrier_timeout = Scaled(absl::Seconds(20))});
      if (!scope.ok()) {
        out[h] = scope.status();
        return;
      }
      const std::array<float, 4> x = {5, 6, 7, 8};
      auto local = (*scope)->LocalReplicas("w");
      for (int32_t r : local.ok() ? *local : std::vector<int32_t>{}) {
        if (absl::Status s = (*scope)->Write<float>("w", r, std::span<const float>(x)); !s.ok()) {
          out[h] = s;
          return;
        }
      }
      out[h] = (*scope)->Commit().status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : out) EXPECT_OK(s);
  EXPECT_EQ(trainer->Read("w")->version, 3);
}

TEST_F(SecurityTest, X1_NoOrUnknownToken_Unauthenticated_NothingCreated) {
  auto none = ClientWith("");
  EXPECT_THAT(CreateW(*none, "a"), StatusIs(absl::StatusCode::kUnauthenticated));
  // A token of another cluster: the worker token of a second make-certs run
  // would do; any string not in the files is the same.
  const std::string forged = cluster_.dir() + "/forged.token";
  { std::ofstream(forged) << "0123456789abcdef0123456789abcdef\n"; }
  ClientOptions o = ClientOptionsFor("");
  o.token_file = forged;
  o.max_attempts = 1;
  auto unknown = Client::Connect(o);
  ASSERT_OK(unknown);
  EXPECT_THAT(CreateW(**unknown, "a"), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_TRUE(Names().empty());
  // The same call with the trainer token.
  EXPECT_OK(CreateW(*ClientWith("trainer.token"), "a"));
  EXPECT_EQ(Names(), std::vector<std::string>{"a"});
  // Reads, answered on gRPC's callback thread (ReadVariables), are refused
  // the same way; the trainer's reaches the coordinator's core ("a" is
  // uninitialized), the worker token's is not a trainer's.
  EXPECT_THAT(none->ReadBatch({"a"}), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT((*unknown)->ReadBatch({"a"}), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(ClientWith("worker.token")->ReadBatch({"a"}),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(ClientWith("trainer.token")->ReadBatch({"a"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "uninitialized"));
}

TEST_F(SecurityTest, X1_WrongRole_PermissionDenied_NothingChanged) {
  auto trainer = ClientWith("trainer.token");
  ASSERT_OK(CreateW(*trainer, "a"));
  // Deleting is the admin's.
  EXPECT_THAT(trainer->DeleteVariable("a"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(trainer->GetClusterStatus(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(Names(), std::vector<std::string>{"a"});
  // The worker token is not a trainer's either.
  EXPECT_THAT(CreateW(*ClientWith("worker.token"), "b"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(Names(), std::vector<std::string>{"a"});
  // The admin may do both what a trainer may and delete.
  auto admin = ClientWith("admin.token");
  EXPECT_OK(CreateW(*admin, "b"));
  EXPECT_OK(admin->DeleteVariable("a"));
  EXPECT_EQ(Names(), std::vector<std::string>{"b"});
}

TEST_F(SecurityTest, X1_WrongCa_RefusedAtTheHandshake_NothingCreated) {
  // The client trusts another CA: it refuses the coordinator's certificate
  // (a TLS handshake failure is UNAVAILABLE, before any call is made).
  auto wrong = ClientWith("admin.token", "other-ca.pem");
  EXPECT_THAT(CreateW(*wrong, "a"), StatusIs(absl::StatusCode::kUnavailable));
  // A worker certificate of the other CA, with the right token: the
  // coordinator refuses it at the handshake.
  v1::HeartbeatRequest hb;
  hb.set_job("tpu_worker");
  hb.set_task(0);
  hb.set_incarnation(Incarnation(0));
  v1::HeartbeatResponse resp;
  grpc::ClientContext ctx1, ctx2;
  EXPECT_EQ(WorkersStubAs("other-ca-tpu_worker-0", "worker.token")
                ->Heartbeat(WithDeadline(&ctx1), hb, &resp)
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Names().empty());
  // The same heartbeat with the CA's certificate.
  EXPECT_TRUE(WorkersStubAs("tpu_worker-0", "worker.token")
                  ->Heartbeat(WithDeadline(&ctx2), hb, &resp)
                  .ok());
}

TEST_F(SecurityTest, X1_ExpiredCertificate_RefusedAtTheHandshake) {
  v1::RegisterWorkerRequest reg;
  reg.set_job("tpu_worker");
  reg.set_task(0);
  reg.set_address("127.0.0.1:1");
  reg.set_incarnation(NewIncarnation());
  v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  EXPECT_EQ(WorkersStubAs("expired-tpu_worker-0", "worker.token")
                ->RegisterWorker(WithDeadline(&ctx), reg, &resp)
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // tpu_worker:0 is still the process that registered first.
  auto topo = client_->GetTopology();
  ASSERT_OK(topo);
  for (const TaskInfo& t : topo->tasks) EXPECT_NE(t.address, "127.0.0.1:1");
}

TEST_F(SecurityTest, X1_WorkerActingForAnother_PermissionDenied_NothingChanged) {
  const uint64_t inc1 = Incarnation(1);
  auto as_worker0 = WorkersStubAs("tpu_worker-0", "worker.token");
  // Heartbeat, register, report and finish as tpu_worker:1 with worker 0's
  // valid certificate.
  v1::HeartbeatRequest hb;
  hb.set_job("tpu_worker");
  hb.set_task(1);
  hb.set_incarnation(inc1);
  v1::HeartbeatResponse hb_resp;
  grpc::ClientContext c1;
  EXPECT_EQ(as_worker0->Heartbeat(WithDeadline(&c1), hb, &hb_resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::RegisterWorkerRequest reg;
  reg.set_job("tpu_worker");
  reg.set_task(1);
  reg.set_address("127.0.0.1:1");
  reg.set_incarnation(NewIncarnation());
  reg.add_devices("/job:tpu_worker/replica:0/task:1/device:TPU:0");
  v1::RegisterWorkerResponse reg_resp;
  grpc::ClientContext c2;
  EXPECT_EQ(as_worker0->RegisterWorker(WithDeadline(&c2), reg, &reg_resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportStepRequest report;
  report.set_step(1);
  report.set_epoch(1);
  report.set_job("tpu_worker");
  report.set_task(1);
  report.set_incarnation(inc1);
  v1::StepPlan plan;
  grpc::ClientContext c3;
  EXPECT_EQ(as_worker0->ReportStep(WithDeadline(&c3), report, &plan).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::FinishStepRequest finish;
  finish.set_step(1);
  finish.set_epoch(1);
  finish.set_job("tpu_worker");
  finish.set_task(1);
  finish.set_incarnation(inc1);
  v1::StepResolution resolution;
  grpc::ClientContext c4;
  EXPECT_EQ(as_worker0->FinishStep(WithDeadline(&c4), finish, &resolution).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The same report and finish on worker 0's step stream: each message is
  // checked, each refused; its own report on that stream is not.
  {
    grpc::ClientContext c6;
    auto stream = as_worker0->StepStream(WithDeadline(&c6));
    v1::StepStreamRequest m;
    m.set_tag(1);
    *m.mutable_report() = report;
    ASSERT_TRUE(stream->Write(m));
    m.set_tag(2);
    *m.mutable_finish() = finish;
    ASSERT_TRUE(stream->Write(m));
    m.set_tag(3);
    *m.mutable_report() = report;
    m.mutable_report()->set_task(0);
    m.mutable_report()->set_incarnation(Incarnation(0));
    ASSERT_TRUE(stream->Write(m));
    std::map<uint64_t, int> codes;
    v1::StepStreamResponse got;
    for (int i = 0; i < 3 && stream->Read(&got); ++i) codes[got.tag()] = got.code();
    EXPECT_EQ(codes[1], grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(codes[2], grpc::StatusCode::PERMISSION_DENIED);
    ASSERT_TRUE(codes.contains(3));
    EXPECT_NE(codes[3], grpc::StatusCode::PERMISSION_DENIED);  // no step is open: refused for that
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  // tpu_worker:1 is where it was, the same process.
  auto topo = client_->GetTopology();
  ASSERT_OK(topo);
  for (const TaskInfo& t : topo->tasks) EXPECT_NE(t.address, "127.0.0.1:1");
  EXPECT_EQ(topo->tasks.size(), 2u);
  EXPECT_EQ(Incarnation(1), inc1);
  // The same heartbeat as itself, from worker 1's certificate.
  grpc::ClientContext c5;
  EXPECT_TRUE(WorkersStubAs("tpu_worker-1", "worker.token")
                  ->Heartbeat(WithDeadline(&c5), hb, &hb_resp)
                  .ok());
}

TEST_F(SecurityTest, X1_WorkerServices_NeedTheirCertificateAndToken) {
  v1::HeartbeatRequest hb;
  hb.set_job("tpu_worker");
  hb.set_task(0);
  hb.set_incarnation(Incarnation(0));
  v1::HeartbeatResponse resp;
  // The worker token without a certificate names no task.
  grpc::ClientContext c1;
  EXPECT_EQ(WorkersStubAs("", "worker.token")->Heartbeat(WithDeadline(&c1), hb, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // The certificate without the token; the trainer's token and certificate.
  grpc::ClientContext c2, c3;
  EXPECT_EQ(WorkersStubAs("tpu_worker-0", "")->Heartbeat(WithDeadline(&c2), hb, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(WorkersStubAs("trainer", "trainer.token")
                ->Heartbeat(WithDeadline(&c3), hb, &resp)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A worker's coordinator-facing service is the coordinator's alone: not
  // another worker's, not a trainer's.
  const uint64_t inc1 = Incarnation(1);
  for (auto [cert, token] : {std::pair{"tpu_worker-0", "worker.token"},
                             std::pair{"trainer", "trainer.token"}, std::pair{"", "admin.token"}}) {
    auto stub = v1::WorkerReplicas::NewStub(ChannelAs(cluster_.worker_address(1), cert, token));
    v1::DropVariableRequest drop;
    drop.set_incarnation(inc1);
    drop.set_variable_id(1);
    v1::DropVariableResponse drop_resp;
    grpc::ClientContext ctx;
    const grpc::StatusCode code =
        stub->DropVariable(WithDeadline(&ctx), drop, &drop_resp).error_code();
    EXPECT_TRUE(code == grpc::StatusCode::PERMISSION_DENIED ||
                code == grpc::StatusCode::UNAUTHENTICATED)
        << cert << " " << token << ": " << code;
  }
  // As the coordinator it answers.
  EXPECT_EQ(Incarnation(1), inc1);
  grpc::ClientContext c4;
  EXPECT_TRUE(
      WorkersStubAs("tpu_worker-0", "worker.token")->Heartbeat(WithDeadline(&c4), hb, &resp).ok());
}

// A worker's trainer-facing service, its batched read included, answers a
// trainer's token (with or without a certificate) and an admin's, and
// refuses a call without a token, or with the workers' (a worker's or the
// coordinator's certificate).
TEST_F(SecurityTest, X1_WorkerSteps_TrainersAndAdmins_StepReadSmallIncluded) {
  auto read = [&](const std::string& cert, const std::string& token) {
    auto stub = v1::WorkerSteps::NewStub(ChannelAs(cluster_.worker_address(0), cert, token));
    v1::StepReadSmallRequest req;  // no reads: answered empty when let in
    v1::StepReadSmallResponse resp;
    grpc::ClientContext ctx;
    return stub->StepReadSmall(WithDeadline(&ctx), req, &resp).error_code();
  };
  EXPECT_EQ(read("", ""), grpc::StatusCode::UNAUTHENTICATED);
  for (auto [cert, token] :
       {std::pair{"tpu_worker-1", "worker.token"}, std::pair{"coordinator", "worker.token"}}) {
    const grpc::StatusCode code = read(cert, token);
    EXPECT_TRUE(code == grpc::StatusCode::PERMISSION_DENIED ||
                code == grpc::StatusCode::UNAUTHENTICATED)
        << cert << " " << token << ": " << code;
  }
  EXPECT_EQ(read("", "trainer.token"), grpc::StatusCode::OK);
  EXPECT_EQ(read("trainer", "trainer.token"), grpc::StatusCode::OK);
  EXPECT_EQ(read("", "admin.token"), grpc::StatusCode::OK);
}

TEST_F(SecurityTest, X1_Sighup_ReloadsTheTokenFiles_ABadFileKeepsTheOld) {
  const std::string old_token = [&] {
    std::ifstream in(cluster_.cert("trainer.token"));
    std::string t;
    in >> t;
    return t;
  }();
  const std::string fresh = cluster_.dir() + "/fresh.token";
  { std::ofstream(fresh) << "fresh-trainer-token-0123456789abcdef\n"; }
  ClientOptions o = ClientOptionsFor("");
  o.token_file = fresh;
  o.max_attempts = 1;
  auto rotated = Client::Connect(o);
  ASSERT_OK(rotated);
  EXPECT_THAT((*rotated)->GetTopology(), StatusIs(absl::StatusCode::kUnauthenticated));
  // The new token first, the old one still accepted; then SIGHUP.
  {
    std::ofstream(cluster_.cert("trainer.token")) << "fresh-trainer-token-0123456789abcdef\n"
                                                  << old_token << "\n";
  }
  cluster_.coordinator().Kill(SIGHUP);
  absl::Status s = absl::UnknownError("not tried");
  for (absl::Time until = absl::Now() + Scaled(absl::Seconds(10)); absl::Now() < until;) {
    if ((s = (*rotated)->GetTopology().status()).ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_OK(s);
  EXPECT_OK(ClientWith("trainer.token")->GetTopology());
  // A file that cannot be used: the tokens stay as they were.
  { std::ofstream(cluster_.cert("trainer.token")) << "short\n"; }
  cluster_.coordinator().Kill(SIGHUP);
  bool logged = false;
  for (absl::Time until = absl::Now() + Scaled(absl::Seconds(10));
       !logged && absl::Now() < until;) {
    std::ifstream log(cluster_.coordinator().log_path());
    std::stringstream text;
    text << log.rdbuf();
    logged = absl::StrContains(text.str(), "token files not reloaded");
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(logged);
  EXPECT_OK((*rotated)->GetTopology());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteAll(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST_F(SecurityTest, X1_Sighup_ReloadsTheCertificates_AnInvalidSetKeepsTheOld) {
  const std::string old_ca = cluster_.dir() + "/old-ca.pem";
  WriteAll(old_ca, ReadAll(cluster_.cert("ca.pem")));
  // A client trusting the CA that signed what the coordinator presents
  // connects; one trusting another CA is refused at the handshake.
  auto fresh_client = [&](const std::string& ca) {
    ClientOptions o = ClientOptionsFor("trainer.token");
    o.tls_ca_file = ca;
    o.max_attempts = 1;
    o.deadline = Scaled(absl::Seconds(10));
    auto c = Client::Connect(o);
    EXPECT_OK(c);
    return c.ok() ? (*c)->GetTopology().status() : c.status();
  };
  EXPECT_OK(fresh_client(old_ca));
  EXPECT_THAT(fresh_client(cluster_.cert("other-ca.pem")),
              StatusIs(absl::StatusCode::kUnavailable));

  // An invalid set (the key is another certificate's): logged, nothing changes.
  WriteAll(cluster_.cert("coordinator.key"), ReadAll(cluster_.cert("tpu_worker-0.key")));
  cluster_.coordinator().Kill(SIGHUP);
  bool logged = false;
  for (absl::Time until = absl::Now() + Scaled(absl::Seconds(10)); !logged && absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(50))) {
    logged =
        absl::StrContains(ReadAll(cluster_.coordinator().log_path()), "certificates not reloaded");
  }
  EXPECT_TRUE(logged);
  absl::SleepFor(absl::Milliseconds(1500));  // past the copies' refresh period
  EXPECT_OK(fresh_client(old_ca));

  // The operator rotates to a certificate of another CA (and that CA): after
  // SIGHUP new connections get it, within the copies' one-second refresh.
  WriteAll(cluster_.cert("coordinator.pem"), ReadAll(cluster_.cert("other-ca-coordinator.pem")));
  WriteAll(cluster_.cert("coordinator.key"), ReadAll(cluster_.cert("other-ca-coordinator.key")));
  WriteAll(cluster_.cert("ca.pem"), ReadAll(cluster_.cert("other-ca.pem")));
  cluster_.coordinator().Kill(SIGHUP);
  absl::Status s = absl::UnknownError("not tried");
  for (absl::Time until = absl::Now() + Scaled(absl::Seconds(10)); !s.ok() && absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(100))) {
    s = fresh_client(cluster_.cert("other-ca.pem"));
  }
  EXPECT_OK(s);
  EXPECT_THAT(fresh_client(old_ca), StatusIs(absl::StatusCode::kUnavailable));
}

// Whether `bytes` holds `value` as a protobuf varint or fixed64.
bool Shows(const std::string& bytes, uint64_t value) {
  std::string varint;
  for (uint64_t v = value;; v >>= 7) {
    if (v < 0x80) {
      varint.push_back(static_cast<char>(v));
      break;
    }
    varint.push_back(static_cast<char>((v & 0x7f) | 0x80));
  }
  std::string fixed(8, '\0');
  std::memcpy(fixed.data(), &value, 8);
  return bytes.find(varint) != std::string::npos || bytes.find(fixed) != std::string::npos;
}

TEST_F(SecurityTest, X1_Incarnations_NotShownToTrainersAdminsOrOtherWorkers) {
  const uint64_t inc0 = Incarnation(0), inc1 = Incarnation(1);
  ASSERT_NE(inc0, 0u);
  ASSERT_OK(CreateW(*client_, "w"));
  ASSERT_OK(client_->Initialize({"w"}));
  auto trainers =
      v1::CoordinatorTrainers::NewStub(ChannelAs(cluster_.address(), "", "admin.token"));
  auto admin = v1::CoordinatorAdmin::NewStub(ChannelAs(cluster_.address(), "", "admin.token"));
  std::vector<std::string> answers;
  {
    v1::Topology topo;
    grpc::ClientContext ctx;
    ASSERT_TRUE(trainers->GetTopology(WithDeadline(&ctx), {}, &topo).ok());
    EXPECT_EQ(topo.tasks_size(), 2);
    answers.push_back(topo.SerializeAsString());
  }
  {
    v1::ClusterStatus status;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin->GetClusterStatus(WithDeadline(&ctx), {}, &status).ok());
    answers.push_back(status.SerializeAsString());
  }
  v1::StepInfo begun;
  {
    v1::BeginStepRequest req;
    req.set_step(1);
    req.set_barrier_timeout_ms(absl::ToInt64Milliseconds(Scaled(absl::Seconds(20))));
    grpc::ClientContext ctx;
    ASSERT_TRUE(trainers->BeginStep(WithDeadline(&ctx), req, &begun).ok());
    EXPECT_EQ(begun.participants_size(), 2);
    answers.push_back(begun.SerializeAsString());
  }
  {
    // What worker 0 learns of the step names worker 1 by digest only.
    v1::GetStepRequest req;
    req.set_epoch(begun.epoch());
    v1::StepInfo info;
    grpc::ClientContext ctx;
    ASSERT_TRUE(WorkersStubAs("tpu_worker-0", "worker.token")
                    ->GetStep(WithDeadline(&ctx), req, &info)
                    .ok());
    answers.push_back(info.SerializeAsString());
    for (const v1::StepParticipant& p : info.participants()) {
      EXPECT_EQ(p.incarnation_digest(), IncarnationDigest(p.task() == 0 ? inc0 : inc1));
    }
  }
  for (const std::string& a : answers) {
    EXPECT_FALSE(Shows(a, inc0));
    EXPECT_FALSE(Shows(a, inc1));
  }
  // The checker finds an incarnation where one is.
  v1::HeartbeatRequest hb;
  hb.set_incarnation(inc1);
  EXPECT_TRUE(Shows(hb.SerializeAsString(), inc1));
}

// Startup refuses flags that make no mode of security.h's table.
class SecurityStartupTest : public ::testing::Test {
 protected:
  // The daemon's exit: 0 when it started and served (then stopped).
  int Run(const std::string& binary, std::vector<std::string> args) {
    auto d = testing::Daemon::Start(testing::BinaryPath(binary), std::move(args), dir_.path(),
                                    absl::StrCat("d", ++runs_));
    if (d.ok()) return (*d)->Stop() == 0 ? 0 : -1;
    std::ifstream log(absl::StrCat(dir_.path(), "/d", runs_, ".log"));
    std::stringstream text;
    text << log.rdbuf();
    last_log_ = text.str();
    return 2;
  }
  std::string Cert(const std::string& f) { return dir_.path() + "/certs/" + f; }
  void SetUp() override {
    ASSERT_EQ(std::system(absl::StrCat(REPVAR_SOURCE_DIR, "/deploy/make-certs.sh ", dir_.path(),
                                       "/certs --workers tpu_worker:0 --other-ca")
                              .c_str()),
              0);
  }
  std::vector<std::string> Tls(const std::string& name) {
    return {"--listen_address=127.0.0.1:0", "--ephemeral", "--tls_cert=" + Cert(name + ".pem"),
            "--tls_key=" + Cert(name + ".key"), "--tls_ca=" + Cert("ca.pem")};
  }
  testing::TempDir dir_;
  int runs_ = 0;
  std::string last_log_;
};

TEST_F(SecurityStartupTest,
       X1_TlsWithoutTokens_AnotherNamesCertificate_UnsignedOrWrongKey_Refused) {
  const std::string coordinator = "server/repvar-coordinator";
  std::vector<std::string> tokens = {"--worker_token_file=" + Cert("worker.token"),
                                     "--trainer_token_file=" + Cert("trainer.token")};
  auto good_flags = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), tokens.begin(), tokens.end());
    return flags;
  };
  EXPECT_EQ(Run(coordinator, Tls("coordinator")), 2);
  EXPECT_NE(last_log_.find("--trainer_token_file"), std::string::npos) << last_log_;
  std::vector<std::string> wrong_name = Tls("tpu_worker-0");
  wrong_name.insert(wrong_name.end(), tokens.begin(), tokens.end());
  EXPECT_EQ(Run(coordinator, wrong_name), 2);
  EXPECT_NE(last_log_.find("\"coordinator\""), std::string::npos) << last_log_;
  std::vector<std::string> partial = {"--listen_address=127.0.0.1:0", "--ephemeral",
                                      "--tls_cert=" + Cert("coordinator.pem")};
  EXPECT_EQ(Run(coordinator, partial), 2);
  // A certificate the CA did not sign, or a key that is not the
  // certificate's: refused at startup, naming the problem.
  std::vector<std::string> other_ca = good_flags(Tls("coordinator"));
  other_ca[2] = "--tls_cert=" + Cert("other-ca-coordinator.pem");
  other_ca[3] = "--tls_key=" + Cert("other-ca-coordinator.key");
  EXPECT_EQ(Run(coordinator, other_ca), 2);
  EXPECT_NE(last_log_.find("the CA does not vouch"), std::string::npos) << last_log_;
  std::vector<std::string> wrong_key = good_flags(Tls("coordinator"));
  wrong_key[3] = "--tls_key=" + Cert("tpu_worker-0.key");
  EXPECT_EQ(Run(coordinator, wrong_key), 2);
  EXPECT_NE(last_log_.find("the key is not the certificate's"), std::string::npos) << last_log_;
  // With everything: serves.
  std::vector<std::string> good = Tls("coordinator");
  good.insert(good.end(), tokens.begin(), tokens.end());
  EXPECT_EQ(Run(coordinator, good), 0);
}

}  // namespace
}  // namespace repvar

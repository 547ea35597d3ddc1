// SPDX-License-Identifier: Apache-2.0
// /metrics and /healthz of both daemons, scraped over HTTP from a cluster
// serving TLS with tokens: the exposition format parses line by line, and
// the numbers follow what the cluster did.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rpc/security.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::Scaled;
using ::repvar::testing::StatusIs;

using ::repvar::testing::Scrape;

class MetricsTest : public testing::StartedCluster {
 protected:
  MetricsTest()
      : StartedCluster([] {
          testing::ClusterOptions o;
          o.tpu_workers = 2;
          o.tpu_per_worker = 1;
          o.cpu_host = false;
          o.tls = true;
          o.metrics = true;
          return o;
        }()) {}

  std::pair<int, std::string> Get(const std::string& daemon, const std::string& path) {
    return testing::MetricsGet(cluster_, daemon, path);
  }
  Scrape ScrapeOf(const std::string& daemon) { return testing::ScrapeMetrics(cluster_, daemon); }
};

TEST_F(MetricsTest, Coordinator_CountsCallsByMethodAndCode_GaugesFollowTheState) {
  const std::string create = R"(method="/repvar.v1.CoordinatorTrainers/CreateVariables")";
  const Scrape before = ScrapeOf("coordinator");
  VariableSpec s{.name = "w", .dtype = DType::kFloat32, .shape = {4}};
  s.replica_count = 2;
  s.initializer = InitializerSpec::Zeros();
  ASSERT_OK(client_->CreateVariable(s));
  ASSERT_OK(client_->Initialize({"w"}));
  // A call its handler refuses is counted under its code, each time.
  const std::string init = R"(method="/repvar.v1.CoordinatorTrainers/InitializeVariables")";
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(client_->Initialize({"no_such_variable"}), StatusIs(absl::StatusCode::kNotFound));
  }
  // A refused call is counted where it is refused.
  auto anonymous = Client::Connect(ClientOptionsFor(""));
  ASSERT_OK(anonymous);
  s.name = "x";
  EXPECT_THAT((*anonymous)->CreateVariable(s), StatusIs(absl::StatusCode::kUnauthenticated));

  const Scrape after = ScrapeOf("coordinator");
  EXPECT_EQ(
      after.Get("repvar_rpc_requests_total{" + create + R"(,code="OK"})"),
      std::max(0.0, before.Get("repvar_rpc_requests_total{" + create + R"(,code="OK"})")) + 1);
  EXPECT_GE(after.Get("repvar_rpc_duration_seconds_count{" + create + "}"), 1);
  EXPECT_EQ(
      after.Get("repvar_rpc_requests_total{" + init + R"(,code="NOT_FOUND"})"),
      std::max(0.0, before.Get("repvar_rpc_requests_total{" + init + R"(,code="NOT_FOUND"})")) + 2);
  EXPECT_EQ(after.Get("repvar_rpc_requests_total{" + init + R"(,code="OK"})"),
            std::max(0.0, before.Get("repvar_rpc_requests_total{" + init + R"(,code="OK"})")) + 1);
  EXPECT_EQ(after.Get("repvar_rpc_duration_seconds_bucket{" + create + R"(,le="+Inf"})"),
            after.Get("repvar_rpc_duration_seconds_count{" + create + "}"));
  EXPECT_GE(
      after.Get(
          R"(repvar_auth_refused_total{service="repvar.v1.CoordinatorTrainers",code="UNAUTHENTICATED"})"),
      1);
  EXPECT_EQ(after.Get(R"(repvar_workers{state="live"})"), 2);
  EXPECT_EQ(after.Get(R"(repvar_variables{needs_resync="false"})"), 1);
  EXPECT_EQ(after.Get(R"(repvar_replicas{state="UP_TO_DATE"})"), 2);
  EXPECT_EQ(after.Get(R"(repvar_replica_lag_versions{of="max"})"), 0);
  EXPECT_EQ(after.Get(R"(repvar_replica_lag_versions{of="replicas_behind"})"), 0);
  // Initializing wrote the state log: its syncs are timed.
  EXPECT_GE(after.Get("repvar_state_log_sync_seconds_count"), 1);
  EXPECT_EQ(after.Get("repvar_open_step_age_seconds"), 0);
}

TEST_F(MetricsTest, Workers_HeldBytesAndCalls_HealthzWhenReady) {
  VariableSpec s{.name = "w", .dtype = DType::kFloat32, .shape = {1024}};
  s.replica_count = 2;
  s.initializer = InitializerSpec::Ones();
  ASSERT_OK(client_->CreateVariable(s));
  ASSERT_OK(client_->Initialize({"w"}));
  const Scrape coordinator_before = ScrapeOf("coordinator");
  const Scrape w_before = ScrapeOf("tpu_worker-0");
  std::vector<float> twos(1024, 2.0f);
  ASSERT_OK(client_->Assign("w", std::as_bytes(std::span(twos))));
  const Scrape w = ScrapeOf("tpu_worker-0");
  EXPECT_EQ(w.Get("repvar_worker_replicas_bytes"), 4096);
  // The write made "w" unreadable locally until a heartbeat confirms it.
  EXPECT_EQ(w.Get(R"(repvar_worker_local_reads{state="readable"})") +
                w.Get(R"(repvar_worker_local_reads{state="to_confirm"})"),
            1);
  // Bytes in and out: the coordinator took 4 KiB from the client and sent
  // it to both replicas; this worker took its copy.
  const std::string received = R"(repvar_tensor_bytes_total{direction="received"})";
  const std::string sent = R"(repvar_tensor_bytes_total{direction="sent"})";
  const Scrape coordinator = ScrapeOf("coordinator");
  EXPECT_EQ(coordinator.Get(received) - std::max(0.0, coordinator_before.Get(received)), 4096);
  EXPECT_EQ(coordinator.Get(sent) - std::max(0.0, coordinator_before.Get(sent)), 2 * 4096);
  EXPECT_EQ(w.Get(received) - std::max(0.0, w_before.Get(received)), 4096);
  // The same for a value past the inline limit, sent and read in chunk
  // frames: 2 MiB in, to both workers, and out again to a reader.
  {
    VariableSpec big{.name = "big", .dtype = DType::kFloat32, .shape = {1 << 19}};
    big.replica_count = 2;
    big.initializer = InitializerSpec::Ones();
    ASSERT_OK(client_->CreateVariable(big));
    ASSERT_OK(client_->Initialize({"big"}));
    const double mib2 = 2 << 20;
    const Scrape c0 = ScrapeOf("coordinator");
    const Scrape w0 = ScrapeOf("tpu_worker-0");
    std::vector<float> threes(1 << 19, 3.0f);
    ASSERT_OK(client_->Assign("big", std::as_bytes(std::span(threes))));
    const Scrape c1 = ScrapeOf("coordinator");
    const Scrape w1 = ScrapeOf("tpu_worker-0");
    EXPECT_EQ(c1.Get(received) - c0.Get(received), mib2);
    EXPECT_EQ(c1.Get(sent) - c0.Get(sent), 2 * mib2);
    EXPECT_EQ(w1.Get(received) - w0.Get(received), mib2);
    ASSERT_OK(client_->Read("big"));
    EXPECT_EQ(ScrapeOf("coordinator").Get(sent) - c1.Get(sent), mib2);
  }
  bool counted = false;
  for (const auto& [series, value] : w.samples) {
    counted |=
        absl::StartsWith(series, "repvar_rpc_requests_total{method=\"/repvar.v1.WorkerReplicas/") &&
        value >= 1;
  }
  EXPECT_TRUE(counted);
  EXPECT_EQ(Get("tpu_worker-0", "/healthz").first, 200);
  EXPECT_EQ(Get("coordinator", "/healthz").first, 200);
  EXPECT_EQ(Get("coordinator", "/nothing").first, 404);
}

TEST_F(MetricsTest, RequestId_EchoedInTrailers_OnTheLinesAboutTheCall) {
  auto security =
      LoadChannelSecurity(cluster_.cert("ca.pem"), "", "", cluster_.cert("admin.token"));
  ASSERT_OK(security);
  auto stub = v1::CoordinatorTrainers::NewStub(OpenChannel(cluster_.address(), *security));
  auto echoed = [](const grpc::ClientContext& ctx) {
    auto it = ctx.GetServerTrailingMetadata().find("x-request-id");
    return it == ctx.GetServerTrailingMetadata().end()
               ? std::string()
               : std::string(it->second.data(), it->second.size());
  };
  // Drained, a new step fails on the coordinator's side: a WARN line with
  // the caller's id, which comes back in the trailers.
  ASSERT_OK(client_->Drain());
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "req-0123456789");
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(10))));
    v1::BeginStepRequest req;
    req.set_step(1);
    v1::StepInfo resp;
    EXPECT_EQ(stub->BeginStep(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(echoed(ctx), "req-0123456789");
  }
  std::ifstream log(cluster_.coordinator().log_path());
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_TRUE(absl::StrContains(text.str(),
                                "rpc request_id=req-0123456789 "
                                "method=/repvar.v1.CoordinatorTrainers/BeginStep code=UNAVAILABLE"))
      << text.str();
  // Lines about a request carry its id: drain it as the admin with an id,
  // and the coordinator's line saying so shows it.
  {
    auto admin = v1::CoordinatorAdmin::NewStub(OpenChannel(cluster_.address(), *security));
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "req-resume-42");
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(10))));
    v1::DrainRequest req;
    req.set_resume(true);
    v1::DrainResponse resp;
    ASSERT_TRUE(admin->Drain(&ctx, req, &resp).ok());
    EXPECT_FALSE(resp.draining());
  }
  std::ifstream log2(cluster_.coordinator().log_path());
  std::stringstream text2;
  text2 << log2.rdbuf();
  EXPECT_TRUE(absl::StrContains(text2.str(), "request_id=req-resume-42 resumed: ")) << text2.str();
  // Without one, the answer names the id the call was given.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(10))));
  v1::Topology topo;
  EXPECT_TRUE(stub->GetTopology(&ctx, {}, &topo).ok());
  EXPECT_EQ(echoed(ctx).size(), 16u);
}

TEST(ScrapeParser, RejectsWhatIsNotTheFormat) {
  EXPECT_TRUE(Scrape::Parse("# HELP a x\n# TYPE a counter\na{b=\"c\"} 1\n").errors.empty());
  EXPECT_FALSE(Scrape::Parse("# TYPE a counter\nb 1\n").errors.empty());       // outside its family
  EXPECT_FALSE(Scrape::Parse("# TYPE a counter\na{b=c} 1\n").errors.empty());  // unquoted
  EXPECT_FALSE(Scrape::Parse("# TYPE a counter\na one\n").errors.empty());
  EXPECT_FALSE(Scrape::Parse("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"2\"} 1\n")
                   .errors.empty());
}

}  // namespace
}  // namespace repvar

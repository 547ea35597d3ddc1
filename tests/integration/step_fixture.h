// SPDX-License-Identifier: Apache-2.0
// The fixture of the step tests against real processes (step_test.cc,
// step_aggregation_test.cc): a coordinator and three TPU hosts with two
// devices each (6 replicas: 0,1 on tpu_worker:0; 2,3 on :1; 4,5 on :2)
// plus a CPU-only host. One trainer per host, each in its own thread, as a
// data-parallel job runs them. Exact checks use integer-valued floats.
#ifndef REPVAR_TESTS_INTEGRATION_STEP_FIXTURE_H_
#define REPVAR_TESTS_INTEGRATION_STEP_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_util.h"
#include "common/tensor/tensor.h"
#include "repvar/client.h"
#include "repvar/step.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {

using ::repvar::testing::Scaled;
using ::repvar::testing::StatusIs;

inline constexpr int kHosts = 3;
using Vec = std::array<float, 4>;

inline std::string Host(int h) { return absl::StrCat("tpu_worker:", h); }

class StepTest : public testing::StartedCluster {
 protected:
  StepTest()
      : StartedCluster([] {
          testing::ClusterOptions o;
          o.metrics = true;  // WorkerCalls
          return o;
        }()) {}

  // How many calls of `method` ("StepRead") of WorkerSteps tpu_worker:`host`
  // has answered OK, from its /metrics (0 before the first).
  double WorkerCalls(int host, const std::string& method) {
    const std::string daemon = absl::StrCat("tpu_worker-", host);
    int port = 0;
    for (absl::Time until = absl::Now() + Scaled(absl::Seconds(10));
         (port = cluster_.metrics_port(daemon)) == 0 && absl::Now() < until;) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    httplib::Client http("127.0.0.1", port);
    auto res = http.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200) << daemon;
    if (!res) return -1;
    const std::string series = absl::StrCat(
        R"(repvar_rpc_requests_total{method="/repvar.v1.WorkerSteps/)", method, R"(",code="OK"} )");
    const size_t at = res->body.find(series);
    double n = 0;
    if (at != std::string::npos) {
      const size_t end = res->body.find('\n', at);
      EXPECT_TRUE(
          absl::SimpleAtod(res->body.substr(at + series.size(), end - at - series.size()), &n));
    }
    return n;
  }

  // A float32[4] variable with 6 replicas, initialized to `init`.
  void Create(const std::string& name, Aggregation agg, Vec init = {1, 2, 3, 4}) {
    VariableSpec s{.name = name, .dtype = DType::kFloat32, .shape = {4}};
    s.replica_count = 6;
    s.aggregation = agg;
    s.initializer = InitializerSpec::Value(std::span<const float>(init));
    ASSERT_OK(client_->CreateVariable(s));
    ASSERT_OK(client_->Initialize({name}));
  }

  // A `dtype`[n] variable with 6 replicas, initialized to zeros.
  void CreateZeros(const std::string& name, DType dtype, int64_t n, Aggregation agg) {
    VariableSpec s{.name = name, .dtype = dtype, .shape = {n}};
    s.replica_count = 6;
    s.aggregation = agg;
    s.initializer = InitializerSpec::Zeros();
    ASSERT_OK(client_->CreateVariable(s));
    ASSERT_OK(client_->Initialize({name}));
  }

  // How many workers' report latencies the coordinator keeps for the step
  // of `epoch` (one per reporting host).
  size_t ReportLatencies(uint64_t epoch) {
    auto summary = GetStepsSummary(*client_);
    EXPECT_TRUE(summary.ok());
    if (!summary.ok()) return 0;
    for (const StepsSummary::Resolution& r : summary->recent) {
      if (r.epoch == epoch) return r.latencies.size();
    }
    return 0;
  }
  StepOptions Options(int host, absl::Duration timeout = absl::Seconds(20)) {
    return StepOptions{.worker = Host(host), .barrier_timeout = Scaled(timeout)};
  }

  // One trainer per host (through `stepping_` when set, else `client_`):
  // begins `step`, lets `body` write, commits; all hosts commit
  // concurrently. Returns each host's commit result.
  template <typename Body>
  std::vector<absl::StatusOr<StepResult>> RunStep(int64_t step, Body body,
                                                  absl::Duration timeout = absl::Seconds(20),
                                                  int hosts = kHosts) {
    std::vector<absl::StatusOr<StepResult>> out(hosts, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int h = 0; h < hosts; ++h) {
      threads.emplace_back([&, h] {
        auto scope = StepScope::Begin(stepping_ != nullptr ? *stepping_ : *client_, step,
                                      Options(h, timeout));
        if (!scope.ok()) {
          out[h] = scope.status();
          return;
        }
        if (absl::Status s = body(h, **scope); !s.ok()) {
          out[h] = s;
          return;
        }
        out[h] = (*scope)->Commit();
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // Checksums of every replica of `name` as the first `hosts` workers hold them.
  std::map<int32_t, std::pair<int64_t, uint64_t>> Replicas(const std::string& name,
                                                           int hosts = kHosts) {
    std::map<int32_t, std::pair<int64_t, uint64_t>> out;
    for (int h = 0; h < hosts; ++h) {
      v1::GetReplicaStatusResponse status = testing::WorkerStatus(cluster_.worker_address(h));
      for (const v1::LocalReplica& r : status.replicas()) {
        if (r.name() == name) out[r.replica()] = {r.version(), r.checksum()};
      }
    }
    return out;
  }

  uint64_t Incarnation(int host) {
    return testing::WorkerIncarnation(cluster_.worker_address(host));
  }

  // Restarts tpu_worker:`host` after a kill and waits until its new
  // incarnation is registered and every replica of `var` is up to date,
  // the new process's included: until the coordinator has resynced it, the
  // records can still show the killed process's replicas up to date.
  void RestartAndResync(int host, const std::string& var) {
    const uint64_t old = Incarnation(host);
    ASSERT_OK(cluster_.RestartWorker(host));
    absl::Time deadline = absl::Now() + Scaled(absl::Seconds(20));
    while (absl::Now() < deadline) {
      const v1::GetReplicaStatusResponse held =
          testing::WorkerStatus(cluster_.worker_address(host));
      auto v = client_->GetVariable(var);
      bool ready = held.incarnation() != 0 && held.incarnation() != old && v.ok();
      bool resynced = false;
      for (const v1::LocalReplica& r : held.replicas()) {
        resynced = resynced || (r.name() == var && v.ok() && r.version() == v->version);
      }
      ready = ready && resynced;
      for (const ReplicaInfo& r : v.ok() ? v->replicas : std::vector<ReplicaInfo>{}) {
        ready = ready && r.state == ReplicaState::kUpToDate;
      }
      if (ready) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "tpu_worker:" << host << " did not come back with " << var << " resynced";
  }

  Client* stepping_ = nullptr;

  Vec ReadVec(const std::string& name) {
    auto v = client_->Read(name);
    EXPECT_OK(v);
    Vec out{};
    if (v.ok()) std::memcpy(out.data(), v->bytes.data(), sizeof(out));
    return out;
  }
};

// Writes `v` to every local replica of `name`.
inline absl::Status WriteAll(StepScope& s, const std::string& name, std::function<Vec(int32_t)> v) {
  auto local = s.LocalReplicas(name);
  if (!local.ok()) return local.status();
  for (int32_t r : *local) {
    Vec x = v(r);
    if (absl::Status st = s.Write<float>(name, r, std::span<const float>(x)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace repvar

#endif  // REPVAR_TESTS_INTEGRATION_STEP_FIXTURE_H_

// SPDX-License-Identifier: Apache-2.0
// F1, F2 against real processes: a worker paused (SIGSTOP) in the middle of
// a large broadcast. The write is decided within the heartbeat timeout plus
// a little (not after 30 s RPC and gloo timeouts), and once the worker
// resumes, every replica holds what the coordinator reports (no worker keeps
// an unacknowledged version while the replicas are reported up to date).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "repvar/client.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

class WorkerFaultTest : public testing::StartedCluster {
 protected:
  WorkerFaultTest() : StartedCluster({.metrics = true}) {}
  // The broadcast bytes tpu_worker:2 has received over the data plane.
  double BroadcastReceived() {
    return testing::ScrapeMetrics(cluster_, "tpu_worker-2")
        .Get(R"(repvar_data_plane_bytes_total{direction="received"})");
  }

  // Every replica of `name` on the workers that differs from the committed
  // (version, checksum); empty when they all agree.
  std::string Disagreements(const std::string& name) {
    auto info = client_->GetVariable(name);
    if (!info.ok()) return info.status().ToString();
    std::string out;
    for (int h = 0; h < 3; ++h) {
      const v1::GetReplicaStatusResponse status = testing::WorkerStatus(cluster_.worker_address(h));
      int held = 0;
      for (const v1::LocalReplica& r : status.replicas()) {
        if (r.name() != name) continue;
        ++held;
        if (r.version() != info->version || r.checksum() != info->checksum) {
          absl::StrAppend(&out, name, "/", r.replica(), " holds version ", r.version(), "; ");
        }
      }
      if (held != 2) absl::StrAppend(&out, "worker ", h, " holds ", held, " replicas; ");
    }
    for (const ReplicaInfo& r : info->replicas) {
      if (r.state != ReplicaState::kUpToDate) {
        absl::StrAppend(&out, r.name, " is ", ReplicaStateName(r.state), "; ");
      }
    }
    return out;
  }
};

TEST_F(WorkerFaultTest, F1_F2_WorkerPausedMidBroadcast_DecidedWithinHeartbeatTimeout_Converges) {
  const int64_t n = int64_t{1} << 26;  // 256 MiB of float32
  VariableSpec spec{.name = "big", .dtype = DType::kFloat32, .shape = {n}};
  spec.replica_count = 6;
  spec.initializer = InitializerSpec::Zeros();
  ASSERT_OK(client_->CreateVariable(spec));
  ASSERT_OK(client_->Initialize({"big"}));
  const std::vector<float> ones(n, 1.0f);

  const pid_t paused = cluster_.worker(2).pid();
  absl::StatusOr<WriteAck> ack;
  std::atomic<bool> acknowledged{false};
  const double received_before = std::max(0.0, BroadcastReceived());
  std::thread writer([&] {
    ack = client_->Assign("big", std::span<const float>(ones));
    acknowledged = true;
  });
  // The pause lands mid-broadcast: once tpu_worker:2 has received some of
  // the bytes and before the write is acknowledged (it needs every worker).
  double received = received_before;
  const absl::Time until = absl::Now() + testing::Scaled(absl::Seconds(30));
  while (received <= received_before && !acknowledged && absl::Now() < until) {
    received = BroadcastReceived();
  }
  ASSERT_EQ(kill(paused, SIGSTOP), 0);
  const absl::Time stopped_at = absl::Now();
  EXPECT_FALSE(acknowledged) << "the write was acknowledged before the pause";
  EXPECT_GT(received, received_before) << "no broadcast byte reached tpu_worker:2 before the pause";
  EXPECT_LT(received - received_before, 4.0 * n) << "tpu_worker:2 had the whole value";
  writer.join();
  const absl::Duration decided = absl::Now() - stopped_at;
  // Heartbeat timeout 2 s, plus the tick, plus the client's retry to the
  // workers still live (with 256 MiB to send again): well under the 30 s of
  // the call deadlines it waited for before.
  EXPECT_LT(decided, testing::Scaled(absl::Seconds(12))) << ack.status();
  std::printf("write %s %.1f s after the pause\n", ack.ok() ? "acknowledged" : "failed",
              absl::ToDoubleSeconds(decided));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(paused, SIGCONT), 0);

  // The worker comes back (declared dead, it registers again), repair
  // fences it off from the old write, looks at what it holds, rewrites it.
  const absl::Time deadline = absl::Now() + testing::Scaled(absl::Seconds(60));
  std::string diverged;
  do {
    diverged = Disagreements("big");
    if (diverged.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  } while (absl::Now() < deadline);
  EXPECT_EQ(diverged, "");
  auto read = client_->Read("big");
  ASSERT_OK(read);
  const float expected = ack.ok() ? 1.0f : 0.0f;
  EXPECT_EQ(read->as<float>()[0], expected);
  EXPECT_EQ(read->as<float>()[n - 1], expected);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// repvar-worker: holds the replicas placed on this host's devices.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/base/daemon.h"
#include "common/base/logging.h"
#include "common/base/memory_budget.h"
#include "common/base/metrics.h"
#include "common/base/random.h"
#include "common/model/device_name.h"
#include "common/rpc/server.h"
#include "common/tensor/buffer.h"
#include "common/tensor/tensor.h"
#include "spdlog/spdlog.h"
#include "worker/core/data_plane.h"
#include "worker/core/replica_store.h"
#include "worker/core/step_resolver.h"
#include "worker/core/step_table.h"
#include "worker/core/worker_agent.h"
#include "worker/rpc/grpc_coordinator_link.h"
#include "worker/rpc/replicas_service.h"
#include "worker/rpc/steps_service.h"

ABSL_FLAG(std::string, job, "tpu_worker", "job name of this task");
ABSL_FLAG(int32_t, task, 0, "task index within the job");
ABSL_FLAG(std::string, listen_address, "127.0.0.1:0", "host:port to serve on (port 0: any)");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1", "host the coordinator reaches us at");
ABSL_FLAG(std::string, coordinator_address, "",
          "host:port of the coordinator (default: $REPVAR_COORDINATOR_ADDRESS)");
ABSL_FLAG(std::string, devices, "", "comma-separated full device names of this host");
ABSL_FLAG(int32_t, tpu_devices, -1,
          "instead of --devices: this many virtual TPU devices (plus CPU:0)");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the worker token (the cluster's shared secret): sent to the "
          "coordinator, and the only token the coordinator's calls here are accepted with");
ABSL_FLAG(std::string, port_file, "", "write the bound port here (atomically) once serving");
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "memory lent to tensors being received at once; beyond it writes get "
          "RESOURCE_EXHAUSTED (0: half the machine's memory)");
ABSL_FLAG(int64_t, max_inflight_bytes_per_connection, 0,
          "of --max_inflight_bytes, what one trainer connection may hold at once (0: half)");

int main(int argc, char** argv) {
  repvar::TuneMallocForBulkTransfers();
  repvar::PrepareDaemonProcess();
  repvar::ParseDaemonFlags(argc, argv, "the repvar worker daemon (replicas of one host)");
  const std::string job = absl::GetFlag(FLAGS_job);
  const int32_t task = absl::GetFlag(FLAGS_task);
  if (absl::Status s = repvar::StartDaemon(absl::StrCat("worker-", job, "-", task)); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  auto security = repvar::LoadDaemonSecurity(
      repvar::GetSecurityFlags(), repvar::TaskCertificateName(repvar::TaskKey{job, task}),
      "token_file", absl::GetFlag(FLAGS_token_file), absl::GetFlag(FLAGS_listen_address));
  if (!security.ok()) {
    std::fprintf(stderr, "%s\n", security.status().ToString().c_str());
    return 2;
  }

  std::string coordinator = absl::GetFlag(FLAGS_coordinator_address);
  if (coordinator.empty()) {
    const char* env = std::getenv("REPVAR_COORDINATOR_ADDRESS");
    if (env != nullptr) coordinator = env;
  }
  if (coordinator.empty()) {
    std::fprintf(stderr, "need --coordinator_address or REPVAR_COORDINATOR_ADDRESS\n");
    return 2;
  }
  if (!repvar::IsValidJobName(job) || task < 0) {
    std::fprintf(stderr, "--job must match [a-z][a-z0-9_]* and --task be >= 0\n");
    return 2;
  }
  std::vector<std::string> devices;
  if (absl::GetFlag(FLAGS_tpu_devices) >= 0) {
    devices.push_back(absl::StrCat("/job:", job, "/replica:0/task:", task, "/device:CPU:0"));
    for (int i = 0; i < absl::GetFlag(FLAGS_tpu_devices); ++i) {
      devices.push_back(absl::StrCat("/job:", job, "/replica:0/task:", task, "/device:TPU:", i));
    }
  } else {
    for (absl::string_view d :
         absl::StrSplit(absl::GetFlag(FLAGS_devices), absl::ByChar(','), absl::SkipEmpty())) {
      devices.emplace_back(d);
    }
  }

  const uint64_t incarnation = repvar::NewIncarnation();
  repvar::worker::ReplicaStore store;
  repvar::worker::GrpcCoordinatorLink link(coordinator, security->channel);
  repvar::worker::GlooDataPlane data_plane(absl::GetFlag(FLAGS_advertise_host), &link);
  repvar::worker::WorkerIdentity identity{job, task, incarnation, {}};
  for (const std::string& d : devices) {
    auto parsed = repvar::DeviceName::Parse(d);
    if (parsed.ok() && parsed->IsAccelerator()) {
      identity.accelerators.push_back(absl::StrCat(parsed->type, ":", parsed->id));
    }
  }
  repvar::worker::StepResolver resolver(identity, &store, &link, &data_plane);
  repvar::worker::StepTable steps(identity, &store, &link, &resolver);
  const int64_t inflight = absl::GetFlag(FLAGS_max_inflight_bytes);
  repvar::MemoryBudget budget(inflight > 0 ? static_cast<uint64_t>(inflight)
                                           : repvar::MemoryBudget::HalfOfMemoryLimit());
  repvar::worker::ReplicasService replicas_service(incarnation, &store, &data_plane, &budget);
  repvar::worker::StepsService steps_service(
      &steps, &budget,
      static_cast<uint64_t>(
          std::max<int64_t>(0, absl::GetFlag(FLAGS_max_inflight_bytes_per_connection))));
  // The port file is written once the agent runs (below), so a waiter sees a
  // worker that serves and registers.
  const std::vector<repvar::ServedService> services = {
      {&replicas_service, repvar::v1::WorkerReplicas::service_full_name()},
      {&steps_service, repvar::v1::WorkerSteps::service_full_name()}};
  auto server =
      repvar::DaemonServer::Start(security->server, services, "", 0, repvar::GetHealthFlags());
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  const int port = (*server)->port();
  const std::string address = absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", port);
  std::atomic<bool> ready{false};
  repvar::Metrics::Global().SetGauge("repvar_worker_replicas_bytes",
                                     "bytes of the replicas this worker holds", [&store] {
                                       return std::vector<std::pair<repvar::MetricLabels, double>>{
                                           {{}, static_cast<double>(store.BytesHeld())}};
                                     });
  repvar::SetInflightBytesGauge(&budget);
  auto metrics = repvar::StartDaemonMetrics(
      {[&ready] { return ready.load(); }, {}, security->server.certificates});
  if (!metrics.ok()) {
    spdlog::error("{}", metrics.status().ToString());
    return 1;
  }

  repvar::worker::WorkerAgent agent({job, task, address, incarnation, devices}, &link);
  absl::Notification stop;
  absl::Notification registered;
  std::atomic<int64_t> last_turn_ms{absl::ToUnixMillis(absl::Now())};
  std::thread agent_thread([&] {
    bool serving = false;
    absl::Time next = absl::Now();
    while (
        !stop.WaitForNotificationWithTimeout(std::max(next - absl::Now(), absl::ZeroDuration()))) {
      next = agent.Tick(absl::Now());
      last_turn_ms = absl::ToUnixMillis(absl::Now());
      if (agent.state() == repvar::worker::WorkerAgent::State::kFenced) {
        // A newer process of this task registered: this one must not serve.
        kill(getpid(), SIGTERM);
        return;
      }
      // Health: SERVING while registered (listed, replicas resynced).
      const bool now = agent.state() == repvar::worker::WorkerAgent::State::kRegistered;
      if (now != serving) {
        serving = now;
        ready = now;
        (*server)->SetServing(serving);
      }
      if (now && !registered.HasBeenNotified()) {
        registered.Notify();
        // systemd: ready once registered the first time.
        repvar::NotifyReady(absl::StrCat("registered as ", job, ":", task, " at ", address));
      }
    }
  });
  spdlog::info("worker {}:{} serving on {} (incarnation {}, {} devices), coordinator {}", job, task,
               address, incarnation, devices.size(), coordinator);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    absl::Status s = repvar::WritePortFile(absl::GetFlag(FLAGS_port_file), port);
    if (!s.ok()) spdlog::error("{}", s.ToString());
  }

  // systemd: the watchdog is fed while the agent's loop turns (heartbeats).
  repvar::Watchdog watchdog(
      [&] { return absl::Now() - absl::FromUnixMillis(last_turn_ms) < absl::Seconds(30); });

  int sig = repvar::WaitForShutdownSignal([&] {
    (void)repvar::ReloadDaemonSecurity(repvar::GetSecurityFlags(), absl::GetFlag(FLAGS_token_file),
                                       *security);
  });

  spdlog::info("signal {}: shutting down", sig);
  repvar::NotifyStopping();
  stop.Notify();
  agent_thread.join();
  ready = false;
  (*server)->StopServing();
  (*server)->Shutdown(absl::Now() + repvar::ShutdownGrace());
  metrics->reset();
  repvar::Metrics::Global().RemoveGauge("repvar_worker_replicas_bytes");
  repvar::Metrics::Global().RemoveGauge("repvar_inflight_bytes");
  if (agent.state() == repvar::worker::WorkerAgent::State::kFenced) {
    spdlog::error("exiting: superseded by a newer incarnation of {}:{}", job, task);
    return 3;
  }
  return 0;
}

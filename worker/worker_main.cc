// SPDX-License-Identifier: Apache-2.0
// repvar-worker: holds the replicas placed on this host's devices. Flags ->
// WorkerDaemonOptions (checked by ValidateOptions), then the parts wired
// together: the replica store, the data plane, the step table, the two
// services, metrics and the agent that registers and heartbeats.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/daemon.h"
#include "common/base/logging.h"
#include "common/base/memory_budget.h"
#include "common/base/metrics.h"
#include "common/base/random.h"
#include "common/base/status_util.h"
#include "common/rpc/server.h"
#include "spdlog/spdlog.h"
#include "worker/core/data_plane.h"
#include "worker/core/local_reads.h"
#include "worker/core/replica_store.h"
#include "worker/core/step_resolver.h"
#include "worker/core/step_table.h"
#include "worker/core/worker_agent.h"
#include "worker/rpc/grpc_coordinator_link.h"
#include "worker/rpc/replicas_service.h"
#include "worker/rpc/shared_region.h"
#include "worker/rpc/steps_service.h"
#include "worker/worker_options.h"

namespace {
const repvar::worker::WorkerDaemonOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, job, kDefaults.job, "job name of this task");
ABSL_FLAG(int32_t, task, kDefaults.task, "task index within the job");
ABSL_FLAG(std::string, listen_address, kDefaults.listen_address,
          "host:port to serve on (port 0: any)");
ABSL_FLAG(std::string, advertise_host, kDefaults.advertise_host,
          "host the coordinator reaches us at");
ABSL_FLAG(std::string, coordinator_address, kDefaults.coordinator_address,
          "host:port of the coordinator (default: $REPVAR_COORDINATOR_ADDRESS)");
ABSL_FLAG(std::string, devices, kDefaults.devices,
          "comma-separated full device names of this host");
ABSL_FLAG(int32_t, tpu_devices, kDefaults.tpu_devices,
          "instead of --devices: this many virtual TPU devices (plus CPU:0)");
ABSL_FLAG(std::string, token_file, kDefaults.token_file,
          "file whose first line is the worker token (the cluster's shared secret): sent to the "
          "coordinator, and the only token the coordinator's calls here are accepted with");
ABSL_FLAG(std::string, port_file, kDefaults.port_file,
          "write the bound port here (atomically) once serving");
ABSL_FLAG(int64_t, max_inflight_bytes, kDefaults.max_inflight_bytes,
          "memory lent to tensors being received at once; beyond it writes get "
          "RESOURCE_EXHAUSTED (0: half the machine's memory)");
ABSL_FLAG(int64_t, local_read_bytes, kDefaults.local_read_bytes,
          "memory for the committed values this worker's trainers read without asking the "
          "coordinator (values up to 64 KiB; 0: none)");
ABSL_FLAG(int64_t, max_inflight_bytes_per_connection, kDefaults.max_inflight_bytes_per_connection,
          "of --max_inflight_bytes, what one trainer connection may hold at once (0: half)");

namespace repvar::worker {
namespace {

WorkerDaemonOptions OptionsFromFlags() {
  WorkerDaemonOptions o;
  o.job = absl::GetFlag(FLAGS_job);
  o.task = absl::GetFlag(FLAGS_task);
  o.listen_address = absl::GetFlag(FLAGS_listen_address);
  o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  o.coordinator_address = absl::GetFlag(FLAGS_coordinator_address);
  if (o.coordinator_address.empty()) {
    const char* env = std::getenv("REPVAR_COORDINATOR_ADDRESS");
    if (env != nullptr) o.coordinator_address = env;
  }
  o.devices = absl::GetFlag(FLAGS_devices);
  o.tpu_devices = absl::GetFlag(FLAGS_tpu_devices);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  o.max_inflight_bytes_per_connection = absl::GetFlag(FLAGS_max_inflight_bytes_per_connection);
  o.local_read_bytes = absl::GetFlag(FLAGS_local_read_bytes);
  return o;
}

// The daemon's parts, in the order they start; Stop ends them in reverse.
class WorkerDaemon {
 public:
  WorkerDaemon(WorkerDaemonOptions options, DaemonSecurity* security)
      : options_(std::move(options)),
        security_(security),
        incarnation_(NewIncarnation()),
        link_(options_.coordinator_address, security->channel),
        data_plane_(options_.advertise_host, &link_),
        identity_(IdentityOf(options_, incarnation_)),
        resolver_(identity_, &store_, &link_, &data_plane_),
        steps_(identity_, &store_, &link_, &resolver_),
        budget_(options_.max_inflight_bytes > 0 ? static_cast<uint64_t>(options_.max_inflight_bytes)
                                                : MemoryBudget::HalfOfMemoryLimit()),
        replicas_service_(incarnation_, &store_, &data_plane_, &budget_),
        steps_service_(&steps_, &budget_,
                       static_cast<uint64_t>(options_.max_inflight_bytes_per_connection)) {}

  // Serves; the agent registers from Run. Errors: the server's, metrics'.
  absl::Status Start();
  // Heartbeats until a signal or until superseded; returns the exit code.
  int Run();

 private:
  // The local read table, when --local_read_bytes asks for one: before
  // the agent registers, so every write is seen.
  absl::Status StartLocalReads();
  void RunAgent();
  void Stop();

  const WorkerDaemonOptions options_;
  DaemonSecurity* const security_;
  const uint64_t incarnation_;
  ReplicaStore store_;
  GrpcCoordinatorLink link_;
  GlooDataPlane data_plane_;
  const WorkerIdentity identity_;
  StepResolver resolver_;
  StepTable steps_;
  MemoryBudget budget_;
  ReplicasService replicas_service_;
  StepsService steps_service_;
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<MetricsServer> metrics_;
  std::string address_;
  std::optional<SharedRegion> local_region_;
  std::unique_ptr<LocalReads> local_reads_;
  std::unique_ptr<WorkerAgent> agent_;
  std::atomic<bool> ready_{false};
  absl::Notification stop_;
  std::atomic<int64_t> last_turn_ms_{absl::ToUnixMillis(absl::Now())};
  std::thread agent_thread_;
};

absl::Status WorkerDaemon::Start() {
  const std::vector<ServedService> services = {
      {&replicas_service_, v1::WorkerReplicas::service_full_name()},
      {&steps_service_, v1::WorkerSteps::service_full_name()}};
  // The port file is written once the agent runs (Run), so a waiter sees a
  // worker that serves and registers.
  REPVAR_ASSIGN_OR_RETURN(
      server_, DaemonServer::Start(security_->server, services, "", 0, GetHealthFlags()));
  address_ = absl::StrCat(options_.advertise_host, ":", server_->port());
  Metrics::Global().SetGauge("repvar_worker_replicas_bytes",
                             "bytes of the replicas this worker holds", [this] {
                               return std::vector<std::pair<MetricLabels, double>>{
                                   {{}, static_cast<double>(store_.BytesHeld())}};
                             });
  SetInflightBytesGauge(&budget_);
  REPVAR_ASSIGN_OR_RETURN(
      metrics_,
      StartDaemonMetrics({[this] { return ready_.load(); }, {}, security_->server.certificates}));
  REPVAR_RETURN_IF_ERROR(StartLocalReads());
  agent_ = std::make_unique<WorkerAgent>(WorkerRegistration{options_.job, options_.task, address_,
                                                            incarnation_, DeviceNamesOf(options_)},
                                         &link_, local_reads_.get());
  return absl::OkStatus();
}

absl::Status WorkerDaemon::StartLocalReads() {
  if (options_.local_read_bytes <= 0) return absl::OkStatus();
  constexpr size_t kSlots = 1 << 16;
  const size_t bytes = LocalReadTableBytes(kSlots, static_cast<size_t>(options_.local_read_bytes));
  REPVAR_ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::Create(bytes));
  local_region_.emplace(std::move(region));
  local_reads_ =
      std::make_unique<LocalReads>(local_region_->bytes(), kSlots, &store_, LocalReadClockNs);
  store_.set_listener(local_reads_.get());
  resolver_.set_local_reads(local_reads_.get());
  steps_service_.set_local_reads(local_region_->fd(), bytes);
  Metrics::Global().SetGauge(
      "repvar_worker_local_reads", "variables of the local read table, by state", [this] {
        return std::vector<std::pair<MetricLabels, double>>{
            {{{"state", "readable"}}, static_cast<double>(local_reads_->readable())},
            {{{"state", "to_confirm"}}, static_cast<double>(local_reads_->to_confirm())}};
      });
  return absl::OkStatus();
}

void WorkerDaemon::RunAgent() {
  bool serving = false;
  bool told_systemd = false;
  absl::Time next = absl::Now();
  while (
      !stop_.WaitForNotificationWithTimeout(std::max(next - absl::Now(), absl::ZeroDuration()))) {
    next = agent_->Tick(absl::Now());
    last_turn_ms_ = absl::ToUnixMillis(absl::Now());
    if (agent_->state() == WorkerAgent::State::kFenced) {
      // A newer process of this task registered: this one must not serve.
      kill(getpid(), SIGTERM);
      return;
    }
    // Health: SERVING while registered (listed, replicas resynced).
    const bool now = agent_->state() == WorkerAgent::State::kRegistered;
    if (now == serving) continue;
    serving = now;
    ready_ = now;
    server_->SetServing(serving);
    // systemd: ready once registered the first time.
    if (now && !told_systemd) {
      told_systemd = true;
      NotifyReady(
          absl::StrCat("registered as ", options_.job, ":", options_.task, " at ", address_));
    }
  }
}

int WorkerDaemon::Run() {
  agent_thread_ = std::thread([this] { RunAgent(); });
  spdlog::info("worker {}:{} serving on {} (incarnation {}, {} devices), coordinator {}",
               options_.job, options_.task, address_, incarnation_, DeviceNamesOf(options_).size(),
               options_.coordinator_address);
  if (!options_.port_file.empty()) {
    if (absl::Status s = WritePortFile(options_.port_file, server_->port()); !s.ok()) {
      spdlog::error("{}", s.ToString());
    }
  }
  // systemd: the watchdog is fed while the agent's loop turns (heartbeats).
  Watchdog watchdog(
      [this] { return absl::Now() - absl::FromUnixMillis(last_turn_ms_) < absl::Seconds(30); });
  const int sig = WaitForShutdownSignal(
      [this] { (void)ReloadDaemonSecurity(GetSecurityFlags(), options_.token_file, *security_); });
  spdlog::info("signal {}: shutting down", sig);
  Stop();
  if (agent_->state() == WorkerAgent::State::kFenced) {
    spdlog::error("exiting: superseded by a newer incarnation of {}:{}", options_.job,
                  options_.task);
    return 3;
  }
  return 0;
}

void WorkerDaemon::Stop() {
  NotifyStopping();
  stop_.Notify();
  agent_thread_.join();
  ready_ = false;
  server_->StopServing();
  server_->Shutdown(absl::Now() + ShutdownGrace());
  metrics_.reset();
  Metrics::Global().RemoveGauge("repvar_worker_replicas_bytes");
  Metrics::Global().RemoveGauge("repvar_inflight_bytes");
}

}  // namespace
}  // namespace repvar::worker

int main(int argc, char** argv) {
  namespace worker = repvar::worker;
  repvar::TuneMallocForBulkTransfers();
  repvar::PrepareDaemonProcess();
  repvar::ParseDaemonFlags(argc, argv, "the repvar worker daemon (replicas of one host)");
  const worker::WorkerDaemonOptions options = worker::OptionsFromFlags();
  absl::Status started =
      repvar::StartDaemon(absl::StrCat("worker-", options.job, "-", options.task));
  if (started.ok()) started = worker::ValidateOptions(options);
  if (!started.ok()) return repvar::RefusedStart(started);
  auto security = repvar::LoadDaemonSecurity(
      repvar::GetSecurityFlags(),
      repvar::TaskCertificateName(repvar::TaskKey{options.job, options.task}), "token_file",
      options.token_file, options.listen_address);
  if (!security.ok()) return repvar::RefusedStart(security.status());
  worker::WorkerDaemon daemon(options, &*security);
  if (absl::Status s = daemon.Start(); !s.ok()) return repvar::FailedStart(s);
  return daemon.Run();
}

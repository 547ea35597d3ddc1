// SPDX-License-Identifier: Apache-2.0
// repvar-coordinator: flags -> CoordinatorDaemonOptions (checked by
// ValidateOptions), then the parts wired together: the state log, the core,
// the three services, the web view and metrics, the ticker and the
// repairer; a signal stops them in order.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/synchronization/notification.h"
#include "common/base/daemon.h"
#include "common/base/logging.h"
#include "common/base/status_util.h"
#include "common/rpc/server.h"
#include "common/tensor/buffer.h"
#include "server/coordinator_options.h"
#include "server/core/coordinator.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/coordinator_metrics.h"
#include "server/rpc/grpc_worker_client.h"
#include "server/rpc/trainers_service.h"
#include "server/rpc/web_view.h"
#include "server/rpc/workers_service.h"
#include "server/store/checkpointer.h"
#include "server/store/rocks_state_log.h"
#include "spdlog/spdlog.h"

namespace {
const repvar::server::CoordinatorDaemonOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, listen_address, kDefaults.listen_address,
          "host:port to serve on; port 0 picks a free port (see --port_file)");
ABSL_FLAG(std::string, port_file, kDefaults.port_file,
          "write the bound port here (atomically) once serving");
ABSL_FLAG(std::string, worker_token_file, kDefaults.worker_token_file,
          "file of the worker tokens (the cluster's shared secret, one per line) workers may "
          "call with; the first is sent on this daemon's calls to workers. Required with TLS");
ABSL_FLAG(absl::Duration, heartbeat_timeout, kDefaults.heartbeat_timeout,
          "a worker silent this long is declared dead");
ABSL_FLAG(absl::Duration, read_lease, kDefaults.read_lease,
          "how long a worker may serve committed values to its trainers after a heartbeat "
          "(local reads; at most a third of --heartbeat_timeout; 0: never)");
ABSL_FLAG(std::string, expected_tasks, kDefaults.expected_tasks,
          "tasks the cluster waits for, as job:count[,job:count], e.g. tpu_worker:3,worker:1");
ABSL_FLAG(int64_t, max_variable_bytes, kDefaults.max_variable_bytes, "largest variable accepted");
ABSL_FLAG(bool, data_plane, kDefaults.data_plane,
          "large writes to 3+ workers go to one root worker, which broadcasts them over gloo");
ABSL_FLAG(int64_t, data_plane_min_bytes, kDefaults.data_plane_min_bytes,
          "smallest write the data plane carries");
ABSL_FLAG(std::string, data_dir, kDefaults.data_dir,
          "keep the coordinator's state here (RocksDB and blob files), synced before every "
          "answer; a restart on the same dir recovers it. One of --data_dir and --ephemeral.");
ABSL_FLAG(bool, ephemeral, kDefaults.ephemeral,
          "keep the state in memory only: a restart forgets every variable and reuses ids. "
          "One of --data_dir and --ephemeral.");
ABSL_FLAG(int64_t, min_free_bytes, kDefaults.min_free_bytes,
          "changes that would leave less free space in --data_dir are refused "
          "(RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, checkpoint_every, kDefaults.checkpoint_every,
          "records between checkpoints of the state log");
ABSL_FLAG(int64_t, checkpoint_blob_bytes, kDefaults.checkpoint_blob_bytes,
          "bytes of values written to blob files that also bring a checkpoint of the state "
          "log (which frees the blobs of replaced values)");
ABSL_FLAG(int64_t, blob_recycle_bytes, kDefaults.blob_recycle_bytes,
          "freed blob files of 1 MiB or more kept to be written over by new values of the "
          "same size (their pages stay in the page cache); 0: freed blobs are deleted");
ABSL_FLAG(int32_t, max_rpc_threads, kDefaults.max_rpc_threads,
          "threads serving synchronous calls and streams at once; beyond them a call gets "
          "RESOURCE_EXHAUSTED (heartbeats and step reports do not need one)");
ABSL_FLAG(int64_t, checkpoint_every_steps, kDefaults.checkpoint_every_steps,
          "write a safetensors checkpoint (the cut repvarctl save takes) after every N committed "
          "steps; 0: never");
ABSL_FLAG(int32_t, checkpoint_keep, kDefaults.checkpoint_keep,
          "periodic checkpoints kept (the newest)");
ABSL_FLAG(std::string, checkpoint_dir, kDefaults.checkpoint_dir,
          "where periodic checkpoints go (default: <data_dir>/checkpoints; required with "
          "--ephemeral)");
ABSL_FLAG(absl::Duration, idempotency_window, kDefaults.idempotency_window,
          "how long the answer to a request with an id is kept for its retries (never less)");
ABSL_FLAG(int64_t, idempotency_capacity, kDefaults.idempotency_capacity,
          "answers kept within the window; beyond it new request ids get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_inflight_bytes_per_connection, kDefaults.max_inflight_bytes_per_connection,
          "of --max_inflight_bytes, what one client connection may hold at once (0: half)");
ABSL_FLAG(int64_t, max_inflight_bytes, kDefaults.max_inflight_bytes,
          "memory lent to tensors being received or computed at once; beyond it requests get "
          "RESOURCE_EXHAUSTED (0: half the machine's memory)");
ABSL_FLAG(bool, unsafe_no_fsync, kDefaults.unsafe_no_fsync,
          "TESTS ONLY: never sync the state log (acknowledged changes are lost on power loss)");

namespace repvar::server {
namespace {

CoordinatorDaemonOptions OptionsFromFlags() {
  CoordinatorDaemonOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen_address);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.worker_token_file = absl::GetFlag(FLAGS_worker_token_file);
  o.max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);
  o.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  o.read_lease = absl::GetFlag(FLAGS_read_lease);
  o.expected_tasks = absl::GetFlag(FLAGS_expected_tasks);
  o.max_variable_bytes = absl::GetFlag(FLAGS_max_variable_bytes);
  o.data_plane = absl::GetFlag(FLAGS_data_plane);
  o.data_plane_min_bytes = absl::GetFlag(FLAGS_data_plane_min_bytes);
  o.idempotency_window = absl::GetFlag(FLAGS_idempotency_window);
  o.idempotency_capacity = absl::GetFlag(FLAGS_idempotency_capacity);
  o.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  o.max_inflight_bytes_per_connection = absl::GetFlag(FLAGS_max_inflight_bytes_per_connection);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.ephemeral = absl::GetFlag(FLAGS_ephemeral);
  o.min_free_bytes = absl::GetFlag(FLAGS_min_free_bytes);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.checkpoint_blob_bytes = absl::GetFlag(FLAGS_checkpoint_blob_bytes);
  o.blob_recycle_bytes = absl::GetFlag(FLAGS_blob_recycle_bytes);
  o.unsafe_no_fsync = absl::GetFlag(FLAGS_unsafe_no_fsync);
  o.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  o.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  return o;
}

absl::StatusOr<std::unique_ptr<StateLog>> OpenStateLog(const CoordinatorDaemonOptions& o) {
  if (o.ephemeral) {
    spdlog::warn(
        "--ephemeral: the state lives in memory only; a restart forgets every variable and "
        "reuses ids");
    return std::make_unique<VolatileStateLog>();
  }
  if (o.unsafe_no_fsync) spdlog::warn("--unsafe_no_fsync: acknowledged changes can be lost");
  auto opened = RocksStateLog::Open(StoreOptionsOf(o));
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("cannot open the data dir: ", opened.status().message()));
  }
  return std::unique_ptr<StateLog>(*std::move(opened));
}

// The daemon's parts, in the order they start; Stop ends them in reverse.
class CoordinatorDaemon {
 public:
  CoordinatorDaemon(CoordinatorDaemonOptions options, DaemonSecurity* security,
                    std::unique_ptr<StateLog> log)
      : options_(std::move(options)),
        security_(security),
        log_(std::move(log)),
        workers_(GrpcWorkerClient::Options{.security = security->channel}),
        core_(CoreOptionsOf(options_), RealClock::Get(), &workers_, log_.get()),
        workers_service_(&core_, &step_infos_),
        trainers_service_(&core_, &step_infos_, &scalars_,
                          static_cast<uint64_t>(options_.max_inflight_bytes_per_connection)),
        // Drain: the server and the trainers' service say NOT_SERVING (so
        // do /healthz and systemd's status); workers' and the admin's go on.
        admin_service_(&core_, &scalars_, [this](bool draining) { OnDrain(draining); }) {}

  // Recovers the state, then serves. Errors: the state log's, the server's.
  absl::Status Start();
  // Periodic work until a signal; returns it.
  int Run();
  void Stop();

 private:
  void OnDrain(bool draining);
  absl::Status StartServing();
  absl::Status StartWebViewAndMetrics();

  const CoordinatorDaemonOptions options_;
  DaemonSecurity* const security_;
  std::unique_ptr<StateLog> log_;
  GrpcWorkerClient workers_;
  Coordinator core_;
  StepInfoCache step_infos_;
  ScalarBoard scalars_;
  WorkersService workers_service_;
  TrainersService trainers_service_;
  AdminService admin_service_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<DaemonServer> server_;
  std::atomic<bool> ready_{false};
  std::unique_ptr<WebView> web_view_;
  std::unique_ptr<MetricsServer> metrics_;
  absl::Notification stop_;
  std::thread ticker_;
  std::thread repairer_;
};

void CoordinatorDaemon::OnDrain(bool draining) {
  ready_ = !draining;
  if (server_ == nullptr) return;
  server_->SetServing({v1::CoordinatorTrainers::service_full_name()}, !draining);
  NotifyStatus(draining ? "draining" : "serving");
}

absl::Status CoordinatorDaemon::Start() {
  if (absl::Status s = core_.Recover(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot recover the state in ", options_.data_dir,
                                               ": ", s.message()));
  }
  if (std::optional<CheckpointerOptions> c = CheckpointerOptionsOf(options_)) {
    checkpointer_ = std::make_unique<Checkpointer>(&core_, *c);
    spdlog::info("a checkpoint after every {} committed steps in {} (the newest {} kept)",
                 c->every_steps, c->dir, c->keep);
  }
  REPVAR_RETURN_IF_ERROR(StartServing());
  return StartWebViewAndMetrics();
}

absl::Status CoordinatorDaemon::StartServing() {
  const std::vector<ServedService> services = {
      {&workers_service_, v1::CoordinatorWorkers::service_full_name()},
      {&trainers_service_, v1::CoordinatorTrainers::service_full_name()},
      {&admin_service_, v1::CoordinatorAdmin::service_full_name()}};
  REPVAR_ASSIGN_OR_RETURN(server_,
                          DaemonServer::Start(security_->server, services, options_.port_file,
                                              options_.max_rpc_threads, GetHealthFlags()));
  // Ready: the state was recovered before the server started.
  ready_ = true;
  server_->SetServing(true);
  RegisterCoordinatorGauges(&core_);
  spdlog::info("coordinator serving on port {} (heartbeat timeout {})", server_->port(),
               absl::FormatDuration(options_.heartbeat_timeout));
  return absl::OkStatus();
}

absl::Status CoordinatorDaemon::StartWebViewAndMetrics() {
  web_view_ =
      std::make_unique<WebView>(&core_, &scalars_, security_->server.policy,
                                WebViewRefusal(GetMetricsFlags().address, security_->server.tls(),
                                               !GetSecurityFlags().admin_token_file.empty()));
  REPVAR_ASSIGN_OR_RETURN(metrics_,
                          StartDaemonMetrics({[this] { return ready_.load(); }, web_view_->Routes(),
                                              security_->server.certificates}));
  if (metrics_ == nullptr) return absl::OkStatus();
  if (!web_view_->refusal().empty()) {
    spdlog::warn("{}", web_view_->refusal());
    return absl::OkStatus();
  }
  const std::string& address = GetMetricsFlags().address;
  spdlog::info("web view on {}://{}:{}/", metrics_->https() ? "https" : "http",
               address.substr(0, address.rfind(':')), metrics_->port());
  return absl::OkStatus();
}

int CoordinatorDaemon::Run() {
  std::atomic<int64_t> last_tick_ms{absl::ToUnixMillis(absl::Now())};
  ticker_ = std::thread([&] {
    // Often enough for heartbeats and step barrier timeouts alike.
    const absl::Duration period =
        std::min(options_.heartbeat_timeout / 10, absl::Milliseconds(100));
    while (!stop_.WaitForNotificationWithTimeout(period)) {
      core_.Tick(absl::Now());
      last_tick_ms = absl::ToUnixMillis(absl::Now());
    }
  });
  // systemd: ready now; the watchdog is fed while the ticker turns (it takes
  // the registry's locks, so a deadlock or a stuck disk stops it).
  NotifyReady(absl::StrCat("serving on port ", server_->port()));
  Watchdog watchdog(
      [&] { return absl::Now() - absl::FromUnixMillis(last_tick_ms) < absl::Seconds(10); });
  // Repairs stale replicas on live workers; apart from the ticker because it
  // moves bytes. Buffers released by writes and not reused for a while go
  // back to the system: the values themselves live on disk.
  repairer_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(2))) {
      core_.ResyncStale();
      ReleaseIdleBuffers(absl::Seconds(10));
    }
  });
  const int sig = WaitForShutdownSignal([this] {
    (void)ReloadDaemonSecurity(GetSecurityFlags(), options_.worker_token_file, *security_);
  });
  spdlog::info("signal {}: shutting down", sig);
  Stop();
  return sig;
}

void CoordinatorDaemon::Stop() {
  NotifyStopping();
  checkpointer_.reset();  // a checkpoint being written is finished first
  server_->StopServing();
  ready_ = false;
  workers_service_.Shutdown();
  trainers_service_.Shutdown();
  stop_.Notify();
  ticker_.join();
  repairer_.join();
  server_->Shutdown(absl::Now() + ShutdownGrace());
  metrics_.reset();
  UnregisterCoordinatorGauges();
  spdlog::info("coordinator stopped");
}

}  // namespace
}  // namespace repvar::server

int main(int argc, char** argv) {
  namespace server = repvar::server;
  repvar::TuneMallocForBulkTransfers();
  repvar::PrepareDaemonProcess();
  repvar::ParseDaemonFlags(argc, argv, "the repvar coordinator daemon (state, placement, steps)");
  const server::CoordinatorDaemonOptions options = server::OptionsFromFlags();
  absl::Status started = repvar::StartDaemon("coordinator");
  if (started.ok()) started = server::ValidateOptions(options);
  if (!started.ok()) return repvar::RefusedStart(started);
  auto security = repvar::LoadDaemonSecurity(
      repvar::GetSecurityFlags(), repvar::kCoordinatorCertificateName, "worker_token_file",
      options.worker_token_file, options.listen_address);
  if (!security.ok()) return repvar::RefusedStart(security.status());
  auto log = server::OpenStateLog(options);
  if (!log.ok()) return repvar::FailedStart(log.status());
  server::CoordinatorDaemon daemon(options, &*security, *std::move(log));
  if (absl::Status s = daemon.Start(); !s.ok()) return repvar::FailedStart(s);
  daemon.Run();
  return 0;
}

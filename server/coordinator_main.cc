// SPDX-License-Identifier: Apache-2.0
// repvar-coordinator: flags -> options, logging, server, ticker, signals.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/base/daemon.h"
#include "common/base/logging.h"
#include "common/rpc/server.h"
#include "common/tensor/buffer.h"
#include "common/tensor/tensor.h"
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

ABSL_FLAG(std::string, listen_address, "127.0.0.1:0",
          "host:port to serve on; port 0 picks a free port (see --port_file)");
ABSL_FLAG(std::string, port_file, "", "write the bound port here (atomically) once serving");
ABSL_FLAG(std::string, worker_token_file, "",
          "file of the worker tokens (the cluster's shared secret, one per line) workers may "
          "call with; the first is sent on this daemon's calls to workers. Required with TLS");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10),
          "a worker silent this long is declared dead");
ABSL_FLAG(std::string, expected_tasks, "",
          "tasks the cluster waits for, as job:count[,job:count], e.g. tpu_worker:3,worker:1");
ABSL_FLAG(int64_t, max_variable_bytes, int64_t{64} << 30, "largest variable accepted");
ABSL_FLAG(bool, data_plane, true,
          "large writes to 3+ workers go to one root worker, which broadcasts them over gloo");
ABSL_FLAG(int64_t, data_plane_min_bytes, 1 << 20, "smallest write the data plane carries");
ABSL_FLAG(std::string, data_dir, "",
          "keep the coordinator's state here (RocksDB and blob files), synced before every "
          "answer; a restart on the same dir recovers it. One of --data_dir and --ephemeral.");
ABSL_FLAG(bool, ephemeral, false,
          "keep the state in memory only: a restart forgets every variable and reuses ids. "
          "One of --data_dir and --ephemeral.");
ABSL_FLAG(int64_t, min_free_bytes, int64_t{64} << 20,
          "changes that would leave less free space in --data_dir are refused "
          "(RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, checkpoint_every, 4096, "records between checkpoints of the state log");
ABSL_FLAG(int64_t, checkpoint_blob_bytes, int64_t{256} << 20,
          "bytes of values written to blob files that also bring a checkpoint of the state "
          "log (which frees the blobs of replaced values)");
ABSL_FLAG(int64_t, blob_recycle_bytes, int64_t{1} << 30,
          "freed blob files of 1 MiB or more kept to be written over by new values of the "
          "same size (their pages stay in the page cache); 0: freed blobs are deleted");
ABSL_FLAG(int32_t, max_rpc_threads, 512,
          "threads serving synchronous calls and streams at once; beyond them a call gets "
          "RESOURCE_EXHAUSTED (heartbeats and step reports do not need one)");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0,
          "write a safetensors checkpoint (the cut repvarctl save takes) after every N committed "
          "steps; 0: never");
ABSL_FLAG(int32_t, checkpoint_keep, 3, "periodic checkpoints kept (the newest)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where periodic checkpoints go (default: <data_dir>/checkpoints; required with "
          "--ephemeral)");
ABSL_FLAG(absl::Duration, idempotency_window, absl::Hours(1),
          "how long the answer to a request with an id is kept for its retries (never less)");
ABSL_FLAG(int64_t, idempotency_capacity, 1000000,
          "answers kept within the window; beyond it new request ids get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_inflight_bytes_per_connection, 0,
          "of --max_inflight_bytes, what one client connection may hold at once (0: half)");
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "memory lent to tensors being received or computed at once; beyond it requests get "
          "RESOURCE_EXHAUSTED (0: half the machine's memory)");
ABSL_FLAG(bool, unsafe_no_fsync, false,
          "TESTS ONLY: never sync the state log (acknowledged changes are lost on power loss)");

namespace {

absl::StatusOr<std::map<std::string, int32_t>> ParseExpected(const std::string& text) {
  std::map<std::string, int32_t> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, absl::ByChar(','))) {
    std::vector<std::string> kv = absl::StrSplit(part, absl::ByChar(':'));
    int32_t n = 0;
    if (kv.size() != 2 || !repvar::IsValidJobName(kv[0]) || !absl::SimpleAtoi(kv[1], &n) || n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--expected_tasks: bad entry \"", part, "\"; want job:count"));
    }
    out[kv[0]] = n;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  repvar::TuneMallocForBulkTransfers();
  repvar::PrepareDaemonProcess();
  repvar::ParseDaemonFlags(argc, argv, "the repvar coordinator daemon (state, placement, steps)");
  if (absl::Status s = repvar::StartDaemon("coordinator"); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  auto security = repvar::LoadDaemonSecurity(
      repvar::GetSecurityFlags(), repvar::kCoordinatorCertificateName, "worker_token_file",
      absl::GetFlag(FLAGS_worker_token_file), absl::GetFlag(FLAGS_listen_address));
  if (!security.ok()) {
    std::fprintf(stderr, "%s\n", security.status().ToString().c_str());
    return 2;
  }

  repvar::server::CoordinatorOptions options;
  options.membership.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  auto expected = ParseExpected(absl::GetFlag(FLAGS_expected_tasks));
  if (!expected.ok()) {
    std::fprintf(stderr, "%s\n", expected.status().ToString().c_str());
    return 2;
  }
  options.membership.expected_tasks = *expected;
  options.max_variable_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_variable_bytes));
  options.idempotency_window = absl::GetFlag(FLAGS_idempotency_window);
  options.idempotency_capacity = static_cast<size_t>(absl::GetFlag(FLAGS_idempotency_capacity));
  if (options.idempotency_window <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_idempotency_capacity) < 1) {
    std::fprintf(stderr, "--idempotency_window and --idempotency_capacity must be positive\n");
    return 2;
  }
  if (int64_t inflight = absl::GetFlag(FLAGS_max_inflight_bytes); inflight > 0) {
    options.max_inflight_bytes = static_cast<uint64_t>(inflight);
  }
  options.replication.data_plane = absl::GetFlag(FLAGS_data_plane);
  options.replication.data_plane_min_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_data_plane_min_bytes));
  if (options.membership.heartbeat_timeout <= absl::ZeroDuration()) {
    std::fprintf(stderr, "--heartbeat_timeout must be positive\n");
    return 2;
  }

  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  if (data_dir.empty() == !absl::GetFlag(FLAGS_ephemeral)) {
    std::fprintf(stderr,
                 "give exactly one of --data_dir=DIR (state kept on disk) and --ephemeral "
                 "(state in memory, lost on restart)\n");
    return 2;
  }
  std::unique_ptr<repvar::server::StateLog> log;
  if (data_dir.empty()) {
    spdlog::warn(
        "--ephemeral: the state lives in memory only; a restart forgets every variable and "
        "reuses ids");
    log = std::make_unique<repvar::server::VolatileStateLog>();
  } else {
    repvar::server::RocksStateLogOptions store;
    store.dir = data_dir;
    store.min_free_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_min_free_bytes));
    store.checkpoint_every =
        static_cast<uint64_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_checkpoint_every)));
    store.checkpoint_blob_bytes =
        static_cast<uint64_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_checkpoint_blob_bytes)));
    store.blobs.recycle_bytes =
        static_cast<uint64_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_blob_recycle_bytes)));
    store.sync = !absl::GetFlag(FLAGS_unsafe_no_fsync);
    if (!store.sync) spdlog::warn("--unsafe_no_fsync: acknowledged changes can be lost");
    auto opened = repvar::server::RocksStateLog::Open(store);
    if (!opened.ok()) {
      spdlog::error("cannot open the data dir: {}", opened.status().ToString());
      return 1;
    }
    log = *std::move(opened);
  }

  repvar::server::GrpcWorkerClient::Options worker_calls;
  worker_calls.security = security->channel;
  repvar::server::GrpcWorkerClient workers(worker_calls);
  repvar::server::Coordinator core(options, repvar::RealClock::Get(), &workers, log.get());
  if (absl::Status s = core.Recover(); !s.ok()) {
    spdlog::error("cannot recover the state in {}: {}", data_dir, s.ToString());
    return 1;
  }
  std::unique_ptr<repvar::server::Checkpointer> checkpointer;
  if (const int64_t every = absl::GetFlag(FLAGS_checkpoint_every_steps); every > 0) {
    std::string dir = absl::GetFlag(FLAGS_checkpoint_dir);
    if (dir.empty() && !data_dir.empty()) dir = data_dir + "/checkpoints";
    if (dir.empty() || absl::GetFlag(FLAGS_checkpoint_keep) < 1) {
      std::fprintf(stderr,
                   "--checkpoint_every_steps needs --checkpoint_dir (or --data_dir) and "
                   "--checkpoint_keep >= 1\n");
      return 2;
    }
    checkpointer = std::make_unique<repvar::server::Checkpointer>(
        &core,
        repvar::server::CheckpointerOptions{dir, every, absl::GetFlag(FLAGS_checkpoint_keep)});
    spdlog::info("a checkpoint after every {} committed steps in {} (the newest {} kept)", every,
                 dir, absl::GetFlag(FLAGS_checkpoint_keep));
  }
  repvar::server::StepInfoCache step_infos;
  repvar::server::WorkersService workers_service(&core, &step_infos);
  repvar::server::ScalarBoard scalars;
  repvar::server::TrainersService trainers_service(
      &core, &step_infos, &scalars,
      static_cast<uint64_t>(
          std::max<int64_t>(0, absl::GetFlag(FLAGS_max_inflight_bytes_per_connection))));
  // Drain: the server and the trainers' service say NOT_SERVING (so do
  // /healthz and systemd's status); workers' and the admin's go on.
  repvar::DaemonServer* served = nullptr;
  std::atomic<bool> ready{false};
  repvar::server::AdminService admin_service(&core, &scalars, [&](bool draining) {
    ready = !draining;
    if (served == nullptr) return;
    served->SetServing({repvar::v1::CoordinatorTrainers::service_full_name()}, !draining);
    repvar::NotifyStatus(draining ? "draining" : "serving");
  });

  const std::vector<repvar::ServedService> services = {
      {&workers_service, repvar::v1::CoordinatorWorkers::service_full_name()},
      {&trainers_service, repvar::v1::CoordinatorTrainers::service_full_name()},
      {&admin_service, repvar::v1::CoordinatorAdmin::service_full_name()}};
  auto server =
      repvar::DaemonServer::Start(security->server, services, absl::GetFlag(FLAGS_port_file),
                                  absl::GetFlag(FLAGS_max_rpc_threads), repvar::GetHealthFlags());
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  // Ready: the state was recovered before the server started.
  const int port = (*server)->port();
  served = server->get();
  ready = true;
  (*server)->SetServing(true);
  repvar::server::RegisterCoordinatorGauges(&core);
  const repvar::server::WebView web_view(
      &core, &scalars, security->server.policy,
      repvar::server::WebViewRefusal(repvar::GetMetricsFlags().address, security->server.tls(),
                                     !repvar::GetSecurityFlags().admin_token_file.empty()));
  auto metrics = repvar::StartDaemonMetrics(
      {[&ready] { return ready.load(); }, web_view.Routes(), security->server.certificates});
  if (!metrics.ok()) {
    spdlog::error("{}", metrics.status().ToString());
    return 1;
  }
  if (*metrics != nullptr) {
    const std::string& address = repvar::GetMetricsFlags().address;
    if (web_view.refusal().empty()) {
      spdlog::info("web view on {}://{}:{}/", (*metrics)->https() ? "https" : "http",
                   address.substr(0, address.rfind(':')), (*metrics)->port());
    } else {
      spdlog::warn("{}", web_view.refusal());
    }
  }
  spdlog::info("coordinator serving on port {} (heartbeat timeout {})", port,
               absl::FormatDuration(options.membership.heartbeat_timeout));

  absl::Notification stop;
  std::atomic<int64_t> last_tick_ms{absl::ToUnixMillis(absl::Now())};
  std::thread ticker([&] {
    // Often enough for heartbeats and step barrier timeouts alike.
    absl::Duration period =
        std::min(options.membership.heartbeat_timeout / 10, absl::Milliseconds(100));
    while (!stop.WaitForNotificationWithTimeout(period)) {
      core.Tick(absl::Now());
      last_tick_ms = absl::ToUnixMillis(absl::Now());
    }
  });
  // systemd: ready now; the watchdog is fed while the ticker turns (it takes
  // the registry's locks, so a deadlock or a stuck disk stops it).
  repvar::NotifyReady(absl::StrCat("serving on port ", port));
  repvar::Watchdog watchdog(
      [&] { return absl::Now() - absl::FromUnixMillis(last_tick_ms) < absl::Seconds(10); });
  // Repairs stale replicas on live workers; apart from the ticker because it
  // moves bytes. Buffers released by writes and not reused for a while go
  // back to the system: the values themselves live on disk.
  std::thread repairer([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Seconds(2))) {
      core.ResyncStale();
      repvar::ReleaseIdleBuffers(absl::Seconds(10));
    }
  });

  int sig = repvar::WaitForShutdownSignal([&] {
    (void)repvar::ReloadDaemonSecurity(repvar::GetSecurityFlags(),
                                       absl::GetFlag(FLAGS_worker_token_file), *security);
  });

  spdlog::info("signal {}: shutting down", sig);
  repvar::NotifyStopping();
  checkpointer.reset();  // a checkpoint being written is finished first
  (*server)->StopServing();
  ready = false;
  workers_service.Shutdown();
  trainers_service.Shutdown();
  stop.Notify();
  ticker.join();
  repairer.join();
  (*server)->Shutdown(absl::Now() + repvar::ShutdownGrace());
  metrics->reset();
  repvar::server::UnregisterCoordinatorGauges();
  spdlog::info("coordinator stopped");
  return 0;
}

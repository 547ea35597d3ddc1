// SPDX-License-Identifier: Apache-2.0
#include "common/base/daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/base/version.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(
    std::string, log_level, "info",
    "trace, debug, info, warn, error, critical or off (any case); $SPDLOG_LEVEL overrides it");
ABSL_FLAG(bool, insecure, false,
          "serve gRPC in plaintext, without authentication, on a non-loopback address (refused "
          "without it; logged as a warning with it). Bulk data-plane bytes are plaintext either "
          "way (gloo), covered by chunk checksums");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate this daemon serves with and presents to the others (its CN names it: "
          "\"coordinator\", or a worker's \"/job:J/task:T\"); with --tls_key and --tls_ca, every "
          "listener and call is TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that signed the cluster's certificates: peers are verified "
          "against it");
ABSL_FLAG(std::string, trainer_token_file, "",
          "file of the bearer tokens trainers may call with (one per line); required with TLS");
ABSL_FLAG(std::string, admin_token_file, "",
          "file of the bearer tokens operators may call with (everything a trainer may, and the "
          "admin service); without it nobody is admin under TLS");
ABSL_FLAG(std::string, metrics_address, "",
          "HOST:PORT of the HTTP server of /metrics (Prometheus text) and /healthz (200 when "
          "ready); empty (the default): none; port 0 picks one (logged, and written to "
          "--metrics_port_file)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "write the metrics server's port here (atomically) once it serves");
ABSL_FLAG(std::string, health_address, "",
          "HOST:PORT of a plaintext gRPC listener serving grpc.health.v1 and nothing else, for "
          "probes that cannot speak TLS (Kubernetes' grpc probe); empty (the default): none; "
          "port 0 picks one (logged, and written to --health_port_file)");
ABSL_FLAG(std::string, health_port_file, "",
          "write the health listener's port here (atomically) once it serves");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5),
          "on SIGTERM, how long calls in flight may take to finish before they are cancelled "
          "(the daemon exits as soon as none is left)");
ABSL_FLAG(bool, exit_with_parent, false,
          "shut down (as on SIGTERM) when the process that started this one dies, even by "
          "SIGKILL: no daemon outlives a script that started it (deploy/local-cluster.sh)");
ABSL_FLAG(std::string, log_format, "text",
          "text (one line per message) or json (one object per line: time, level, logger, pid, "
          "msg)");

namespace repvar {

bool IsLoopback(absl::string_view address) {
  absl::string_view host = address;
  if (absl::ConsumePrefix(&host, "[")) {
    host = host.substr(0, host.find(']'));
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, std::string(host).c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  return false;
}

absl::Status CheckPlaintextAllowed(absl::string_view flag, absl::string_view address,
                                   bool insecure) {
  if (IsLoopback(address)) return absl::OkStatus();
  if (!insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, "=", address,
        " is not a loopback address, and this build serves gRPC without TLS or tokens: anyone "
        "who reaches it could read and write every variable. Serve on 127.0.0.1, or pass "
        "--insecure on a network only the cluster can reach"));
  }
  spdlog::warn("--insecure: serving gRPC in plaintext without authentication on {} ({})",
               std::string(address), std::string(flag));
  return absl::OkStatus();
}

SideListenerFlags GetMetricsFlags() {
  return {absl::GetFlag(FLAGS_metrics_address), absl::GetFlag(FLAGS_metrics_port_file)};
}

SideListenerFlags GetHealthFlags() {
  return {absl::GetFlag(FLAGS_health_address), absl::GetFlag(FLAGS_health_port_file)};
}

SecurityFlags GetSecurityFlags() {
  return {absl::GetFlag(FLAGS_tls_cert),         absl::GetFlag(FLAGS_tls_key),
          absl::GetFlag(FLAGS_tls_ca),           absl::GetFlag(FLAGS_trainer_token_file),
          absl::GetFlag(FLAGS_admin_token_file), absl::GetFlag(FLAGS_insecure)};
}

absl::Duration ShutdownGrace() {
  return std::max(absl::ZeroDuration(), absl::GetFlag(FLAGS_shutdown_grace));
}

std::string VersionString(absl::string_view program) {
  return absl::StrCat(program, " ", kVersion, " (commit ", kGitCommit, ", ", kBuildType, " build)");
}

namespace {
std::string& Program() {
  static auto* program = new std::string("repvar");
  return *program;
}
}  // namespace

void ParseDaemonFlags(int argc, char** argv, absl::string_view what) {
  const std::string program = argc > 0 ? std::string(absl::string_view(argv[0]).substr(
                                             absl::string_view(argv[0]).rfind('/') + 1))
                                       : std::string("repvar");
  absl::FlagsUsageConfig config;
  // Every flag but Abseil's own (those are under --helpfull).
  auto ours = [](absl::string_view file) { return !absl::StrContains(file, "absl/"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  config.version_string = [program] { return VersionString(program) + "\n"; };
  absl::SetFlagsUsageConfig(config);
  Program() = program;
  absl::SetProgramUsageMessage(what);
  const pid_t parent = getppid();
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_exit_with_parent)) {
    // SIGTERM is blocked (BlockShutdownSignals) and taken by
    // WaitForShutdownSignal: the parent's death starts a clean shutdown. A
    // parent that died before prctl is seen as a new parent.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) kill(getpid(), SIGTERM);
  }
}

absl::Status StartDaemon(const std::string& name) {
  const std::string level = absl::GetFlag(FLAGS_log_level);
  const std::string format = absl::GetFlag(FLAGS_log_format);
  if (absl::Status s = ParseLogLevel(level).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log_level=", level, ": ", s.message()));
  }
  if (absl::Status s = InitLogging({name, level, format}); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log_format=", format, ": ", s.message()));
  }
  spdlog::info("{} starting", VersionString(Program()));
  std::vector<std::string> given;
  for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
    if (flag->CurrentValue() != flag->DefaultValue()) {
      given.push_back(absl::StrCat("--", flag_name, "=", flag->CurrentValue()));
    }
  }
  std::sort(given.begin(), given.end());
  spdlog::debug("flags not at their defaults: {}", absl::StrJoin(given, " "));
  return absl::OkStatus();
}

int RefusedStart(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 2;
}

int FailedStart(const absl::Status& s) {
  spdlog::error("{}", s.ToString());
  return 1;
}

void NotifyReady(const std::string& status) {
  sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%d", status.c_str(), static_cast<int>(getpid()));
}

void NotifyStatus(const std::string& status) { sd_notifyf(0, "STATUS=%s", status.c_str()); }

void NotifyStopping() { sd_notify(0, "STOPPING=1\nSTATUS=shutting down"); }

struct Watchdog::State {
  absl::Notification stop;
  std::thread thread;
};

Watchdog::Watchdog(std::function<bool()> alive) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  state_ = std::make_unique<State>();
  const absl::Duration period = absl::Microseconds(static_cast<int64_t>(usec)) / 2;
  spdlog::info("systemd watchdog: pinging every {}", absl::FormatDuration(period));
  state_->thread = std::thread([s = state_.get(), period, alive = std::move(alive)] {
    while (!s->stop.WaitForNotificationWithTimeout(period)) {
      if (alive()) {
        sd_notify(0, "WATCHDOG=1");
      } else {
        spdlog::error("the daemon's loop is stuck: no watchdog ping");
      }
    }
  });
}

Watchdog::~Watchdog() {
  if (state_ == nullptr) return;
  state_->stop.Notify();
  state_->thread.join();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view text, int mode) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", tmp, ": ", strerror(errno)));
  bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WritePortFile(const std::string& path, int port) {
  return WriteFileAtomically(path, absl::StrCat(port, "\n"), 0644);
}

void PrepareDaemonProcess() {
  BlockShutdownSignals();
  InstallCrashHandler();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

void InstallCrashHandler() {
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  // Abseil counts SIGTERM as a failure; here it asks for a clean shutdown
  // (WaitForShutdownSignal takes it), so it keeps its default disposition.
  std::signal(SIGTERM, SIG_DFL);
}

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal(const std::function<void()>& on_hangup) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig != SIGHUP) return sig;
    spdlog::info("SIGHUP: reloading");
    if (on_hangup) on_hangup();
  }
}

}  // namespace repvar

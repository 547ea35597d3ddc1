// SPDX-License-Identifier: Apache-2.0
// Small pieces every daemon main() uses.
#ifndef REPVAR_COMMON_BASE_DAEMON_H_
#define REPVAR_COMMON_BASE_DAEMON_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace repvar {

// "repvar-coordinator 0.1.0 (commit 0123456789ab, Release build)".
std::string VersionString(absl::string_view program);

// Parses a daemon's command line (absl flags; --flagfile works). --help
// lists every repvar flag with its meaning (those of the shared libraries
// too: --log_level, --log_format, --exit_with_parent), --helpfull adds
// Abseil's, and --version prints VersionString. `what`: one line saying
// what the daemon is. Call after PrepareDaemonProcess.
void ParseDaemonFlags(int argc, char** argv, absl::string_view what);

// Whether `address` ("host:port", "[v6]:port") names a loopback host:
// 127.0.0.0/8, ::1 or localhost. "0.0.0.0", "[::]" and an empty host (every
// interface) are not.
bool IsLoopback(absl::string_view address);

// X1: gRPC in plaintext on an address other hosts can reach only with
// `insecure` (--insecure, warned about at startup). Errors:
// FAILED_PRECONDITION naming the address and the flag.
absl::Status CheckPlaintextAllowed(absl::string_view flag, absl::string_view address,
                                   bool insecure);

// The security flags both daemons share (common/rpc/security.h turns them
// into credentials): paths, empty when not given.
struct SecurityFlags {
  std::string tls_cert, tls_key, tls_ca;
  std::string trainer_token_file, admin_token_file;
  bool insecure = false;
};
SecurityFlags GetSecurityFlags();

// A listener beside the gRPC one: HOST:PORT (empty: none) and the file its
// port is written to (port 0 picks one).
struct SideListenerFlags {
  std::string address, port_file;
};
// --metrics_address, --metrics_port_file: /metrics and /healthz (HTTP).
SideListenerFlags GetMetricsFlags();
// --health_address, --health_port_file: grpc.health.v1 alone, in plaintext
// (probes that cannot speak TLS, such as Kubernetes' grpc probe).
SideListenerFlags GetHealthFlags();
// --shutdown_grace: on SIGTERM, how long calls in flight may take.
absl::Duration ShutdownGrace();

// What every daemon does after ParseDaemonFlags: logging as --log_level
// and --log_format say, for the logger `logger` (its version logged at
// INFO, the flags not at their defaults at DEBUG). Errors: INVALID_ARGUMENT
// naming the logging flag (the daemon exits 2).
absl::Status StartDaemon(const std::string& logger);

// A daemon main()'s exits before it serves: RefusedStart prints `s` to
// stderr and returns 2 (bad flags or credentials: the operator's to fix);
// FailedStart logs `s` and returns 1 (the start itself failed).
int RefusedStart(const absl::Status& s);
int FailedStart(const absl::Status& s);

// systemd (Type=notify): READY=1 once the daemon serves, STOPPING=1 when
// it starts to shut down, with a STATUS line each. No-ops when systemd did
// not start the process ($NOTIFY_SOCKET unset).
void NotifyReady(const std::string& status);
void NotifyStopping();
void NotifyStatus(const std::string& status);

// With WatchdogSec= (sd_watchdog_enabled), pings systemd every half period
// while `alive()` says the daemon's own loop still turns; a daemon that
// stops pinging is killed and restarted by systemd. Stops with the
// returned object. Without a watchdog: does nothing.
class Watchdog {
 public:
  explicit Watchdog(std::function<bool()> alive);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Writes `text` to `path` (mode `mode`) through a temporary file, fsync and
// rename, so a reader never sees a partial file. Errors: INTERNAL.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view text, int mode);
// WriteFileAtomically(path, "<port>\n", 0644).
absl::Status WritePortFile(const std::string& path, int port);

// What every daemon's main() does first, before any thread starts:
// BlockShutdownSignals, InstallCrashHandler, and Abseil's deadlock detector
// off (on in Debian's Abseil build, it walks a global lock graph on every
// Mutex acquisition, a share of a worker's CPU on the step path, and
// rescans every held lock when a batched write holds one per variable). The lock
// order is checked by the tests instead: unit tests keep the detector on,
// RankedMutex checks ranks, and clang's thread-safety analysis the
// annotations.
void PrepareDaemonProcess();

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (call first in
// main, before any thread starts, so every thread inherits the mask).
void BlockShutdownSignals();
// On a crash (SIGSEGV, SIGBUS, SIGABRT — an uncaught exception too) the
// process writes a stack trace to stderr (its log file) before it dies.
void InstallCrashHandler();
// Waits for SIGINT or SIGTERM; returns the signal number. Each SIGHUP on
// the way calls `on_hangup` (when given: reload what can be reloaded).
int WaitForShutdownSignal(const std::function<void()>& on_hangup = nullptr);

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_DAEMON_H_

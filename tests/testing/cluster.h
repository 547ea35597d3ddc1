// SPDX-License-Identifier: Apache-2.0
// Starts the real daemons as processes on 127.0.0.1 for cluster tests: each
// binds port 0 and reports its port through a file written by rename; each
// runs in its own process group with a parent-death signal; each is stopped
// by PID. Timeouts scale with $REPVAR_TEST_TIMEOUT_SCALE.
#ifndef REPVAR_TESTS_TESTING_CLUSTER_H_
#define REPVAR_TESTS_TESTING_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/temp_dir.h"

namespace repvar::testing {

absl::Duration Scaled(absl::Duration d);

// One daemon process. Stop() sends SIGTERM, then SIGKILL after a grace period.
class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const std::string& binary,
                                                       std::vector<std::string> args,
                                                       const std::string& dir,
                                                       const std::string& name);
  ~Daemon();
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  // e.g. SIGKILL (reaped), SIGSTOP (returns once the process stopped), SIGCONT.
  void Kill(int sig);
  // SIGTERM, then SIGKILL after 10 s. Returns the exit code when the process
  // exited by itself, -1 when it had to be killed or died of a signal.
  int Stop();
  bool Running();

 private:
  Daemon() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  int status_ = 0;  // wait status once reaped
  std::string log_;
};

struct ClusterOptions {
  int tpu_workers = 3;
  int tpu_per_worker = 2;
  bool cpu_host = true;  // a /job:worker task without accelerators
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  std::string expected_tasks;  // default: exactly the tasks started
  // The coordinator keeps its state in <dir>/coordinator-data (false: in
  // memory, --ephemeral).
  bool durable = true;
  std::vector<std::string> coordinator_flags;  // more flags
  // TLS and tokens on every daemon (X1), from deploy/make-certs.sh run into
  // <dir>/certs at Start(): a certificate per daemon, worker, trainer and
  // admin tokens, an expired certificate of tpu_worker:0 and a second CA
  // with one certificate of each name.
  bool tls = false;
  // Every daemon serves /metrics on 127.0.0.1 (a port of its own).
  bool metrics = false;
};

// A coordinator plus workers; Start() waits until the cluster has formed.
class TestCluster {
 public:
  explicit TestCluster(ClusterOptions options = {});
  ~TestCluster();
  absl::Status Start();
  std::string address() const;
  int worker_count() const { return static_cast<int>(workers_.size()); }
  Daemon& worker(int i) { return *workers_[i]; }
  Daemon& coordinator() { return *coordinator_; }
  // Starts tpu_worker:i again (new incarnation) after it was killed.
  absl::Status RestartWorker(int i);
  // Stops the coordinator with `sig` (SIGKILL: at once; SIGTERM: cleanly)
  // and starts it again on the same port and data dir, calling `while_down`
  // (when given) in between.
  absl::Status RestartCoordinator(int sig, const std::function<void()>& while_down = nullptr);
  std::string coordinator_data_dir() const { return dir() + "/coordinator-data"; }
  std::string worker_address(int i) const;
  bool tls() const { return options_.tls; }
  // The metrics port of "coordinator" or a worker ("tpu_worker-0"); 0 when
  // it has none.
  int metrics_port(const std::string& daemon) const;
  // A file of <dir>/certs ("ca.pem", "trainer.token", "tpu_worker-0.key").
  std::string cert(const std::string& file) const { return dir() + "/certs/" + file; }
  const std::string& dir() const { return dir_.path(); }

 private:
  absl::StatusOr<std::unique_ptr<Daemon>> StartWorker(const std::string& job, int task, int tpus);
  absl::StatusOr<std::unique_ptr<Daemon>> StartCoordinator(int port);
  // The flags of the daemon `name` (its certificate <name>.pem) that
  // ClusterOptions asks for; `token_flag` names its worker token flag.
  std::vector<std::string> OptionFlags(const std::string& name,
                                       const std::string& token_flag) const;
  ClusterOptions options_;
  TempDir dir_;
  std::unique_ptr<Daemon> coordinator_;
  std::vector<std::unique_ptr<Daemon>> workers_;  // tpu_worker:0..n-1, then worker:0
};

std::string BinaryPath(const std::string& name);

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_CLUSTER_H_

// SPDX-License-Identifier: Apache-2.0
#include "tests/testing/cluster.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace repvar::testing {

absl::Duration Scaled(absl::Duration d) {
  const char* s = std::getenv("REPVAR_TEST_TIMEOUT_SCALE");
  double f = 1;
  if (s != nullptr && absl::SimpleAtod(s, &f) && f > 0) return d * f;
  return d;
}

std::string BinaryPath(const std::string& name) {
  return absl::StrCat(REPVAR_BINARY_DIR, "/", name);
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const std::string& binary,
                                                      std::vector<std::string> args,
                                                      const std::string& dir,
                                                      const std::string& name) {
  std::string port_file = absl::StrCat(dir, "/", name, ".port");
  std::string log = absl::StrCat(dir, "/", name, ".log");
  std::filesystem::remove(port_file);
  args.insert(args.begin(), binary);
  args.push_back(absl::StrCat("--port_file=", port_file));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  auto d = std::unique_ptr<Daemon>(new Daemon());
  d->pid_ = pid;
  d->log_ = log;
  absl::Time deadline = absl::Now() + Scaled(absl::Seconds(20));
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      d->port_ = port;
      return d;
    }
    if (!d->Running()) {
      return absl::InternalError(absl::StrCat(name, " exited before serving; see ", log));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(name, " did not report a port; see ", log));
}

bool Daemon::Running() {
  if (pid_ <= 0) return false;
  pid_t r = waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void Daemon::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
  if (sig == SIGSTOP && pid_ > 0) {
    // Until the process has stopped (for 10 s at most): kill() only queues
    // the signal.
    const absl::Time until = absl::Now() + absl::Seconds(10);
    int status = 0;
    while (absl::Now() < until) {
      const pid_t r = waitpid(pid_, &status, WNOHANG | WUNTRACED);
      if (r == pid_ && WIFSTOPPED(status)) break;
      if (r == pid_) {  // it exited instead
        status_ = status;
        pid_ = -1;
        break;
      }
      if (r < 0 && errno != EINTR) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  if (sig == SIGKILL && pid_ > 0) {
    waitpid(pid_, &status_, 0);
    pid_ = -1;
  }
}

int Daemon::Stop() {
  if (pid_ <= 0) return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
  kill(pid_, SIGCONT);
  kill(pid_, SIGTERM);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (!Running()) return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
  Kill(SIGKILL);
  return -1;
}

Daemon::~Daemon() { Stop(); }

TestCluster::TestCluster(ClusterOptions options) : options_(std::move(options)) {}

TestCluster::~TestCluster() {
  std::vector<std::string> logs;
  if (coordinator_ != nullptr) logs.push_back(coordinator_->log_path());
  for (const auto& w : workers_) logs.push_back(w->log_path());
  workers_.clear();
  coordinator_.reset();
  // A failed test shows what the daemons said last (their files go with the
  // test's directory unless $REPVAR_KEEP_TEST_DIRS is set).
  if (!::testing::Test::HasFailure()) return;
  for (const std::string& path : logs) {
    std::ifstream in(path);
    std::deque<std::string> tail;
    for (std::string line; std::getline(in, line);) {
      tail.push_back(std::move(line));
      if (tail.size() > 40) tail.pop_front();
    }
    std::printf("---- the last %zu lines of %s ----\n", tail.size(), path.c_str());
    for (const std::string& line : tail) std::printf("%s\n", line.c_str());
  }
}

std::string TestCluster::address() const {
  return absl::StrCat("127.0.0.1:", coordinator_->port());
}

std::string TestCluster::worker_address(int i) const {
  return absl::StrCat("127.0.0.1:", workers_[i]->port());
}

std::vector<std::string> TestCluster::OptionFlags(const std::string& name,
                                                  const std::string& token_flag) const {
  std::vector<std::string> flags;
  if (options_.tls) {
    flags = {absl::StrCat("--tls_cert=", cert(name + ".pem")),
             absl::StrCat("--tls_key=", cert(name + ".key")),
             absl::StrCat("--tls_ca=", cert("ca.pem")),
             absl::StrCat("--", token_flag, "=", cert("worker.token")),
             absl::StrCat("--trainer_token_file=", cert("trainer.token")),
             absl::StrCat("--admin_token_file=", cert("admin.token"))};
  }
  if (options_.metrics) {
    flags.push_back("--metrics_address=127.0.0.1:0");
    flags.push_back(absl::StrCat("--metrics_port_file=", dir(), "/", name, ".metrics_port"));
  }
  return flags;
}

int TestCluster::metrics_port(const std::string& daemon) const {
  std::ifstream in(absl::StrCat(dir(), "/", daemon, ".metrics_port"));
  int port = 0;
  return in >> port ? port : 0;
}

absl::StatusOr<std::unique_ptr<Daemon>> TestCluster::StartWorker(const std::string& job, int task,
                                                                 int tpus) {
  const std::string name = absl::StrCat(job, "-", task);
  std::vector<std::string> args = {absl::StrCat("--job=", job), absl::StrCat("--task=", task),
                                   absl::StrCat("--tpu_devices=", tpus),
                                   absl::StrCat("--coordinator_address=", address())};
  for (std::string& f : OptionFlags(name, "token_file")) args.push_back(std::move(f));
  return Daemon::Start(BinaryPath("worker/repvar-worker"), std::move(args), dir(), name);
}

absl::StatusOr<std::unique_ptr<Daemon>> TestCluster::StartCoordinator(int port) {
  std::string expected = options_.expected_tasks;
  if (expected.empty()) {
    expected = absl::StrCat("tpu_worker:", options_.tpu_workers);
    if (options_.cpu_host) absl::StrAppend(&expected, ",worker:1");
  }
  std::vector<std::string> args = {
      absl::StrCat("--listen_address=127.0.0.1:", port),
      absl::StrCat("--expected_tasks=", expected),
      absl::StrCat("--heartbeat_timeout=",
                   absl::FormatDuration(Scaled(options_.heartbeat_timeout))),
      options_.durable ? absl::StrCat("--data_dir=", coordinator_data_dir()) : "--ephemeral"};
  args.insert(args.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  for (std::string& f : OptionFlags("coordinator", "worker_token_file")) {
    args.push_back(std::move(f));
  }
  return Daemon::Start(BinaryPath("server/repvar-coordinator"), std::move(args), dir(),
                       "coordinator");
}

absl::Status TestCluster::RestartCoordinator(int sig, const std::function<void()>& while_down) {
  const int port = coordinator_->port();
  if (sig == SIGKILL) {
    coordinator_->Kill(SIGKILL);
  } else {
    coordinator_->Stop();
  }
  if (while_down) while_down();
  auto c = StartCoordinator(port);
  if (!c.ok()) return c.status();
  coordinator_ = *std::move(c);
  return absl::OkStatus();
}

absl::Status TestCluster::Start() {
  if (options_.tls) {
    std::vector<std::string> workers;
    for (int t = 0; t < options_.tpu_workers; ++t)
      workers.push_back(absl::StrCat("tpu_worker:", t));
    if (options_.cpu_host) workers.push_back("worker:0");
    const std::string command =
        absl::StrCat(REPVAR_SOURCE_DIR, "/deploy/make-certs.sh ", dir(), "/certs --workers ",
                     absl::StrJoin(workers, ","), " --expired tpu_worker-0 --other-ca");
    if (std::system(command.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("failed: ", command));
    }
  }
  auto c = StartCoordinator(0);
  if (!c.ok()) return c.status();
  coordinator_ = *std::move(c);
  for (int t = 0; t < options_.tpu_workers; ++t) {
    auto w = StartWorker("tpu_worker", t, options_.tpu_per_worker);
    if (!w.ok()) return w.status();
    workers_.push_back(*std::move(w));
  }
  if (options_.cpu_host) {
    auto w = StartWorker("worker", 0, 0);
    if (!w.ok()) return w.status();
    workers_.push_back(*std::move(w));
  }
  return absl::OkStatus();
}

absl::Status TestCluster::RestartWorker(int i) {
  workers_[i]->Stop();
  auto w = StartWorker("tpu_worker", i, options_.tpu_per_worker);
  if (!w.ok()) return w.status();
  workers_[i] = *std::move(w);
  return absl::OkStatus();
}

}  // namespace repvar::testing

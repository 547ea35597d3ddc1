// SPDX-License-Identifier: Apache-2.0
// F3, F6 against real processes: the coordinator is killed (SIGKILL) and
// started again on its data dir and port while workers and clients keep
// running. Every acknowledged write is there with its version and bytes;
// ids, versions, step ids and epochs go on; an open step is aborted; the
// same client and the same worker processes carry on. Startup refuses what
// would split the state: no data dir choice, a data dir in use, a busy port.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "repvar/client.h"
#include "repvar/step.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar {
namespace {

using ::repvar::testing::BinaryPath;
using ::repvar::testing::Scaled;
using ::repvar::testing::StatusIs;

std::vector<float> Ramp(int n, float base) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

class RestartTest : public testing::StartedCluster {
 protected:
  VariableInfo Create(const std::string& name, int64_t elements, Aggregation agg) {
    VariableSpec s{.name = name, .dtype = DType::kFloat32, .shape = {elements}};
    s.replica_count = 6;
    s.aggregation = agg;
    s.initializer = InitializerSpec::Zeros();
    auto info = client_->CreateVariable(s);
    EXPECT_OK(info);
    EXPECT_OK(client_->Initialize({name}));
    return info.ok() ? *info : VariableInfo{};
  }

  // Each worker process's incarnation, by address, and the tasks the
  // topology lists.
  std::map<std::string, uint64_t> Incarnations() {
    std::map<std::string, uint64_t> out;
    for (int i = 0; i < cluster_.worker_count(); ++i) {
      out[cluster_.worker_address(i)] = testing::WorkerIncarnation(cluster_.worker_address(i));
    }
    auto topo = client_->GetTopology();
    EXPECT_OK(topo);
    if (topo.ok()) {
      for (const TaskInfo& t : topo->tasks) out[absl::StrCat(t.job, ":", t.task)] = 0;
    }
    return out;
  }

  // Every replica of `name` on the workers themselves, as "version:checksum".
  std::set<std::string> HeldOnWorkers(const std::string& name) {
    std::set<std::string> out;
    for (int h = 0; h < 3; ++h) {
      const v1::GetReplicaStatusResponse status = testing::WorkerStatus(cluster_.worker_address(h));
      for (const v1::LocalReplica& r : status.replicas()) {
        if (r.name() == name) out.insert(absl::StrCat(r.version(), ":", r.checksum()));
      }
    }
    return out;
  }

  std::vector<absl::StatusOr<StepResult>> RunStep(int64_t step, float value) {
    std::vector<absl::StatusOr<StepResult>> out(3, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int h = 0; h < 3; ++h) {
      threads.emplace_back([&, h] {
        auto scope = StepScope::Begin(*client_, step, Options(h));
        if (!scope.ok()) {
          out[h] = scope.status();
          return;
        }
        auto local = (*scope)->LocalReplicas("w");
        for (int32_t r : local.ok() ? *local : std::vector<int32_t>{}) {
          std::vector<float> v(4, value);
          if (absl::Status s = (*scope)->Write<float>("w", r, v); !s.ok()) {
            out[h] = s;
            return;
          }
        }
        out[h] = (*scope)->Commit();
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }
  StepOptions Options(int host) {
    return StepOptions{.worker = absl::StrCat("tpu_worker:", host),
                       .barrier_timeout = Scaled(absl::Seconds(20))};
  }
};

TEST_F(RestartTest, F3_CoordinatorKilled_AcknowledgedWritesIdsAndWorkersSurvive) {
  const VariableInfo small = Create("small", 4, Aggregation::kNone);
  const VariableInfo big = Create("big", 1 << 16, Aggregation::kNone);  // 256 KiB: a blob file
  WriteAck small_ack, big_ack;
  for (int i = 1; i <= 5; ++i) {
    auto a = client_->Assign<float>("small", Ramp(4, static_cast<float>(i)));
    ASSERT_OK(a);
    small_ack = *a;
  }
  auto b = client_->AssignAdd<float>("big", Ramp(1 << 16, 0.5f));
  ASSERT_OK(b);
  big_ack = *b;
  const auto incarnations = Incarnations();

  ASSERT_OK(cluster_.RestartCoordinator(SIGKILL));

  // The same client, without reconnecting by hand.
  auto small_read = client_->Read("small");
  ASSERT_OK(small_read);
  EXPECT_EQ(small_read->version, small_ack.version);
  EXPECT_EQ(small_read->checksum, small_ack.checksum);
  EXPECT_EQ(std::vector<float>(small_read->as<float>().begin(), small_read->as<float>().end()),
            Ramp(4, 5));
  auto big_read = client_->Read("big");
  ASSERT_OK(big_read);
  EXPECT_EQ(big_read->version, big_ack.version);
  EXPECT_EQ(big_read->checksum, big_ack.checksum);
  // The workers were not restarted and are not registered again.
  EXPECT_EQ(Incarnations(), incarnations);
  // Ids never repeat; versions go on; the workers take the new version.
  auto again = client_->GetVariable("big");
  ASSERT_OK(again);
  EXPECT_EQ(again->id, big.id);
  VariableSpec fresh{.name = "fresh", .dtype = DType::kFloat32, .shape = {2}};
  auto created = client_->CreateVariable(fresh);
  ASSERT_OK(created);
  EXPECT_GT(created->id, std::max(small.id, big.id));
  auto next = client_->Assign<float>("small", Ramp(4, 100));
  ASSERT_OK(next);
  EXPECT_EQ(next->version, small_ack.version + 1);
  EXPECT_EQ(HeldOnWorkers("small"),
            std::set<std::string>{absl::StrCat(next->version, ":", next->checksum)});
}

// F3: the coordinator's copy of a large value is its blob file, mapped at
// startup without being read and checked at its first use. A copy damaged
// while the coordinator was down is never served: the read comes from an
// up-to-date replica, with the acknowledged version and bytes.
TEST_F(RestartTest, F3_BlobDamagedWhileDown_ReadServedFromAReplica) {
  Create("big", 1 << 16, Aggregation::kNone);  // 256 KiB: a blob file
  auto ack = client_->Assign<float>("big", Ramp(1 << 16, 7));
  ASSERT_OK(ack);
  int damaged = 0;
  ASSERT_OK(cluster_.RestartCoordinator(SIGKILL, [&] {
    for (const auto& e :
         std::filesystem::directory_iterator(cluster_.coordinator_data_dir() + "/blobs")) {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4096);
      f.put('\x55');
      ++damaged;
    }
  }));
  ASSERT_GE(damaged, 1);
  for (int i = 0; i < 2; ++i) {  // the damage is remembered, not checked again
    auto read = client_->Read("big");
    ASSERT_OK(read);
    EXPECT_EQ(read->version, ack->version);
    EXPECT_EQ(read->checksum, ack->checksum);
    EXPECT_EQ(std::vector<float>(read->as<float>().begin(), read->as<float>().end()),
              Ramp(1 << 16, 7));
  }
  // AssignAdd computes from the committed value: from the replica too.
  auto added = client_->AssignAdd<float>("big", std::vector<float>(1 << 16, 1));
  ASSERT_OK(added);
  auto read = client_->Read("big");
  ASSERT_OK(read);
  EXPECT_EQ(std::vector<float>(read->as<float>().begin(), read->as<float>().end()),
            Ramp(1 << 16, 8));
}

TEST_F(RestartTest, F6_StepIdsAndEpochsGoOn_AnOpenStepIsAbortedByTheRestart) {
  Create("w", 4, Aggregation::kMean);
  auto first = RunStep(1, 2.0f);
  for (auto& r : first) ASSERT_OK(r);
  const uint64_t epoch1 = first[0]->epoch;
  auto open = StepScope::Begin(*client_, 2, Options(0));
  ASSERT_OK(open);
  const uint64_t open_epoch = (*open)->epoch();

  ASSERT_OK(cluster_.RestartCoordinator(SIGKILL));

  // The step open at the crash is gone: its commit fails, naming it.
  auto orphan = (*open)->Commit();
  EXPECT_FALSE(orphan.ok());
  // Step 1 stays committed: it cannot be begun again.
  EXPECT_THAT(StepScope::Begin(*client_, 1, Options(1)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "last committed step 1"));
  auto second = RunStep(2, 6.0f);
  for (auto& r : second) ASSERT_OK(r);
  EXPECT_GT(second[0]->epoch, open_epoch);
  EXPECT_GT(open_epoch, epoch1);
  auto w = client_->Read("w");
  ASSERT_OK(w);
  EXPECT_EQ(w->version, 3);  // initialize, step 1, step 2
  EXPECT_EQ(w->as<float>()[0], 6.0f);
}

// Runs a daemon (the coordinator unless `binary` says) with `flags`; its
// exit code (124: still running after `seconds`), its output appended to
// `dir`/refused.log.
int RunDaemon(const std::string& dir, const std::vector<std::string>& flags, int seconds = 20,
              const std::string& binary = "server/repvar-coordinator") {
  const std::string cmd = absl::StrCat("timeout ", seconds, " ", BinaryPath(binary), " ",
                                       absl::StrJoin(flags, " "), " >>", dir, "/refused.log 2>&1");
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// X1 until TLS: a non-loopback listen address without --insecure stops the
// coordinator before it binds anything (exit 2, naming the flag); loopback
// serves.
TEST(CoordinatorStartup, NonLoopbackWithoutInsecure_Exit2_LoopbackServes) {
  testing::TempDir dir;
  EXPECT_EQ(RunDaemon(dir.path(), {"--ephemeral", "--listen_address=0.0.0.0:0"}), 2);
  EXPECT_THAT(ReadAll(dir.path() + "/refused.log"),
              ::testing::HasSubstr("--listen_address=0.0.0.0:0 is not a loopback address"));
  EXPECT_EQ(RunDaemon(dir.path(), {"--ephemeral", "--listen_address=127.0.0.1:0"}, 2), 124);
}

TEST(CoordinatorStartup, ExactlyOneOfDataDirAndEphemeral_ElseExit2) {
  testing::TempDir dir;
  EXPECT_EQ(RunDaemon(dir.path(), {}), 2);
  EXPECT_EQ(RunDaemon(dir.path(), {"--ephemeral", "--data_dir=" + dir.path() + "/d"}), 2);
  EXPECT_THAT(ReadAll(dir.path() + "/refused.log"),
              ::testing::HasSubstr("give exactly one of --data_dir=DIR"));
}

// Operators can read what a daemon takes: --help lists every repvar flag
// with its meaning (the shared logging flags too), --version says what was
// built.
TEST(DaemonFlags, Help_ListsEveryFlagWithItsMeaning_VersionNamesCommitAndBuild) {
  for (const std::string binary : {"server/repvar-coordinator", "worker/repvar-worker"}) {
    testing::TempDir dir;
    EXPECT_EQ(RunDaemon(dir.path(), {"--help"}, 20, binary), 1);  // Abseil's code for help
    const std::string help = ReadAll(dir.path() + "/refused.log");
    EXPECT_THAT(help, ::testing::Not(::testing::HasSubstr("No flags matched"))) << binary;
    for (const char* flag :
         {"--log_level (trace, debug", "--log_format (text", "--listen_address ("}) {
      EXPECT_THAT(help, ::testing::HasSubstr(flag)) << binary;
    }
    EXPECT_THAT(help,
                ::testing::HasSubstr(binary == "worker/repvar-worker" ? "--coordinator_address"
                                                                      : "--data_dir ("))
        << binary;
    std::filesystem::remove(dir.path() + "/refused.log");
    EXPECT_EQ(RunDaemon(dir.path(), {"--version"}, 20, binary), 0);
    EXPECT_THAT(
        ReadAll(dir.path() + "/refused.log"),
        ::testing::MatchesRegex("repvar-(coordinator|worker) [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit "
                                "([0-9a-f]{12}(-dirty)?|unknown), [A-Za-z]+ build\\)\n"))
        << binary;
  }
}

// A log level or format the daemon does not know stops it at startup (exit
// 2, naming the flag) - "DEBUG" used to turn logging off silently - and
// --log_format=json writes one JSON object per line.
TEST(DaemonFlags, LogLevelAndFormat_UnknownExit2_JsonLinesParse) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/refused.log";
  EXPECT_EQ(RunDaemon(dir.path(), {"--ephemeral", "--log_level=loud"}), 2);
  EXPECT_THAT(ReadAll(log), ::testing::HasSubstr("--log_level=loud: unknown log level"));
  EXPECT_EQ(RunDaemon(dir.path(), {"--ephemeral", "--log_format=xml"}), 2);
  EXPECT_THAT(ReadAll(log), ::testing::HasSubstr("--log_format=xml: unknown log format"));
  std::filesystem::remove(log);

  // Valid: it starts and runs until `timeout` stops it (124).
  EXPECT_EQ(RunDaemon(dir.path(),
                      {"--ephemeral", "--listen_address=127.0.0.1:0", "--log_level=DEBUG",
                       "--log_format=json", "--port_file=" + dir.path() + "/port"},
                      3),
            124);
  std::ifstream in(log);
  int lines = 0, debug = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    ASSERT_TRUE(j.contains("time") && j.contains("level") && j.contains("msg")) << line;
    EXPECT_EQ(j["logger"], "coordinator");
    debug += j["level"] == "debug";
    ++lines;
  }
  EXPECT_GT(lines, 2);
  EXPECT_GT(debug, 0) << "--log_level=DEBUG did not log at debug";
}

// --exit_with_parent: a daemon whose starter (a shell, as in
// deploy/local-cluster.sh) is SIGKILLed - no trap runs - shuts down on its
// own; without the flag it outlives the shell (the control case).
TEST(DaemonFlags, ExitWithParent_DaemonStopsWhenItsStarterIsKilled) {
  // Orphans come to this process, which can then wait for them.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  for (const bool flag : {true, false}) {
    testing::TempDir dir;
    const std::string cmd = absl::StrCat(
        BinaryPath("server/repvar-coordinator"), " --ephemeral --listen_address=127.0.0.1:0",
        " --port_file=", dir.path(), "/port", flag ? " --exit_with_parent" : "", " 2>>", dir.path(),
        "/log & echo $! >", dir.path(), "/pid; wait");
    const pid_t shell = fork();
    ASSERT_GE(shell, 0);
    if (shell == 0) {
      execl("/bin/bash", "bash", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (ReadAll(dir.path() + "/port").empty() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_FALSE(ReadAll(dir.path() + "/port").empty()) << ReadAll(dir.path() + "/log");
    const pid_t daemon = std::stoi(ReadAll(dir.path() + "/pid"));
    ASSERT_EQ(kill(shell, SIGKILL), 0);
    ASSERT_EQ(waitpid(shell, nullptr, 0), shell);
    // Gone within a few seconds (or, without the flag, still there after 2 s).
    int status = 0;
    pid_t reaped = 0;
    const absl::Time until = absl::Now() + absl::Seconds(flag ? 10 : 2);
    while ((reaped = waitpid(daemon, &status, WNOHANG)) == 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (flag) {
      ASSERT_EQ(reaped, daemon) << "the daemon outlived its killed parent";
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "not a clean shutdown";
      EXPECT_THAT(ReadAll(dir.path() + "/log"), ::testing::HasSubstr("shutting down"));
    } else {
      EXPECT_EQ(reaped, 0) << "the control case stopped without the flag";
      kill(daemon, SIGTERM);
      waitpid(daemon, nullptr, 0);
    }
  }
}

TEST_F(RestartTest, SecondCoordinatorOnTheDataDirOrThePort_Refused) {
  const std::string log = cluster_.dir() + "/refused.log";
  EXPECT_EQ(RunDaemon(cluster_.dir(), {"--listen_address=127.0.0.1:0",
                                       "--data_dir=" + cluster_.coordinator_data_dir()}),
            1);
  EXPECT_THAT(ReadAll(log), ::testing::HasSubstr("in use by another coordinator"));
  testing::TempDir other;
  EXPECT_EQ(RunDaemon(cluster_.dir(),
                      {absl::StrCat("--listen_address=127.0.0.1:", cluster_.coordinator().port()),
                       "--data_dir=" + other.path() + "/d"}),
            1);
  EXPECT_THAT(ReadAll(log), ::testing::HasSubstr("cannot listen on 127.0.0.1"));
  // The cluster's own coordinator still answers.
  EXPECT_OK(client_->GetTopology());
}

}  // namespace
}  // namespace repvar

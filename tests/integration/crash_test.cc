// SPDX-License-Identifier: Apache-2.0
// F3 under load, against real processes: clients assign, add and read while
// trainers on every host run steps, and the coordinator is killed (SIGKILL)
// at a random moment and started again on its data dir. After every restart each variable's history
// -- every call with its answer, or with an unknown outcome when the call failed -- must be
// linearizable from the state before the trial (tests/testing/
// linearizability.h): no acknowledged write lost or applied twice, no read
// that goes back in time, no version reused. A step writes one value to
// every replica of crash/0, so a committed step is an assign of it in that
// variable's history; committed step ids and epochs only go up across every
// restart (F6). After all trials every replica
// on the workers holds the committed value. The negative control runs the
// same load against a coordinator that keeps nothing (--ephemeral) and must
// be caught.
//
// REPVAR_CRASH_TRIALS (default 20) sets the number of trials and
// REPVAR_CRASH_SEED the seed; both are printed.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "repvar/client.h"
#include "repvar/step.h"
#include "sim/linearizability.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::sim::CheckLinearizable;
using ::repvar::sim::RegisterOp;
using ::repvar::sim::RegisterState;

constexpr int kVariables = 3;
constexpr int kClients = 4;
constexpr int kElements = 4;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Var(int v) { return absl::StrCat("crash/", v); }

// F6: each committed step (step id, epoch), in the order trainers saw them
// commit, has a step id and an epoch above the one before. FAILED_PRECONDITION
// names the last pair that does not.
absl::Status StepsGoOn(const std::vector<std::pair<int64_t, uint64_t>>& committed) {
  for (size_t i = 1; i < committed.size(); ++i) {
    if (committed[i].first <= committed[i - 1].first ||
        committed[i].second <= committed[i - 1].second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", committed[i].first, " epoch ", committed[i].second, " committed after step ",
          committed[i - 1].first, " epoch ", committed[i - 1].second));
    }
  }
  return absl::OkStatus();
}

// Whether a failed write may still have taken effect: only a refusal says
// it did not.
bool OutcomeUnknown(const absl::Status& s) {
  return !(absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) || absl::IsNotFound(s) ||
           absl::IsResourceExhausted(s) || absl::IsAlreadyExists(s));
}

struct TrialResult {
  int acknowledged = 0;
  int unknown = 0;
  int reads = 0;
  int steps = 0;                       // committed
  std::vector<absl::Status> verdicts;  // one per variable
};

class CrashTest : public testing::StartedCluster {
 protected:
  explicit CrashTest(testing::ClusterOptions options = {}) : StartedCluster(std::move(options)) {}

  void CreateVariables() {
    for (int v = 0; v < kVariables; ++v) {
      VariableSpec s{.name = Var(v), .dtype = DType::kFloat32, .shape = {kElements}};
      s.replica_count = 6;
      s.initializer = InitializerSpec::Zeros();
      ASSERT_OK(client_->CreateVariable(s));
      ASSERT_OK(client_->Initialize({Var(v)}));
    }
  }

  absl::StatusOr<RegisterState> State(int v) {
    absl::Status last;
    for (int attempt = 0; attempt < 50; ++attempt) {
      auto r = client_->Read(Var(v));
      if (r.ok()) {
        auto f = r->as<float>();
        return RegisterState{r->version, std::vector<float>(f.begin(), f.end())};
      }
      last = r.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return last;
  }

  // Steps on crash/0 until `stop`, one trainer per host, each writing the
  // same value to its host's replicas (NONE aggregation), with a pause
  // between steps so that cross-replica writes find the gaps (S5 refuses
  // them while a step is open). A committed step goes into the history as
  // an assign of that value; a step that failed without a refusal, as one
  // of unknown outcome.
  void StepLoop(const std::atomic<bool>& stop, std::vector<RegisterOp>& history,
                std::mutex& history_mu, int& committed) {
    auto client = Client::Connect({.coordinator_address = cluster_.address(),
                                   .deadline = absl::Seconds(5),
                                   .max_attempts = 8});
    if (!client.ok()) return;
    for (int n = 0; !stop.load() && n < 1000; ++n) {
      const int64_t step = next_step_++;
      RegisterOp op;
      op.kind = RegisterOp::Kind::kAssign;
      op.arg = std::vector<float>(kElements, -static_cast<float>(step));  // no client writes it
      op.call = Now();
      std::vector<absl::StatusOr<StepResult>> results(3, absl::UnknownError("not run"));
      std::vector<std::thread> hosts;
      for (int h = 0; h < 3; ++h) {
        hosts.emplace_back([&, h] {
          auto scope =
              StepScope::Begin(**client, step,
                               StepOptions{.worker = absl::StrCat("tpu_worker:", h),
                                           .barrier_timeout = testing::Scaled(absl::Seconds(5))});
          if (!scope.ok()) {
            results[h] = scope.status();
            return;
          }
          auto local = (*scope)->LocalReplicas(Var(0));
          for (int32_t r : local.ok() ? *local : std::vector<int32_t>{}) {
            if (absl::Status s = (*scope)->Write<float>(Var(0), r, op.arg); !s.ok()) {
              results[h] = s;
              return;
            }
          }
          results[h] = (*scope)->Commit();
        });
      }
      for (std::thread& t : hosts) t.join();
      const StepResult* done = nullptr;
      bool unknown = false;
      for (const auto& r : results) {
        if (r.ok()) {
          done = &*r;
        } else if (OutcomeUnknown(r.status())) {
          unknown = true;
        }
      }
      if (done != nullptr) {
        op.ret = Now();
        committed_steps_.emplace_back(done->step, done->epoch);
        if (absl::Status s = StepsGoOn(committed_steps_); !s.ok()) {
          ++steps_gone_back_;
          std::printf("%s\n", s.ToString().c_str());
        }
        ++committed;
        const StepChange* change = nullptr;
        for (const StepChange& c : done->changed) change = c.variable == Var(0) ? &c : change;
        if (change == nullptr) continue;  // the majority kept the committed value
        op.version = change->version;
        op.checksum = change->checksum;
        EXPECT_EQ(op.checksum, sim::ChecksumOf(op.arg)) << "a value no trainer wrote";
      } else if (!unknown) {
        continue;  // refused: it changed nothing
      }
      {
        std::lock_guard<std::mutex> lock(history_mu);
        history.push_back(std::move(op));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // One trial: load, SIGKILL at a random moment, restart, more load; then
  // each variable's history is checked. `after_restart` runs right after the
  // coordinator is back (the negative control re-creates what it forgot).
  TrialResult Trial(std::mt19937_64& rng, int trial, const std::function<void()>& after_restart) {
    TrialResult out;
    std::vector<RegisterState> initial(kVariables);
    for (int v = 0; v < kVariables; ++v) {
      auto s = State(v);
      EXPECT_OK(s);
      if (s.ok()) initial[v] = *s;
    }
    std::vector<std::vector<RegisterOp>> history(kVariables);
    std::mutex mu;
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      const uint64_t seed = rng();
      clients.emplace_back([&, c, seed] {
        auto client = Client::Connect({.coordinator_address = cluster_.address(),
                                       .deadline = absl::Seconds(5),
                                       .max_attempts = 8});
        if (!client.ok()) return;
        std::mt19937_64 r(seed);
        for (int n = 0; !stop.load() && n < 100000; ++n) {
          const int v = static_cast<int>(r() % kVariables);
          const int dice = static_cast<int>(r() % 10);
          RegisterOp op;
          op.call = Now();
          absl::Status status;
          if (dice < 4) {
            op.kind = RegisterOp::Kind::kAssign;
            const float base = static_cast<float>(((trial * kClients + c) * 100000 + n) % 4000000);
            op.arg = {base, base + 1, base + 2, base + 3};
            auto ack = (*client)->Assign(Var(v), std::span<const float>(op.arg));
            status = ack.status();
            if (ack.ok()) op.version = ack->version, op.checksum = ack->checksum;
          } else if (dice < 7) {
            op.kind = RegisterOp::Kind::kAdd;
            op.arg = {1, 1, 1, 1};
            auto ack = (*client)->AssignAdd(Var(v), std::span<const float>(op.arg));
            status = ack.status();
            if (ack.ok()) op.version = ack->version, op.checksum = ack->checksum;
          } else {
            op.kind = RegisterOp::Kind::kRead;
            auto got = (*client)->Read(Var(v));
            status = got.status();
            if (got.ok()) op.version = got->version, op.checksum = got->checksum;
          }
          if (status.ok()) {
            op.ret = Now();
          } else if (op.kind == RegisterOp::Kind::kRead || !OutcomeUnknown(status)) {
            continue;  // it changed nothing anyone saw
          }
          std::lock_guard<std::mutex> lock(mu);
          history[v].push_back(std::move(op));
        }
      });
    }
    std::thread stepper([&] { StepLoop(stop, history[0], mu, out.steps); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 500));
    EXPECT_OK(cluster_.RestartCoordinator(SIGKILL));
    after_restart();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
    for (std::thread& t : clients) t.join();
    if (stepper.joinable()) stepper.join();

    for (int v = 0; v < kVariables; ++v) {
      RegisterOp last;
      last.call = Now();
      auto s = State(v);
      last.ret = Now();
      if (s.ok()) {
        last.version = s->version;
        last.checksum = sim::ChecksumOf(s->value);
        history[v].push_back(last);
      }
      for (const RegisterOp& op : history[v]) {
        if (op.ret == RegisterOp::kNever) {
          ++out.unknown;
        } else if (op.kind == RegisterOp::Kind::kRead) {
          ++out.reads;
        } else {
          ++out.acknowledged;
        }
      }
      out.verdicts.push_back(s.ok() ? CheckLinearizable(history[v], initial[v]) : s.status());
    }
    return out;
  }

  int64_t next_step_ = 1;
  // Committed with a step id or epoch not above the last one's.
  std::atomic<int> steps_gone_back_{0};
  std::vector<std::pair<int64_t, uint64_t>> committed_steps_;  // (step, epoch), in order
};

TEST_F(CrashTest, F3_KillNineUnderLoad_HistoriesLinearizable_ReplicasConverge) {
  const int trials = EnvInt("REPVAR_CRASH_TRIALS", 20);
  const int seed = EnvInt("REPVAR_CRASH_SEED", 20261203);
  std::printf("crash trials: %d, seed %d (REPVAR_CRASH_TRIALS, REPVAR_CRASH_SEED)\n", trials, seed);
  std::mt19937_64 rng(seed);
  CreateVariables();
  int acknowledged = 0, unknown = 0, reads = 0, steps = 0;
  for (int trial = 0; trial < trials; ++trial) {
    TrialResult r = Trial(rng, trial, [] {});
    acknowledged += r.acknowledged;
    unknown += r.unknown;
    reads += r.reads;
    steps += r.steps;
    for (int v = 0; v < kVariables; ++v) {
      EXPECT_OK(r.verdicts[v]) << "trial " << trial << ", " << Var(v);
    }
  }
  std::printf(
      "%d trials: %d acknowledged writes and committed steps (%d steps), %d reads, %d writes of "
      "unknown outcome\n",
      trials, acknowledged, steps, reads, unknown);
  EXPECT_GT(acknowledged, trials * 10);
  EXPECT_GT(steps, trials) << "the step load did not run";
  EXPECT_EQ(steps_gone_back_, 0);

  // Repair brings every replica to the committed value (F2 across crashes).
  const absl::Time deadline = absl::Now() + testing::Scaled(absl::Seconds(30));
  std::string diverged;
  do {
    diverged.clear();
    for (int v = 0; v < kVariables; ++v) {
      auto info = client_->GetVariable(Var(v));
      ASSERT_OK(info);
      for (int h = 0; h < 3; ++h) {
        const v1::GetReplicaStatusResponse status =
            testing::WorkerStatus(cluster_.worker_address(h));
        for (const v1::LocalReplica& r : status.replicas()) {
          if (r.name() == Var(v) &&
              (r.version() != info->version || r.checksum() != info->checksum)) {
            absl::StrAppend(&diverged, Var(v), "/", r.replica(), " holds ", r.version(), "; ");
          }
        }
      }
    }
    if (diverged.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (absl::Now() < deadline);
  EXPECT_EQ(diverged, "");
}

// The checker catches a coordinator that forgets: --ephemeral loses every
// acknowledged write at the SIGKILL (the variables are made again, as a user
// would), and the histories must be rejected.
class CrashNegativeControlTest : public CrashTest {
 protected:
  CrashNegativeControlTest() : CrashTest(testing::ClusterOptions{.durable = false}) {}
};

TEST_F(CrashNegativeControlTest, Ephemeral_LosesAcknowledgedWrites_HistoriesRejected) {
  std::mt19937_64 rng(7);
  CreateVariables();
  TrialResult r = Trial(rng, 0, [this] {
    ASSERT_OK(client_->WaitForTopology(testing::Scaled(absl::Seconds(20))));
    CreateVariables();
  });
  int rejected = 0;
  for (const absl::Status& s : r.verdicts) rejected += absl::IsFailedPrecondition(s) ? 1 : 0;
  EXPECT_GT(r.acknowledged, 0);
  EXPECT_EQ(rejected, kVariables) << "a forgetful coordinator passed the check";
}

// The step order check rejects a seeded epoch that starts again (what a
// forgetful coordinator does after a restart; on real processes its workers
// may not even get a step through, so the control is seeded here) and a step
// id that goes back, and passes steps that go on.
TEST(StepOrderCheck, RejectsAnEpochOrStepGoingBack_PassesStepsThatGoOn) {
  EXPECT_OK(StepsGoOn({{1, 1}, {2, 3}, {5, 4}}));
  EXPECT_THAT(StepsGoOn({{1, 1}, {2, 2}, {3, 1}}),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                "step 3 epoch 1 committed after step 2 epoch 2"));
  EXPECT_THAT(StepsGoOn({{4, 1}, {4, 2}}),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, "step 4 epoch 2"));
}

}  // namespace
}  // namespace repvar

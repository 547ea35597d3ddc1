// SPDX-License-Identifier: Apache-2.0
// A coordinator core driven by random operations (registrations, deaths,
// creates, initializes, assigns, deletes, steps, repairs, failing workers)
// from a seed, on a fake clock and fake workers: what the replay and
// storage tests run to reach every kind of record.
#ifndef REPVAR_TESTS_TESTING_RANDOM_CLUSTER_H_
#define REPVAR_TESTS_TESTING_RANDOM_CLUSTER_H_

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/coordinator.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_worker_client.h"
#include "tests/testing/step_waits.h"

namespace repvar::testing {

constexpr int kTasks = 4;
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(10);

class RandomCluster {
 public:
  // Commits go to `log` (a MemoryStateLog when null). `value_elements`:
  // the float32 elements of each variable.
  explicit RandomCluster(uint64_t seed, server::StateLog* log = nullptr, int value_elements = 3)
      : rng_(seed), n_(value_elements) {
    server::CoordinatorOptions options;
    options.membership.heartbeat_timeout = kHeartbeatTimeout;
    options.idempotency_capacity = 50;
    core_ = std::make_unique<server::Coordinator>(options, &clock_, &workers_,
                                                  log != nullptr ? log : &log_);
    for (auto& v : reported_) v = Value(n_);
  }

  // Registers the workers, then runs `operations` random operations.
  void Run(int operations) {
    Start();
    for (int i = 0; i < operations; ++i) Step();
  }
  void Start() {
    for (int i = 0; i < kTasks; ++i) Register(i);
  }
  // One random operation.
  void Step() {
    switch (Pick(12)) {
      case 0: {  // a worker goes silent and is declared dead, or comes back
        const int t = Pick(kTasks);
        if (core_->registry().Find({"tpu_worker", t})) {
          Pass(kHeartbeatTimeout / 2, t);
          Pass(kHeartbeatTimeout / 2 + absl::Seconds(1), t);
        } else {
          Register(t);
        }
        break;
      }
      case 1: {
        VariableDef def;
        def.name = Name();
        def.tensor = TensorSpec{DType::kFloat32, {n_}};
        def.replica_count = 1 + Pick(2 * kTasks);
        def.aggregation = Pick(2) ? Aggregation::kMean : Aggregation::kNone;
        Initializer init;
        init.kind = InitializerKind::kConstant;
        init.constant = Pick(10);
        (void)core_->CreateVariables({absl::StrCat("c", Pick(20)), 1}, {{def, init}});
        break;
      }
      case 2:
        (void)core_->Initialize({absl::StrCat("i", Pick(20)), 2}, {{Name(), std::nullopt}});
        break;
      case 3:
      case 4: {
        const AssignOp op = Pick(2) ? AssignOp::kAssign : AssignOp::kAdd;
        const std::string name = Name();
        const server::RequestKey key{absl::StrCat("a", Pick(30)), static_cast<uint64_t>(Pick(3))};
        auto done = core_->Assign(key, {name, op, Value(n_)});
        // A request id answered before gets that answer again (C6), which
        // may be of another variable: only a first answer counts.
        if (done.ok() && answered_keys_.insert({key.id, key.digest}).second) {
          if (auto v = core_->GetVariable(name); v.ok()) {
            answered_[v->id] = std::max(answered_[v->id], done->version);
          }
        }
        break;
      }
      case 5:
        (void)core_->DeleteVariable({absl::StrCat("d", Pick(20)), 3}, Name());
        break;
      case 6: {  // a worker fails its calls for a while
        const int t = Pick(kTasks);
        if (Pick(2)) {
          workers_.Fail(Task(t), absl::UnavailableError("down"));
        } else {
          workers_.Heal(Task(t));
        }
        break;
      }
      case 7:
        core_->ResyncStale();
        break;
      case 8:
      case 9:
      case 10:
        RunStep();
        break;
      default:
        Pass(absl::Seconds(1), -1);
        break;
    }
  }

  server::Coordinator& core() { return *core_; }
  // The highest version each variable (by id) was answered for by a write.
  const std::map<uint64_t, int64_t>& answered() const { return answered_; }
  std::string CoordinatorState() {
    return core_->registry().Read([](const server::ClusterState& s) { return s.Dump(); });
  }
  const std::vector<server::Record>& records() const { return log_.records(); }
  static server::ClusterStateOptions StateOptions() {
    return server::ClusterStateOptions{50, absl::Hours(1)};
  }

 private:
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  std::string Name() { return absl::StrCat("v", Pick(6)); }
  std::string Task(int t) { return absl::StrCat("tpu_worker:", t); }
  std::shared_ptr<const Tensor> Value(int n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(Pick(100));
    return std::make_shared<const Tensor>(
        *Tensor::FromBytes(TensorSpec{DType::kFloat32, {n}}, std::as_bytes(std::span(v))));
  }

  void Register(int t) {
    WorkerRegistration r{"tpu_worker", t, absl::StrCat("h", t, ":1"), ++incarnation_[t], {}};
    for (int d = 0; d < 2; ++d) {
      r.devices.push_back(absl::StrCat("/job:tpu_worker/replica:0/task:", t, "/device:TPU:", d));
    }
    (void)core_->RegisterWorker(r);
  }

  // Keeps every live worker but `silent` alive across `d`.
  void Pass(absl::Duration d, int silent) {
    for (int t = 0; t < kTasks; ++t) {
      if (t != silent) (void)core_->Heartbeat({"tpu_worker", t}, incarnation_[t]);
    }
    clock_.Advance(d);
    core_->Tick(clock_.Now());
  }

  // A replicated step driven as workers would: reports with some replicas
  // changed, the plan's finishes agreeing (or not), or an abort.
  void RunStep() {
    auto info = testing::BeginStep(*core_, ++step_, absl::Seconds(30));
    if (!info.ok()) return;
    if (Pick(6) == 0) {
      (void)core_->AbortStep(info->epoch, "test");
      return;
    }
    std::vector<std::vector<ReplicaReport>> changed(info->participants.size());
    for (size_t p = 0; p < info->participants.size(); ++p) {
      for (const StepVariable& v : info->variables) {
        for (size_t r = 0; r < v.replica_participant.size(); ++r) {
          if (v.replica_participant[r] == static_cast<int32_t>(p) && Pick(3) == 0) {
            changed[p].push_back(ReplicaReport{v.id, static_cast<int32_t>(r),
                                               reported_[Pick(kReported)]->checksum, -1});
          }
        }
      }
    }
    auto report = [&](size_t p, bool detailed) {
      WorkerReport r =
          SummarizeReport(info->variables, static_cast<int32_t>(p), changed[p], detailed);
      r.step = info->step;
      r.epoch = info->epoch;
      r.task = info->participants[p].task;
      r.incarnation = info->participants[p].incarnation;
      (void)core_->ReportStep(r);
    };
    for (size_t p = 0; p < info->participants.size(); ++p) report(p, false);
    auto plan = testing::PlanNow(*core_, info->epoch);
    if (plan.ok() && std::holds_alternative<StepPlan>(*plan) &&
        std::get<StepPlan>(*plan).send_detail) {
      for (size_t p = 0; p < info->participants.size(); ++p) report(p, true);
      plan = testing::PlanNow(*core_, info->epoch, /*detailed=*/true);
    }
    if (!plan.ok() || !std::holds_alternative<StepPlan>(*plan)) return;
    const StepPlan& p = std::get<StepPlan>(*plan);
    // The value the workers agree on, a real tensor: installed on them when
    // the step commits, so that later reads and writes find it there.
    const std::shared_ptr<const Tensor> agreed_value = Value(n_);
    const uint64_t agreed = agreed_value->checksum;
    // What each changed variable ends with: the repair's value, else the
    // reduction's (`agreed`).
    std::map<uint32_t, uint64_t> repaired;
    for (const StepCollective& c : p.collectives) {
      if (c.kind == StepCollective::Kind::kBroadcast)
        repaired[c.variables.bounds()[0]] = c.checksum;
    }
    for (size_t w = 0; w < info->participants.size(); ++w) {
      const StepParticipant& part = info->participants[w];
      std::vector<PreparedVariable> values;
      p.changed.ForEach([&](uint32_t i) {
        const StepVariable& v = info->variables[i];
        if (std::find(v.replica_participant.begin(), v.replica_participant.end(),
                      static_cast<int32_t>(w)) == v.replica_participant.end()) {
          return;
        }
        uint64_t sum = agreed;
        if (auto r = repaired.find(i); r != repaired.end()) {
          sum = r->second;
        } else if (v.aggregation != Aggregation::kSum && v.aggregation != Aggregation::kMean) {
          // Agreed at the barrier: the value every replica reported.
          for (const auto& rr : changed[w]) {
            if (rr.variable_id == v.id) sum = rr.checksum;
          }
        }
        if (Pick(20) == 0) sum ^= 1;  // a worker that disagrees fails the step
        values.push_back(PreparedVariable{v.id, sum, -1, -1});
      });
      WorkerFinish finish = SummarizeFinish(info->variables, static_cast<int32_t>(w), values);
      finish.step = info->step;
      finish.epoch = info->epoch;
      finish.task = part.task;
      finish.incarnation = part.incarnation;
      (void)core_->FinishStep(finish);
    }
    auto resolution = testing::ResolutionNow(*core_, info->epoch);
    if (!resolution.ok() || resolution->state != StepState::kCommitted) return;
    for (const CommittedVariable& c : resolution->changed) {
      std::shared_ptr<const Tensor> value = c.checksum == agreed ? agreed_value : nullptr;
      for (const auto& t : reported_) {
        if (t->checksum == c.checksum) value = t;
      }
      if (value == nullptr) continue;  // a repair's value, not a real tensor here
      for (const StepVariable& v : info->variables) {
        if (v.id != c.variable_id) continue;
        for (size_t r = 0; r < v.replica_participant.size(); ++r) {
          if (v.replica_participant[r] < 0) continue;
          workers_.Install(info->participants[v.replica_participant[r]].task.ToString(), v.id,
                           static_cast<int32_t>(r), c.version, *value);
        }
      }
    }
  }

  static constexpr int kReported = 3;
  std::mt19937_64 rng_;
  const int n_;
  // The values workers report for NONE and ONLY_FIRST_REPLICA variables.
  std::array<std::shared_ptr<const Tensor>, kReported> reported_;
  repvar::testing::FakeClock clock_;
  repvar::testing::FakeWorkerClient workers_;
  server::MemoryStateLog log_;
  std::unique_ptr<server::Coordinator> core_;
  std::map<int, uint64_t> incarnation_;
  std::map<uint64_t, int64_t> answered_;
  std::set<std::pair<std::string, uint64_t>> answered_keys_;  // request keys answered OK
  int64_t step_ = 0;
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_RANDOM_CLUSTER_H_

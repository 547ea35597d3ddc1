// SPDX-License-Identifier: Apache-2.0
// One commit point: random sequences of operations (registrations, deaths,
// creates, initializes, assigns, deletes, steps, repairs, failing workers)
// run against the coordinator core; the records it committed, replayed into
// an empty ClusterState, give exactly the state the coordinator holds. If
// any code changed the state outside Apply, or applied something it did not
// log, the replay would differ; the negative controls show the comparison
// notices a record altered or left out.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/core/coordinator.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_worker_client.h"
#include "tests/testing/status_matchers.h"

namespace repvar::server {
namespace {

constexpr int kTasks = 4;
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(10);

class RandomCluster {
 public:
  explicit RandomCluster(uint64_t seed) : rng_(seed) {
    CoordinatorOptions options;
    options.membership.heartbeat_timeout = kHeartbeatTimeout;
    options.dedup_capacity = 50;
    core_ = std::make_unique<Coordinator>(options, &clock_, &workers_, &log_);
  }

  void Run(int operations) {
    for (int i = 0; i < kTasks; ++i) Register(i);
    for (int i = 0; i < operations; ++i) Step();
  }

  std::string CoordinatorState() {
    return core_->registry().Read([](const ClusterState& s) { return s.Dump(); });
  }
  const std::vector<Record>& records() const { return log_.records(); }
  static ClusterStateOptions StateOptions() { return ClusterStateOptions{50, absl::Hours(1)}; }

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
        def.tensor = TensorSpec{DType::kFloat32, {3}};
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
        (void)core_->Assign({absl::StrCat("a", Pick(30)), static_cast<uint64_t>(Pick(3))},
                            {Name(), op, Value(3)});
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

  // A replicated step driven as workers would: reports with some replicas
  // changed, the plan's finishes agreeing (or not), or an abort.
  void RunStep() {
    auto info = core_->BeginStep(++step_, absl::Seconds(30));
    if (!info.ok()) return;
    if (Pick(6) == 0) {
      (void)core_->AbortStep(info->epoch, "test");
      return;
    }
    for (size_t p = 0; p < info->participants.size(); ++p) {
      WorkerReport report{info->step,
                          info->epoch,
                          info->participants[p].task,
                          info->participants[p].incarnation,
                          {}};
      for (const StepVariable& v : info->variables) {
        for (size_t r = 0; r < v.replica_participant.size(); ++r) {
          if (v.replica_participant[r] == static_cast<int32_t>(p) && Pick(3) == 0) {
            report.replicas.push_back(ReplicaReport{v.id, static_cast<int32_t>(r),
                                                    static_cast<uint64_t>(1 + Pick(3)), -1});
          }
        }
      }
      (void)core_->ReportStep(report);
    }
    auto plan = core_->WaitStepPlan(info->epoch, absl::InfinitePast());
    if (!plan.ok() || !std::holds_alternative<StepPlan>(*plan)) return;
    const StepPlan& p = std::get<StepPlan>(*plan);
    const uint64_t agreed = 1000 + Pick(1000);
    for (const StepParticipant& part : info->participants) {
      WorkerFinish finish{info->step, info->epoch, part.task, part.incarnation, {}, ""};
      for (size_t c = 0; c < p.changed_ids.size(); ++c) {
        uint64_t sum = p.changed_checksums[c] != 0 ? p.changed_checksums[c] : agreed;
        if (Pick(20) == 0) sum ^= 1;  // a worker that disagrees fails the step
        finish.variables.push_back(PreparedVariable{p.changed_ids[c], sum, -1, -1});
      }
      (void)core_->FinishStep(finish);
    }
  }

  std::mt19937_64 rng_;
  repvar::testing::FakeClock clock_;
  repvar::testing::FakeWorkerClient workers_;
  MemoryStateLog log_;
  std::unique_ptr<Coordinator> core_;
  std::map<int, uint64_t> incarnation_;
  int64_t step_ = 0;
};

std::string Replay(const std::vector<Record>& records) {
  ClusterState replayed(RandomCluster::StateOptions());
  for (const Record& r : records) replayed.Apply(r);
  return replayed.Dump();
}

TEST(ReplayTest, OneCommitPoint_ReplayingTheRecordsGivesTheSameState) {
  std::set<size_t> kinds;  // of the changes recorded, over all seeds
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    RandomCluster cluster(seed);
    cluster.Run(300);
    ASSERT_GT(cluster.records().size(), 20u) << "seed " << seed;
    EXPECT_EQ(Replay(cluster.records()), cluster.CoordinatorState()) << "seed " << seed;
    for (const Record& r : cluster.records()) {
      for (const Change& c : r.changes) kinds.insert(c.index());
    }
  }
  // The operations reached every kind of change there is.
  EXPECT_EQ(kinds.size(), std::variant_size_v<Change>);
}

// Negative controls: the comparison notices a record altered or left out.
TEST(ReplayTest, NegativeControl_AnAlteredRecordIsNoticed) {
  int controls = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    RandomCluster cluster(seed);
    cluster.Run(300);
    std::vector<Record> records = cluster.records();
    // Alter the last committed value of a variable that still exists.
    std::set<uint64_t> deleted;
    ValueCommitted* last = nullptr;
    for (Record& r : records) {
      for (Change& c : r.changes) {
        if (auto* d = std::get_if<VariableDeleted>(&c)) deleted.insert(d->id);
        if (auto* v = std::get_if<ValueCommitted>(&c)) last = v;
      }
    }
    if (last == nullptr || deleted.contains(last->id)) continue;
    last->checksum ^= 0xdead;
    EXPECT_NE(Replay(records), cluster.CoordinatorState()) << "seed " << seed;
    ++controls;
  }
  EXPECT_GT(controls, 0);
}

TEST(ReplayTest, NegativeControl_ARecordLeftOutIsNoticed) {
  RandomCluster cluster(8);
  cluster.Run(300);
  std::vector<Record> records = cluster.records();
  // Leave out the tail up to the last record that changes what the state
  // shows (a failed step's record changes nothing: it only closes an epoch).
  while (!records.empty()) {
    const Record last = records.back();
    records.pop_back();
    const bool visible = std::any_of(last.changes.begin(), last.changes.end(), [](const Change& c) {
      return !std::holds_alternative<StepFailed>(c);
    });
    if (visible) break;
  }
  EXPECT_NE(Replay(records), cluster.CoordinatorState());
}

}  // namespace
}  // namespace repvar::server

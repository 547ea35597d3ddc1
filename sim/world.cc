// SPDX-License-Identifier: Apache-2.0
#include "sim/world.h"

#include <cstdio>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sim/client_node.h"
#include "sim/coordinator_node.h"
#include "sim/trainer_node.h"
#include "sim/worker_node.h"

namespace repvar::sim {
namespace {

uint64_t Mix(uint64_t digest, const std::string& line) {
  uint64_t h = digest ^ 0x9e3779b97f4a7c15;
  for (char c : line) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3;
  return h;
}

// The nemesis strikes within the workload's first seconds.
// The first lines of what the live threads wait for (a liveness failure's
// detail; --verbose prints them all).
std::string WaitingSummary(const std::vector<std::string>& lines) {
  constexpr size_t kShown = 6;
  std::vector<std::string> shown(lines.begin(), lines.begin() + std::min(lines.size(), kShown));
  if (lines.size() > kShown) shown.push_back(absl::StrCat("and ", lines.size() - kShown, " more"));
  return absl::StrJoin(shown, "; ");
}

std::string Holders(const server::Holders& holders) {
  std::vector<std::string> out;
  for (const server::Holder& h : holders.listed)
    out.push_back(absl::StrCat(h.replica, "@", h.incarnation % 10000));
  if (holders.all_but) return absl::StrCat("all but ", absl::StrJoin(holders.missing, ","));
  return absl::StrJoin(out, ",");
}

// One line per record for a replay (`--verbose`); not part of the digest.
std::string Describe(const server::Record& record) {
  std::vector<std::string> parts;
  for (const server::Change& c : record.changes) {
    parts.push_back(std::visit(
        [](const auto& x) -> std::string {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, server::ValueCommitted>) {
            return absl::StrCat("committed id ", x.id, " v", x.version, " #", x.checksum % 10000,
                                " on [", Holders(x.holders), "]");
          } else if constexpr (std::is_same_v<T, server::ReplicasWritten>) {
            return absl::StrCat("written id ", x.id, " v", x.version, " #", x.checksum % 10000,
                                " on [", Holders(x.holders), "]");
          } else if constexpr (std::is_same_v<T, server::WritePrepared>) {
            std::string s = absl::StrCat("prepared fence ", x.fence);
            for (const auto& v : x.values) {
              absl::StrAppend(&s, " id ", v.id, " v", v.version, " #", v.checksum % 10000);
            }
            return s;
          } else if constexpr (std::is_same_v<T, server::WriteResolved>) {
            return absl::StrCat("resolved fence ", x.fence);
          } else if constexpr (std::is_same_v<T, server::WorkerRegistered>) {
            return absl::StrCat("registered ", x.task.ToString(), " @", x.incarnation % 10000);
          } else if constexpr (std::is_same_v<T, server::WorkerDied>) {
            return absl::StrCat("died ", x.task.ToString(), " @", x.incarnation % 10000);
          } else if constexpr (std::is_same_v<T, server::WorkerJoined>) {
            return absl::StrCat("joined ", x.task.ToString(), " @", x.incarnation % 10000);
          } else if constexpr (std::is_same_v<T, server::ValueKept>) {
            return absl::StrCat("kept id ", x.id, " v", x.version);
          } else if constexpr (std::is_same_v<T, server::ResyncFlagged>) {
            return absl::StrCat("resync id ", x.id, " ", x.needs_resync);
          } else if constexpr (std::is_same_v<T, server::StepCommitted>) {
            return absl::StrCat("step ", x.step, " committed");
          } else if constexpr (std::is_same_v<T, server::StepBegun>) {
            return absl::StrCat("step ", x.step, " begun");
          } else if constexpr (std::is_same_v<T, server::StepFailed>) {
            return absl::StrCat("step ", x.step, " failed");
          } else {
            return std::string(typeid(T).name());
          }
        },
        c));
  }
  return absl::StrJoin(parts, "; ");
}

// A value a step committed lives on the replicas alone (the coordinator
// keeps no copy): when every replica that held it was lost, so is it, and
// the coordinator says so (none up to date). Not a failure to converge.
bool LostWithItsReplicas(const server::VariableRecord& v) {
  if (v.version == 0 || v.value != nullptr) return false;
  for (size_t i = 0; i < v.replica_count(); ++i) {
    if (v.StateOf(i) == ReplicaState::kUpToDate) return false;
  }
  return true;
}

constexpr absl::Duration kStormWindow = absl::Seconds(4);
// Once healed, the cluster settles within a few of its longest timeouts
// (a data-plane collective's, a call's).
constexpr absl::Duration kConvergeWithin = absl::Minutes(5);

}  // namespace

World::World(WorldOptions options)
    : options_(options),
      random_(options.seed),
      scheduler_(&random_),
      network_(&scheduler_, &random_),
      disk_(&scheduler_, &random_, [this] { OnSyncError(); }),
      hub_(&scheduler_, &network_),
      mirror_(std::make_unique<server::ClusterState>()) {
  disk_.OnAppend([this](const server::Record& r) {
    mirror_->Apply(r);
    ++mirror_changes_;
    if (options_.verbose) Trace(absl::StrCat("record: ", Describe(r)));
  });
  hub_.SetTrace([this](const std::string& line) { Trace(line); });
  local_reads_ = options_.local_reads >= 0 ? options_.local_reads == 1 : random_.Uniform(2) == 1;
  coordinator_ = std::make_unique<CoordinatorNode>(this);
  for (int t = 0; t < options_.workers; ++t) {
    workers_.push_back(
        std::make_unique<WorkerNode>(this, t + 1, "tpu_worker", t, options_.devices_per_worker));
  }
  for (int c = 0; c < options_.clients; ++c) {
    clients_.push_back(std::make_unique<ClientNode>(this, options_.workers + 1 + c, c));
  }
  if (options_.steps > 0) {
    trainers_ = std::make_unique<TrainerNode>(this, options_.workers + options_.clients + 1);
  }
}

World::~World() = default;

WorkerNode* World::WorkerAt(NodeId node) {
  if (node < 1 || node > static_cast<int>(workers_.size())) return nullptr;
  return workers_[node - 1].get();
}

void World::Log(const std::string& line) {
  const std::string stamped = absl::StrCat(
      absl::FormatDuration(scheduler_.Now() - absl::FromUnixSeconds(1'700'000'000)), " ", line);
  log_digest_ = Mix(log_digest_, stamped);
  if (options_.verbose) std::fprintf(stderr, "%s\n", stamped.c_str());
}

void World::Trace(const std::string& line) {
  if (!options_.verbose) return;
  std::fprintf(
      stderr, "%s   %s\n",
      absl::FormatDuration(scheduler_.Now() - absl::FromUnixSeconds(1'700'000'000)).c_str(),
      line.c_str());
}

void World::Fail(const std::string& invariant, const std::string& detail) {
  if (failure_) return;
  failure_ = std::pair{invariant, detail};
  Log(absl::StrCat("INVARIANT BROKEN: ", invariant, ": ", detail));
}

void World::CrashCoordinator() {
  coordinator_->Crash();
  disk_.Crash();
  // The state the next coordinator recovers: what the disk kept.
  mirror_ = std::make_unique<server::ClusterState>();
  for (const server::Record& r : disk_.records()) mirror_->Apply(r);
  ++mirror_changes_;
}

void World::OnSyncError() {
  Log("the state log's sync failed (EIO): the coordinator exits");
  // The crash is done from outside: this thread stops with its process, so
  // it must not wait on anything (its process's locks never hand over).
  scheduler_.At(supervisor_, scheduler_.Now(), [this] {
    CrashCoordinator();
    // As a supervisor (systemd's Restart=always) would.
    scheduler_.At(supervisor_,
                  scheduler_.Now() + random_.Between(absl::Milliseconds(100), absl::Seconds(2)),
                  [this] {
                    Log("the supervisor restarts the coordinator");
                    if (!coordinator_->up()) coordinator_->Start();
                  });
  });
  scheduler_.Halt();
}

void World::StartCluster() {
  supervisor_ = scheduler_.NewProcess("supervisor");
  coordinator_->Start();
  for (auto& w : workers_) w->Start();
}

bool World::RunPhase(absl::FunctionRef<bool()> done, absl::Duration limit) {
  const Scheduler::Stop stop = scheduler_.Run(
      [&] {
        CheckAfterEvent();
        return done();
      },
      scheduler_.Now() + limit);
  return stop == Scheduler::Stop::kDone;
}

SeedResult World::Run() {
  StartCluster();
  const int accelerators = options_.workers * options_.devices_per_worker;
  Log("SETUP");
  clients_[0]->StartSetup(options_.variables, trainers_ ? options_.step_variables : 0,
                          accelerators);
  if (!RunPhase([&] { return clients_[0]->done(); }, absl::Minutes(5))) {
    Fail("liveness",
         absl::StrCat("setup did not finish; waiting: ", WaitingSummary(scheduler_.Waiting())));
    return Result();
  }
  Log("STORM");
  const ProcessId nemesis = scheduler_.NewProcess("nemesis");
  PlanNemesis(nemesis);
  for (auto& c : clients_) c->StartWorkload(options_.ops_per_client);
  if (trainers_) trainers_->StartWorkload(options_.steps);
  auto clients_done = [&] {
    for (auto& c : clients_) {
      if (!c->done()) return false;
    }
    return !trainers_ || trainers_->done();
  };
  if (!RunPhase(clients_done, options_.time_limit)) {
    Fail("liveness", absl::StrCat("the workload did not finish; waiting: ",
                                  WaitingSummary(scheduler_.Waiting())));
    return Result();
  }
  Log("HEAL");
  scheduler_.Kill(nemesis);
  Heal();
  Log("CONVERGE");
  if (!RunPhase([&] { return Converged(); }, kConvergeWithin)) {
    Fail("liveness", absl::StrCat("the cluster did not converge after healing: ", unconverged_));
    if (options_.verbose) {
      for (const std::string& w : scheduler_.Waiting())
        std::fprintf(stderr, "  waiting: %s\n", w.c_str());
    }
  }
  CheckAtEnd();
  return Result();
}

SeedResult World::Result() {
  SeedResult r;
  r.seed = options_.seed;
  r.ok = !failure_.has_value();
  if (failure_) {
    r.invariant = failure_->first;
    r.detail = failure_->second;
  }
  r.digest = Mix(log_digest_ ^ scheduler_.digest(), absl::StrCat(scheduler_.steps()));
  r.steps = scheduler_.steps();
  r.simulated = scheduler_.Now() - absl::FromUnixSeconds(1'700'000'000);
  return r;
}

void World::PlanNemesis(ProcessId nemesis) {
  const absl::Time start = scheduler_.Now();
  for (int i = 0; i < options_.faults; ++i) {
    const absl::Time at = start + random_.Between(absl::ZeroDuration(), kStormWindow);
    const int kind = static_cast<int>(random_.Uniform(9));
    const int w = static_cast<int>(random_.Uniform(workers_.size()));
    const absl::Duration lasting = random_.Between(absl::Milliseconds(100), absl::Seconds(3));
    scheduler_.At(nemesis, at,
                  [this, nemesis, kind, w, lasting] { Strike(nemesis, kind, w, lasting); });
  }
}

void World::Strike(ProcessId nemesis, int kind, int w, absl::Duration lasting) {
  if (kind < 4) return StrikeProcess(nemesis, kind, w, lasting);
  if (kind < 7) return StrikeNetwork(nemesis, kind, w, lasting);
  if (kind == 8) return RegistrationStorm(nemesis, lasting);
  Log(absl::StrCat("nemesis: the state log fails its next sync"));
  DiskFaults f;
  f.sync_error = 1;
  disk_.SetFaults(f);
  scheduler_.At(nemesis, scheduler_.Now() + absl::Milliseconds(1), [this] { disk_.SetFaults({}); });
}

void World::StrikeProcess(ProcessId nemesis, int kind, int w, absl::Duration lasting) {
  const absl::Time until = scheduler_.Now() + lasting;
  WorkerNode& worker = *workers_[w];
  const bool coordinator = kind == 0 || kind == 3;
  if (coordinator ? !coordinator_->up() : !worker.up()) return;
  if (kind == 0) {
    Log("nemesis: crash the coordinator");
    CrashCoordinator();
    scheduler_.At(nemesis, until, [this] {
      if (!coordinator_->up()) coordinator_->Start();
    });
  } else if (kind == 1) {
    Log(absl::StrCat("nemesis: crash worker ", w));
    worker.Crash();
    scheduler_.At(nemesis, until, [&worker] {
      if (!worker.up()) worker.Start();
    });
  } else if (kind == 2) {
    Log(absl::StrCat("nemesis: pause worker ", w, " for ", absl::FormatDuration(lasting)));
    scheduler_.Pause(worker.process(), until);
  } else {
    Log(absl::StrCat("nemesis: pause the coordinator for ", absl::FormatDuration(lasting)));
    scheduler_.Pause(coordinator_->process(), until);
  }
}

void World::RegistrationStorm(ProcessId nemesis, absl::Duration lasting) {
  Log("nemesis: crash every worker; all restart together");
  for (auto& w : workers_) {
    if (w->up()) w->Crash();
  }
  scheduler_.At(nemesis, scheduler_.Now() + lasting, [this] {
    for (auto& w : workers_) {
      if (!w->up()) w->Start();
    }
  });
}

void World::StrikeNetwork(ProcessId nemesis, int kind, int w, absl::Duration lasting) {
  const absl::Time until = scheduler_.Now() + lasting;
  if (kind == 4) {
    Log(absl::StrCat("nemesis: cut worker ", w, " off for ", absl::FormatDuration(lasting)));
    network_.Partition({workers_[w]->node()});
    scheduler_.At(nemesis, until, [this] { network_.Heal(); });
    return;
  }
  NetworkFaults f = network_.faults();
  if (kind == 5) {
    f.loss = random_.Between(1, 20) / 100.0;
    f.duplicate = random_.Between(1, 20) / 100.0;
    Log(absl::StrCat("nemesis: lossy network (", f.loss, " lost, ", f.duplicate,
                     " duplicated) for ", absl::FormatDuration(lasting)));
  } else {
    // Congestion: messages arrive seconds late, some after their callers
    // gave up (a write landing after its failure).
    f.min_delay = absl::Milliseconds(1);
    f.max_delay = random_.Between(absl::Milliseconds(500), absl::Seconds(8));
    Log(absl::StrCat("nemesis: slow network (up to ", absl::FormatDuration(f.max_delay), ") for ",
                     absl::FormatDuration(lasting)));
  }
  network_.SetFaults(f);
  scheduler_.At(nemesis, until, [this] { network_.SetFaults({}); });
}

void World::Heal() {
  network_.Heal();
  network_.SetFaults({});
  disk_.SetFaults({});
  if (coordinator_->up()) scheduler_.Resume(coordinator_->process());
  if (!coordinator_->up()) coordinator_->Start();
  for (auto& w : workers_) {
    if (w->up()) scheduler_.Resume(w->process());
    if (!w->up()) w->Start();
  }
}

bool World::Converged() {
  server::Coordinator* core = coordinator_->core();
  if (core == nullptr) {
    unconverged_ = "the coordinator does not serve";
    return false;
  }
  for (auto& w : workers_) {
    const server::WorkerRecord* r = mirror_->Worker(w->task());
    if (!w->up() || r == nullptr || !r->IsLive() || r->joining ||
        r->incarnation != w->incarnation()) {
      unconverged_ = absl::StrCat("worker ", w->task().task, " is not listed live");
      return false;
    }
  }
  for (const auto& [id, v] : mirror_->variables()) {
    if (v.version == 0 || LostWithItsReplicas(v)) continue;
    for (size_t i = 0; i < v.replica_count(); ++i) {
      const server::ReplicaRecord rep = mirror_->Replica(v, i);
      if (rep.state != ReplicaState::kUpToDate || rep.version != v.version ||
          rep.checksum != v.checksum) {
        unconverged_ = absl::StrCat(v.def.name, "/", i, " is not up to date");
        return false;
      }
      WorkerNode* w = WorkerAt(NodeOfTask(v.placement[i].task));
      worker::ReplicaStore* store = w == nullptr ? nullptr : w->store();
      auto held = store == nullptr ? absl::NotFoundError("no store")
                                   : store->Get(id, static_cast<int32_t>(i)).status();
      if (!held.ok()) {
        unconverged_ = absl::StrCat(v.def.name, "/", i, " is not held: ", held.ToString());
        return false;
      }
    }
  }
  return true;
}

void World::CheckAfterEvent() {
  ReplicaTruthInputs(inputs_);
  if (inputs_ == checked_inputs_) return;
  std::swap(inputs_, checked_inputs_);
  CheckReplicaTruth();
}

void World::ReplicaTruthInputs(std::vector<uint64_t>& inputs) {
  inputs.clear();
  inputs.push_back(mirror_changes_);
  for (const auto& w : workers_) {
    worker::ReplicaStore* store = w->store();
    worker::StepTable* steps = w->steps();
    inputs.push_back(reinterpret_cast<uintptr_t>(store));
    inputs.push_back(w->incarnation());
    inputs.push_back(store == nullptr ? 0 : store->Changes());
    inputs.push_back(steps != nullptr && steps->Settling() ? 1 : 0);
  }
}

void World::CheckReplicaTruth() {
  // F7: a replica recorded up to date by a worker's incarnation is held by
  // that incarnation at the recorded version (or a newer one on its way).
  for (const auto& [id, v] : mirror_->variables()) {
    for (size_t i = 0; i < v.replica_count(); ++i) {
      const server::ReplicaRecord rep = mirror_->Replica(v, i);
      if (rep.state != ReplicaState::kUpToDate) continue;
      WorkerNode* w = WorkerAt(NodeOfTask(v.placement[i].task));
      if (w == nullptr || !w->up() || w->incarnation() != rep.incarnation) continue;
      worker::ReplicaStore* store = w->store();
      if (store == nullptr) continue;
      // A step it took part in may be committed and not installed yet.
      if (w->steps() != nullptr && w->steps()->Settling()) continue;
      auto held = store->Get(id, static_cast<int32_t>(i));
      if (!held.ok() || held->version < rep.version ||
          (held->version == rep.version && held->checksum != rep.checksum)) {
        Fail("F7 replica truth",
             absl::StrCat(v.def.name, "/", i, " is recorded up to date at version ", rep.version,
                          " (checksum ", rep.checksum, ") but its worker holds ",
                          held.ok() ? absl::StrCat("version ", held->version, " (checksum ",
                                                   held->checksum, ")")
                                    : held.status().ToString()));
        return;
      }
    }
  }
}

void World::CheckAtEnd() {
  if (!failed()) CheckReplicasAtRest();
  if (absl::Status s = history_.Check(); !s.ok()) {
    Fail("C4 linearizability", std::string(s.message()));
  }
  bool local = false;
  if (absl::Status s = step_reads_.Check(local); !s.ok()) {
    Fail(local ? "C8 local step reads" : "C4 step reads", std::string(s.message()));
  }
}

void World::CheckReplicasAtRest() {
  // F7 once nothing is in flight: every replica holds exactly the
  // committed version and checksum (no newer value of a write that was
  // cut off, which CheckReplicaTruth must allow while writes travel).
  for (const auto& [id, v] : mirror_->variables()) {
    if (v.version == 0) continue;
    if (LostWithItsReplicas(v)) {
      Log(absl::StrCat(v.def.name, ": its committed value was lost with every replica holding it"));
      continue;
    }
    for (size_t i = 0; i < v.replica_count(); ++i) {
      WorkerNode* w = WorkerAt(NodeOfTask(v.placement[i].task));
      worker::ReplicaStore* store = w == nullptr ? nullptr : w->store();
      if (store == nullptr) continue;
      auto held = store->Get(id, static_cast<int32_t>(i));
      if (!held.ok() || held->version != v.version || held->checksum != v.checksum) {
        Fail("F7 replica truth (at rest)",
             absl::StrCat(v.def.name, "/", i, " is committed at version ", v.version, " (checksum ",
                          v.checksum, ") but its worker holds ",
                          held.ok() ? absl::StrCat("version ", held->version, " (checksum ",
                                                   held->checksum, ")")
                                    : held.status().ToString()));
        return;
      }
    }
  }
}

}  // namespace repvar::sim

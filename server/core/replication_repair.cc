// SPDX-License-Identifier: Apache-2.0
// Repair (F2, F7): verifying what workers hold against the committed state,
// fenced off from every earlier write, and rewriting what differs. The
// writes of Replication are in replication.cc (initialize in
// initialize.cc), its reads in reads.cc.
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/metrics.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"
#include "server/core/core_metrics.h"
#include "server/core/replication.h"
#include "server/core/replication_internal.h"
#include "spdlog/spdlog.h"

namespace repvar::server {

// ---- Repair ----

std::vector<uint64_t> Replication::IdsOn(const TaskKey& task) const {
  return registry_->Read([&](const ClusterState& state) {
    std::vector<uint64_t> out;
    for (const auto& [id, v] : state.variables()) {
      for (const Placement& p : v.placement) {
        if (p.task == task) {
          out.push_back(id);
          break;
        }
      }
    }
    return out;
  });
}

void Replication::ResyncTask(const TaskKey& task) {
  std::optional<LiveTask> live = registry_->Find(task);
  if (!live) return;
  const WorkerTarget target{task, live->address, live->incarnation};
  std::vector<uint64_t> ids = IdsOn(task);
  if (ids.empty()) return;
  WriteLocks locks(this, ids);
  std::vector<ReplicaWrite> writes;
  for (uint64_t id : ids) {
    auto [name, stale] = registry_->Read([&](const ClusterState& state) {
      std::pair<std::string, std::vector<int32_t>> out;
      const VariableRecord* v = state.FindId(id);
      if (v == nullptr || v->version == 0) return out;
      out.first = v->def.name;
      for (size_t i = 0; i < v->placement.size(); ++i) {
        if (v->placement[i].task == task && v->StateOf(i) == ReplicaState::kStale) {
          out.second.push_back(static_cast<int32_t>(i));
        }
      }
      return out;
    });
    if (stale.empty()) continue;
    // The committed value first (a step may have left only replicas holding it).
    absl::StatusOr<ReadResult> r = CommittedValue(id);
    if (!r.ok()) {
      spdlog::warn("resync of {} on {}: {}", name, task.ToString(), r.status().ToString());
      continue;
    }
    writes.push_back(ReplicaWrite{id, name, r->version, std::move(stale), r->value});
  }
  if (writes.empty()) return;
  // A fence above every write sent before: one of those still in flight can
  // no longer land on top of this repair.
  absl::StatusOr<uint64_t> fence = registry_->NextFence();
  if (!fence.ok()) {
    spdlog::error("resync of {}: {}", task.ToString(), fence.status().ToString());
    return;
  }
  for (ReplicaWrite& w : writes) w.fence = *fence;
  CallGroup call(1);
  workers_->WriteReplicasAsync(target, writes, call.Callback(0));
  if (absl::Status s = call.Wait()[0]; !s.ok()) {
    spdlog::warn("resync of {} replica set(s) on {} failed: {}", writes.size(), task.ToString(),
                 s.ToString());
    return;
  }
  absl::Status s = registry_
                       ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
                         Record record;
                         for (const ReplicaWrite& w : writes) {
                           const VariableRecord* v = state.FindId(w.variable_id);
                           if (v == nullptr) continue;
                           std::vector<Holder> holders;
                           for (int32_t r : w.replicas)
                             holders.push_back(Holder{r, target.incarnation});
                           holders = LiveHolders(state, *v, holders);
                           if (holders.empty()) continue;
                           record.changes.push_back(ReplicasWritten{
                               w.variable_id, w.version, w.value->checksum, std::move(holders)});
                         }
                         return record;
                       })
                       .status();
  if (!s.ok()) {
    spdlog::error("cannot record the resync of {}: {}", task.ToString(), s.ToString());
    return;
  }
  static Counter& resynced = Metrics::Global().GetCounter(
      "repvar_resyncs_total", "replica sets rewritten from the committed value by repair");
  resynced.Add(writes.size());
  spdlog::info("resynced {} variable(s) on {}", writes.size(), task.ToString());
}

namespace {

// Waits for one ListReplicasAsync.
absl::StatusOr<std::vector<WorkerClient::HeldReplica>> ListNow(WorkerClient* workers,
                                                               const WorkerTarget& target,
                                                               uint64_t fence_floor,
                                                               absl::Time deadline) {
  absl::StatusOr<std::vector<WorkerClient::HeldReplica>> got;
  CallGroup call(1);
  workers->ListReplicasAsync(target, fence_floor, deadline,
                             [&got, done = call.Callback(0)](
                                 absl::StatusOr<std::vector<WorkerClient::HeldReplica>> r) mutable {
                               got = std::move(r);
                               std::move(done)(absl::OkStatus());
                             });
  call.Wait();
  return got;
}

}  // namespace

absl::Status Replication::VerifyTask(const TaskKey& task, absl::Time deadline) {
  std::optional<LiveTask> live = registry_->Find(task);
  if (!live) return absl::FailedPreconditionError(absl::StrCat(task.ToString(), " is not live"));
  const WorkerTarget target{task, live->address, live->incarnation};
  // No write of ours to it is in flight while it lists (a write that was
  // cut off is: the fence keeps it from landing later).
  std::optional<WriteLocks> locks;
  if (!BugSeeded(SeededBug::kListedUnderWrites)) locks.emplace(this, IdsOn(task));
  REPVAR_ASSIGN_OR_RETURN(const uint64_t floor, registry_->NextFence());
  REPVAR_ASSIGN_OR_RETURN(std::vector<WorkerClient::HeldReplica> held,
                          ListNow(workers_, target, floor, deadline));
  return Reconcile(target, held);
}

absl::Status Replication::Reconcile(const WorkerTarget& target,
                                    const std::vector<WorkerClient::HeldReplica>& held) {
  std::map<std::pair<uint64_t, int32_t>, const WorkerClient::HeldReplica*> by;
  for (const WorkerClient::HeldReplica& h : held) by[{h.variable_id, h.replica}] = &h;
  std::set<uint64_t> gone;
  int demoted = 0;
  int promoted = 0;
  REPVAR_RETURN_IF_ERROR(
      registry_
          ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
            gone.clear();
            demoted = promoted = 0;
            if (!state.IsLive(target.task, target.incarnation)) {
              return absl::AbortedError(absl::StrCat(target.task.ToString(), " incarnation ",
                                                     target.incarnation, " is no longer live"));
            }
            for (const auto& [key, h] : by) {
              if (state.FindId(key.first) == nullptr) gone.insert(key.first);
            }
            Record record;
            for (const auto& [id, v] : state.variables()) {
              if (v.version == 0) continue;  // an initialize overwrites whatever is there
              std::map<std::pair<int64_t, uint64_t>, std::vector<Holder>> found;
              for (size_t i = 0; i < v.placement.size(); ++i) {
                if (v.placement[i].task != target.task) continue;
                auto it = by.find({id, static_cast<int32_t>(i)});
                const int64_t version = it == by.end() ? 0 : it->second->version;
                const uint64_t checksum = it == by.end() ? 0 : it->second->checksum;
                const bool holds =
                    version == v.version &&
                    (checksum == v.checksum || BugSeeded(SeededBug::kVerifyIgnoresChecksums));
                const ReplicaState state_now = v.StateOf(i);
                if ((state_now == ReplicaState::kUpToDate && !holds) ||
                    (state_now == ReplicaState::kStale && holds)) {
                  found[{version, checksum}].push_back(
                      Holder{static_cast<int32_t>(i), target.incarnation});
                  ++(holds ? promoted : demoted);
                }
              }
              for (auto& [vc, holders] : found) {
                record.changes.push_back(
                    ReplicasWritten{id, vc.first, vc.second, std::move(holders)});
              }
            }
            return record;
          })
          .status());
  if (demoted > 0) {
    static Counter& found = DivergencesRepaired("verification");
    found.Add(static_cast<uint64_t>(demoted));
    spdlog::warn("{} holds {} replica(s) other than the committed value; marked for repair",
                 target.task.ToString(), demoted);
  }
  if (promoted > 0) {
    spdlog::info("{} holds the committed value of {} stale replica(s)", target.task.ToString(),
                 promoted);
  }
  for (uint64_t id : gone) {
    spdlog::info("{} holds variable id {}, which does not exist; dropping it",
                 target.task.ToString(), id);
    workers_->DropVariableAsync(target, id, [task = target.task, id](absl::Status s) {
      if (!s.ok()) spdlog::warn("drop of id {} on {}: {}", id, task.ToString(), s.ToString());
    });
  }
  return absl::OkStatus();
}

void Replication::MarkUnverified(const TaskKey& task, uint64_t incarnation) {
  absl::Status s =
      registry_
          ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
            Record record;
            if (!state.IsLive(task, incarnation)) return record;
            for (const auto& [id, v] : state.variables()) {
              if (v.version == 0) continue;
              std::vector<Holder> holders;
              for (size_t i = 0; i < v.placement.size(); ++i) {
                if (v.placement[i].task == task && v.StateOf(i) == ReplicaState::kUpToDate) {
                  holders.push_back(Holder{static_cast<int32_t>(i), incarnation});
                }
              }
              if (!holders.empty())
                record.changes.push_back(ReplicasWritten{id, 0, 0, std::move(holders)});
            }
            return record;
          })
          .status();
  if (!s.ok()) spdlog::error("cannot mark {} unverified: {}", task.ToString(), s.ToString());
}

void Replication::Rejoin(const TaskKey& task) {
  std::optional<LiveTask> live = registry_->Find(task);
  if (!live) return;
  if (absl::Status s = VerifyTask(task, clock_->Now() + options_.verify_timeout); !s.ok()) {
    spdlog::warn("{} could not be verified ({}); its replicas are marked for repair",
                 task.ToString(), s.ToString());
    MarkUnverified(task, live->incarnation);
  }
  ResyncTask(task);
}

void Replication::VerifyAll() {
  const absl::Time deadline = clock_->Now() + options_.verify_timeout;
  std::vector<WorkerTarget> targets = registry_->Read([](const ClusterState& state) {
    std::vector<WorkerTarget> out;
    for (const auto& [key, w] : state.workers()) {
      if (w.IsLive()) out.push_back(WorkerTarget{key, w.address, w.incarnation});
    }
    return out;
  });
  if (targets.empty()) return;
  absl::StatusOr<uint64_t> floor = registry_->NextFence();
  if (!floor.ok()) {
    spdlog::error("cannot verify the workers: {}", floor.status().ToString());
    for (const WorkerTarget& t : targets) MarkUnverified(t.task, t.incarnation);
    return;
  }
  // All at once: a dead worker costs the deadline once, not once each.
  std::vector<absl::StatusOr<std::vector<WorkerClient::HeldReplica>>> got(targets.size());
  CallGroup calls(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    workers_->ListReplicasAsync(
        targets[i], *floor, deadline,
        [&got, i, done = calls.Callback(i)](
            absl::StatusOr<std::vector<WorkerClient::HeldReplica>> r) mutable {
          got[i] = std::move(r);
          std::move(done)(absl::OkStatus());
        });
  }
  calls.Wait();
  for (size_t i = 0; i < targets.size(); ++i) {
    absl::Status s = got[i].ok() ? Reconcile(targets[i], *got[i]) : got[i].status();
    if (!s.ok()) {
      spdlog::warn("{} could not be verified ({}); its replicas are marked for repair",
                   targets[i].task.ToString(), s.ToString());
      MarkUnverified(targets[i].task, targets[i].incarnation);
    }
  }
}

void Replication::RetryOwedDrops() {
  std::vector<std::pair<WorkerTarget, uint64_t>> drops;
  for (const auto& [task, ids] : registry_->OwedDrops()) {
    std::optional<LiveTask> live = registry_->Find(task);
    if (!live) continue;
    for (uint64_t id : ids)
      drops.emplace_back(WorkerTarget{task, live->address, live->incarnation}, id);
  }
  CallGroup calls(drops.size());
  for (size_t i = 0; i < drops.size(); ++i) {
    workers_->DropVariableAsync(drops[i].first, drops[i].second, calls.Callback(i));
  }
  std::vector<absl::Status> statuses = calls.Wait();
  for (size_t i = 0; i < drops.size(); ++i) {
    if (statuses[i].ok()) registry_->DropConfirmed(drops[i].first.task, drops[i].second);
  }
}

void Replication::ResyncStale() {
  RetryOwedDrops();
  std::set<uint64_t> suspect;
  {
    RankedLock lock(&mu_);
    suspect.swap(suspect_);
  }
  // What needs repair and what is suspect, not every variable: the pass
  // runs every few seconds under the registry's lock.
  std::set<TaskKey> tasks = registry_->Read([&](const ClusterState& state) {
    std::set<TaskKey> out;
    auto add_tasks = [&](const VariableRecord& v, bool every_replica) {
      for (size_t i = 0; i < v.placement.size(); ++i) {
        const WorkerRecord* w = state.LiveWorker(v.placement[i].task);
        if (w == nullptr) continue;
        if (every_replica || v.needs_resync || v.StateOf(i) == ReplicaState::kStale) {
          out.insert(v.placement[i].task);
        }
      }
    };
    for (uint64_t id : state.needing_repair()) add_tasks(*state.FindId(id), false);
    for (uint64_t id : suspect) {
      if (const VariableRecord* v = state.FindId(id)) add_tasks(*v, true);
    }
    return out;
  });
  std::set<TaskKey> verified;
  bool all_verified = true;
  for (const TaskKey& t : tasks) {
    if (absl::Status s = VerifyTask(t, clock_->Now() + options_.verify_timeout); !s.ok()) {
      spdlog::warn("repair cannot verify {}: {}", t.ToString(), s.ToString());
      all_verified = false;
      continue;
    }
    verified.insert(t);
    ResyncTask(t);
  }
  absl::Status s = registry_
                       ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
                         Record record;
                         for (uint64_t id : state.needing_repair()) {
                           const VariableRecord& v = *state.FindId(id);
                           if (!v.needs_resync) continue;
                           bool clean = true;
                           for (size_t i = 0; i < v.placement.size() && clean; ++i) {
                             const WorkerRecord* w = state.LiveWorker(v.placement[i].task);
                             if (w == nullptr) continue;  // resynced on return
                             clean = v.StateOf(i) != ReplicaState::kStale &&
                                     verified.contains(v.placement[i].task);
                           }
                           if (clean) record.changes.push_back(ResyncFlagged{id, false});
                         }
                         return record;
                       })
                       .status();
  if (!s.ok()) spdlog::error("cannot record cleared resync flags: {}", s.ToString());
  if (!all_verified) {
    RankedLock lock(&mu_);
    suspect_.insert(suspect.begin(), suspect.end());  // ask again next time
  }
}

}  // namespace repvar::server

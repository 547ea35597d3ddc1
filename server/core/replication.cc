// SPDX-License-Identifier: Apache-2.0
#include "server/core/replication.h"

#include <algorithm>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_util.h"
#include "common/tensor/element_math.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

// A collective's timeout: a base plus time for its bytes.
absl::Duration CollectiveTimeout(uint64_t bytes) {
  return absl::Seconds(30) + absl::Seconds(static_cast<double>(bytes) / 50e6);
}

// Holders still live under the incarnation that acknowledged: an
// acknowledgement from a worker declared dead since is not recorded.
std::vector<Holder> LiveHolders(const ClusterState& state, const VariableRecord& v,
                                const std::vector<Holder>& holders) {
  std::vector<Holder> out;
  for (const Holder& h : holders) {
    if (state.IsLive(v.placement[h.replica].task, h.incarnation)) out.push_back(h);
  }
  return out;
}

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("variable \"", name, "\" does not exist"));
}

}  // namespace

// Takes the write locks of variables in id order, so that batches never
// deadlock, before any ranked lock (lock_order.h).
class Replication::WriteLocks {
 public:
  WriteLocks(Replication* r, std::vector<uint64_t> ids) {
    RankedMutex::AssertNoneHeld("variable write locks");
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (uint64_t id : ids) mutexes_.push_back(r->WriteLockOf(id));
    for (auto& mu : mutexes_) locks_.push_back(std::make_unique<absl::MutexLock>(mu.get()));
  }

 private:
  std::vector<std::shared_ptr<absl::Mutex>> mutexes_;
  std::vector<std::unique_ptr<absl::MutexLock>> locks_;  // destroyed first
};

Replication::Replication(ReplicationOptions options, Clock* clock, Registry* registry,
                         StepCoordinator* steps, CollectiveGroups* groups, WorkerClient* workers,
                         MemoryBudget* budget)
    : options_(options),
      clock_(clock),
      registry_(registry),
      steps_(steps),
      groups_(groups),
      workers_(workers),
      budget_(budget) {}

std::shared_ptr<absl::Mutex> Replication::WriteLockOf(uint64_t id) {
  RankedLock lock(&mu_);
  auto& mu = write_locks_[id];
  if (mu == nullptr) mu = std::make_shared<absl::Mutex>();
  return mu;
}

absl::StatusOr<uint64_t> Replication::IdOf(absl::string_view name) const {
  return registry_->Read([&](const ClusterState& s) -> absl::StatusOr<uint64_t> {
    const VariableRecord* v = s.Find(name);
    if (v == nullptr) return NotFound(name);
    return v->id;
  });
}

// ---- Delivery ----

absl::StatusOr<Replication::Delivery> Replication::Deliver(
    const std::vector<PlannedWrite>& writes) {
  // Room for the record before anything leaves: a full disk refuses the
  // write here, with nothing changed anywhere.
  uint64_t value_bytes = 0;
  for (const PlannedWrite& w : writes) value_bytes += w.value->bytes.size();
  REPVAR_RETURN_IF_ERROR(registry_->CheckRoom(value_bytes));
  REPVAR_ASSIGN_OR_RETURN(const uint64_t fence, registry_->NextFence());
  // Group the replicas each live worker holds.
  struct Batch {
    WorkerTarget target;
    std::vector<ReplicaWrite> writes;
  };
  std::vector<Batch> batches = registry_->Read([&](const ClusterState& state) {
    std::map<TaskKey, Batch> per_task;
    for (const PlannedWrite& w : writes) {
      const VariableRecord* v = state.FindId(w.id);
      if (v == nullptr) continue;
      std::map<TaskKey, std::vector<int32_t>> replicas;
      for (size_t i = 0; i < v->placement.size(); ++i) {
        const WorkerRecord* worker = state.Worker(v->placement[i].task);
        if (worker != nullptr && worker->state == WorkerState::kLive) {
          replicas[v->placement[i].task].push_back(static_cast<int32_t>(i));
        }
      }
      for (auto& [task, idx] : replicas) {
        Batch& b = per_task[task];
        const WorkerRecord& worker = *state.Worker(task);
        b.target = WorkerTarget{task, worker.address, worker.incarnation};
        b.writes.push_back(ReplicaWrite{w.id, w.name, w.version, std::move(idx), w.value, fence});
      }
    }
    std::vector<Batch> out;
    for (auto& [task, b] : per_task) out.push_back(std::move(b));
    return out;
  });

  auto fan_out = [&]() -> std::vector<absl::Status> {
    CallGroup calls(batches.size());
    for (size_t i = 0; i < batches.size(); ++i) {
      workers_->WriteReplicasAsync(batches[i].target, batches[i].writes, calls.Callback(i));
    }
    return calls.Wait();
  };
  // The data plane carries single large writes to enough workers (during a
  // step the workers' data plane belongs to the step's collectives).
  bool collective = options_.data_plane && batches.size() >= 2 &&
                    batches.size() >= static_cast<size_t>(options_.data_plane_min_workers);
  for (const Batch& b : batches) {
    collective = collective && b.writes.size() == 1 &&
                 b.writes[0].value->bytes.size() >= options_.data_plane_min_bytes;
  }
  collective = collective && !steps_->IsOpen();
  // Large values go to the state log's blob files while the workers take
  // them (one thread for all; joined before the record is committed), so the
  // commit only syncs the record.
  std::thread stage;
  std::vector<std::shared_ptr<const Tensor>> to_stage;
  for (const PlannedWrite& w : writes) {
    if (w.value->bytes.size() >= options_.stage_min_bytes) to_stage.push_back(w.value);
  }
  if (!to_stage.empty()) {
    stage = std::thread([this, to_stage] {
      for (const auto& v : to_stage) {
        if (absl::Status s = registry_->Stage(*v); !s.ok()) {
          spdlog::debug("staging a value failed ({}); the record writes it", s.ToString());
        }
      }
    });
  }
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{stage};
  std::vector<absl::Status> statuses;
  if (collective) {
    std::vector<GroupMember> members;
    for (const Batch& b : batches) members.push_back({b.target.task, b.target.incarnation});
    (void)groups_->RunBroadcast(members, [&](const std::string& group, uint32_t tag) {
      const int32_t size = static_cast<int32_t>(batches.size());
      for (size_t i = 0; i < batches.size(); ++i) {
        batches[i].writes[0].collective =
            CollectiveSpec{group, static_cast<int32_t>(i),
                           size,  /*root=*/0,
                           tag,   CollectiveTimeout(batches[0].writes[0].value->bytes.size())};
      }
      statuses = fan_out();
      for (const absl::Status& s : statuses) REPVAR_RETURN_IF_ERROR(s);
      return absl::OkStatus();
    });
  } else {
    statuses = fan_out();
  }

  Delivery d;
  for (size_t i = 0; i < batches.size(); ++i) {
    const WorkerTarget& t = batches[i].target;
    if (!statuses[i].ok()) {
      d.failures.push_back(absl::StrCat(t.task.ToString(), ": ", statuses[i].ToString()));
      // Whether it holds the new version, the old one or neither is unknown.
      for (const ReplicaWrite& w : batches[i].writes) {
        for (int32_t r : w.replicas) d.unknown[w.variable_id].push_back(Holder{r, t.incarnation});
      }
      continue;
    }
    for (const ReplicaWrite& w : batches[i].writes) {
      for (int32_t r : w.replicas) d.holders[w.variable_id].push_back(Holder{r, t.incarnation});
    }
  }
  return d;
}

absl::Status Replication::CommitWrites(const std::vector<PlannedWrite>& writes,
                                       const Delivery& delivery,
                                       const std::map<uint64_t, Initializer>& initializers,
                                       std::optional<RequestRecorded> outcome) {
  const bool delivered = delivery.failures.empty();
  absl::Status committed =
      registry_->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
        Record record;
        for (const PlannedWrite& w : writes) {
          const VariableRecord* v = state.FindId(w.id);
          if (v == nullptr) continue;
          auto h = delivery.holders.find(w.id);
          std::vector<Holder> holders = LiveHolders(
              state, *v, h == delivery.holders.end() ? std::vector<Holder>{} : h->second);
          if (delivered) {
            auto init = initializers.find(w.id);
            record.changes.push_back(ValueCommitted{
                w.id, w.version, w.value->checksum, w.value, std::move(holders),
                init == initializers.end() ? std::nullopt
                                           : std::optional<Initializer>(init->second)});
            if (v->needs_resync) record.changes.push_back(ResyncFlagged{w.id, false});
          } else {
            // The replicas that got it now hold an uncommitted version: they are
            // STALE, not silently ahead.
            if (!holders.empty()) {
              record.changes.push_back(
                  ReplicasWritten{w.id, w.version, w.value->checksum, std::move(holders)});
            }
            // The replicas that did not answer may hold either value (the
            // answer may be what was lost): STALE too, until repair
            // rewrites them with a higher fence and checks what they hold.
            auto u = delivery.unknown.find(w.id);
            if (u != delivery.unknown.end() && v->version > 0) {
              std::vector<Holder> unknown = LiveHolders(state, *v, u->second);
              if (!unknown.empty()) {
                record.changes.push_back(ReplicasWritten{w.id, 0, 0, std::move(unknown)});
              }
            }
            record.changes.push_back(ResyncFlagged{w.id, true});
          }
        }
        if (delivered && outcome) record.changes.push_back(*std::move(outcome));
        return record;
      });
  if (!committed.ok()) {
    // The workers took values the log could not record (a disk that filled
    // after CheckRoom): the records still name the old ones. Repair asks.
    RankedLock lock(&mu_);
    for (const PlannedWrite& w : writes) suspect_.insert(w.id);
    return committed;
  }
  if (delivered) return absl::OkStatus();
  std::vector<std::string> names;
  for (const PlannedWrite& w : writes) names.push_back(w.name);
  return absl::UnavailableError(
      absl::StrCat("write of ", absl::StrJoin(names, ", "), " did not reach every live replica (",
                   absl::StrJoin(delivery.failures, "; "),
                   "); the committed version is unchanged and the variable is marked for resync; "
                   "retry with the same request_id"));
}

// ---- Initialize ----

absl::StatusOr<std::vector<InitializeResult>> Replication::Initialize(
    const RequestKey& key, const std::vector<InitializeItem>& items) {
  if (items.empty()) return absl::InvalidArgumentError("initialize needs at least one variable");
  std::vector<uint64_t> ids;
  for (const InitializeItem& item : items) {
    REPVAR_ASSIGN_OR_RETURN(uint64_t id, IdOf(item.name));
    ids.push_back(id);
  }
  WriteLocks locks(this, ids);
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> cached, registry_->Outcome(key, "initialize"));
  if (cached) return std::get<std::vector<InitializeResult>>(*cached);

  // Who still needs a value, with which initializer (the first caller wins).
  struct Todo {
    std::string name;
    Initializer initializer;
    TensorSpec spec;
    bool allow_nonfinite = false;
  };
  REPVAR_ASSIGN_OR_RETURN(
      auto todo,
      registry_->Read([&](const ClusterState& state) -> absl::StatusOr<std::map<uint64_t, Todo>> {
        std::map<uint64_t, Todo> out;
        for (size_t i = 0; i < items.size(); ++i) {
          const VariableRecord* v = state.FindId(ids[i]);
          if (v == nullptr) {
            return absl::NotFoundError(
                absl::StrCat("variable \"", items[i].name, "\" was deleted"));
          }
          if (v->version > 0 || out.contains(v->id)) continue;
          out[v->id] = Todo{v->def.name, items[i].initializer.value_or(v->initializer),
                            v->def.tensor, v->def.allow_nonfinite};
        }
        return out;
      }));
  std::vector<PlannedWrite> writes;
  std::map<uint64_t, Initializer> initializers;  // those given with this call
  std::vector<bool> now(items.size(), false);    // this call initializes item i
  MemoryCharge charge(budget_);                  // the values, while they are sent
  for (size_t i = 0; i < items.size(); ++i) {
    auto t = todo.find(ids[i]);
    if (t == todo.end()) continue;  // initialized already, or earlier in this batch
    REPVAR_ASSIGN_OR_RETURN(int64_t bytes, t->second.spec.ByteSize());
    REPVAR_RETURN_IF_ERROR(charge.Add(static_cast<uint64_t>(bytes),
                                      absl::StrCat("the initial value of ", items[i].name)));
    auto value = MakeInitialValue(t->second.initializer, t->second.spec);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("variable ", items[i].name, ": ", value.status().message()));
    }
    if (!t->second.allow_nonfinite) {
      if (int64_t bad = FirstNonFinite(*value); bad >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable ", items[i].name, ": initial value has a non-finite element at ",
                         bad, " (allow_nonfinite is off)"));
      }
    }
    if (items[i].initializer) initializers[ids[i]] = *items[i].initializer;
    writes.push_back(
        PlannedWrite{ids[i], t->second.name, 1, std::make_shared<const Tensor>(*std::move(value))});
    now[i] = true;
    todo.erase(t);
  }
  REPVAR_ASSIGN_OR_RETURN(const Delivery delivery, Deliver(writes));
  // The answer, as it is once the writes commit.
  std::map<uint64_t, const PlannedWrite*> planned;
  for (const PlannedWrite& w : writes) planned[w.id] = &w;
  std::vector<InitializeResult> results;
  REPVAR_RETURN_IF_ERROR(registry_->Read([&](const ClusterState& state) -> absl::Status {
    for (size_t i = 0; i < items.size(); ++i) {
      if (auto w = planned.find(ids[i]); w != planned.end()) {
        results.push_back(InitializeResult{items[i].name, now[i], w->second->version,
                                           w->second->value->checksum});
        continue;
      }
      const VariableRecord* v = state.FindId(ids[i]);
      if (v == nullptr) return NotFound(items[i].name);
      results.push_back(InitializeResult{items[i].name, false, v->version, v->checksum});
    }
    return absl::OkStatus();
  }));
  REPVAR_RETURN_IF_ERROR(CommitWrites(writes, delivery, initializers,
                                      RequestRecorded{key, "initialize", results, clock_->Now()}));
  return results;
}

// ---- Assign ----

absl::StatusOr<std::vector<WriteResult>> Replication::Assign(const RequestKey& key,
                                                             const std::vector<Assignment>& items) {
  if (items.empty()) return absl::InvalidArgumentError("assign needs at least one variable");
  REPVAR_RETURN_IF_ERROR(steps_->EnterWriteGate());
  struct Leave {
    StepCoordinator* steps;
    ~Leave() { steps->LeaveWriteGate(); }
  } leave{steps_};
  std::vector<uint64_t> ids;
  std::set<absl::string_view> names;
  for (const Assignment& item : items) {
    if (!names.insert(item.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", item.name, " appears twice in one batched assign"));
    }
    REPVAR_ASSIGN_OR_RETURN(uint64_t id, IdOf(item.name));
    ids.push_back(id);
  }
  WriteLocks locks(this, ids);
  const absl::string_view op = items.size() == 1 ? "assign" : "assign_batch";
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> cached, registry_->Outcome(key, op));
  if (cached) {
    std::vector<WriteResult> results;
    for (const WriteOutcome& w : std::get<std::vector<WriteOutcome>>(*cached)) {
      results.push_back(WriteResult{w.version, w.checksum, nullptr});
    }
    return results;
  }

  // The write locks are held: versions and values cannot move under us.
  struct Target {
    int64_t version = 0;
    bool allow_nonfinite = false;
  };
  std::vector<Target> targets;
  REPVAR_RETURN_IF_ERROR(registry_->Read([&](const ClusterState& state) -> absl::Status {
    for (size_t i = 0; i < items.size(); ++i) {
      const Assignment& item = items[i];
      const VariableRecord* v = state.FindId(ids[i]);
      if (v == nullptr) {
        return absl::NotFoundError(absl::StrCat("variable \"", item.name, "\" was deleted"));
      }
      if (item.value == nullptr) return absl::InvalidArgumentError("assign without a value");
      if (!(item.value->spec == v->def.tensor)) {
        return absl::FailedPreconditionError(
            absl::StrCat("variable ", item.name, " is ", v->def.tensor.ToString(),
                         "; the value is ", item.value->spec.ToString()));
      }
      if (item.op != AssignOp::kAssign && v->version == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("variable ", item.name,
                         " is uninitialized; assign or initialize it before adding to it"));
      }
      if (!v->def.allow_nonfinite) {
        if (int64_t bad = FirstNonFinite(*item.value); bad >= 0) {
          return absl::InvalidArgumentError(absl::StrCat("variable ", item.name,
                                                         ": non-finite value at element ", bad,
                                                         " (allow_nonfinite is off)"));
        }
      }
      targets.push_back(Target{v->version + 1, v->def.allow_nonfinite});
    }
    return absl::OkStatus();
  }));
  // C3: the new value is computed once, from the committed value (fetched
  // from a replica when a step changed it).
  std::vector<PlannedWrite> writes;
  MemoryCharge charge(budget_);  // the results computed here, while they are sent
  for (size_t i = 0; i < items.size(); ++i) {
    const Assignment& item = items[i];
    std::shared_ptr<const Tensor> value = item.value;
    if (item.op != AssignOp::kAssign) {
      REPVAR_RETURN_IF_ERROR(
          charge.Add(item.value->bytes.size(),
                     absl::StrCat("the result of ", AssignOpName(item.op), " to ", item.name)));
      REPVAR_ASSIGN_OR_RETURN(ReadResult base, CommittedValue(ids[i]));
      REPVAR_ASSIGN_OR_RETURN(
          Tensor sum, AddScaled(*base.value, *item.value, item.op == AssignOp::kAdd ? 1 : -1));
      if (!targets[i].allow_nonfinite) {
        if (int64_t bad = FirstNonFinite(sum); bad >= 0) {
          return absl::InvalidArgumentError(absl::StrCat("variable ", item.name,
                                                         ": the result is non-finite at element ",
                                                         bad, "; nothing changed"));
        }
      }
      value = std::make_shared<const Tensor>(std::move(sum));
    }
    writes.push_back(PlannedWrite{ids[i], item.name, targets[i].version, std::move(value)});
  }
  REPVAR_ASSIGN_OR_RETURN(const Delivery delivery, Deliver(writes));
  std::vector<WriteOutcome> answer;
  for (const PlannedWrite& w : writes) answer.push_back(WriteOutcome{w.version, w.value->checksum});
  REPVAR_RETURN_IF_ERROR(CommitWrites(
      writes, delivery, {}, RequestRecorded{key, std::string(op), answer, clock_->Now()}));
  std::vector<WriteResult> results;
  for (const PlannedWrite& w : writes) {
    results.push_back(WriteResult{w.version, w.value->checksum, w.value});
  }
  return results;
}

// ---- Reads ----

absl::StatusOr<ReadResult> Replication::Read(absl::string_view name) {
  REPVAR_ASSIGN_OR_RETURN(uint64_t id, IdOf(name));
  return CommittedValue(id);
}

absl::StatusOr<ReadResult> Replication::CommittedValue(uint64_t id) {
  struct Source {
    int32_t replica;
    WorkerTarget target;
  };
  int64_t version = 0;
  uint64_t checksum = 0;
  std::string name;
  std::vector<Source> sources;  // up-to-date replicas, primary first
  std::optional<ReadResult> kept;
  REPVAR_RETURN_IF_ERROR(registry_->Read([&](const ClusterState& state) -> absl::Status {
    const VariableRecord* v = state.FindId(id);
    if (v == nullptr)
      return absl::NotFoundError(absl::StrCat("variable id ", id, " does not exist"));
    if (v->version == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "variable ", v->def.name, " is uninitialized; initialize or assign it first"));
    }
    version = v->version;
    checksum = v->checksum;
    name = v->def.name;
    if (v->value != nullptr) {
      kept = ReadResult{v->version, v->value};
      return absl::OkStatus();
    }
    for (size_t i = 0; i < v->placement.size(); ++i) {
      if (v->replicas[i].state != ReplicaState::kUpToDate) continue;
      const WorkerRecord& w = *state.Worker(v->placement[i].task);
      sources.push_back(Source{static_cast<int32_t>(i), {w.task, w.address, w.incarnation}});
    }
    return absl::OkStatus();
  }));
  if (kept) return *kept;
  {
    RankedLock lock(&mu_);
    auto it = fetched_.find(id);
    if (it != fetched_.end() && it->second.version == version) return it->second;
  }
  std::string last_error = "no up-to-date replica is live";
  for (const Source& source : sources) {
    absl::StatusOr<WorkerClient::ReplicaValue> got;
    CallGroup call(1);
    workers_->ReadReplicaAsync(
        source.target, id, source.replica, version,
        [&got, done = call.Callback(0)](absl::StatusOr<WorkerClient::ReplicaValue> r) mutable {
          got = std::move(r);
          std::move(done)(absl::OkStatus());
        });
    call.Wait();
    if (!got.ok()) {
      last_error = absl::StrCat(source.target.task.ToString(), ": ", got.status().ToString());
      continue;
    }
    if (got->version != version || got->value->checksum != checksum) {
      last_error = absl::StrCat(source.target.task.ToString(), " holds version ", got->version);
      continue;
    }
    ReadResult r{version, got->value};
    RankedLock lock(&mu_);
    fetched_[id] = r;
    return r;
  }
  return absl::UnavailableError(
      absl::StrCat("variable ", name, ": no up-to-date replica could be read (", last_error, ")"));
}

// ---- Delete ----

absl::Status Replication::Delete(const RequestKey& key, absl::string_view name) {
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> cached, registry_->Outcome(key, "delete"));
  if (cached) return absl::OkStatus();
  REPVAR_ASSIGN_OR_RETURN(uint64_t id, IdOf(name));
  if (std::optional<int64_t> step = steps_->OpenStepOf(id)) {
    return absl::FailedPreconditionError(absl::StrCat("variable ", name,
                                                      " takes part in the open step ", *step,
                                                      "; delete it after the step resolves"));
  }
  std::vector<WorkerTarget> holders;
  {
    WriteLocks locks(this, {id});  // waits for an in-flight write
    REPVAR_RETURN_IF_ERROR(
        registry_->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
          const VariableRecord* v = state.FindId(id);
          if (v == nullptr) return NotFound(name);
          std::set<TaskKey> tasks;
          for (const Placement& p : v->placement) tasks.insert(p.task);
          for (const TaskKey& t : tasks) {
            const WorkerRecord* w = state.Worker(t);
            if (w != nullptr && w->state == WorkerState::kLive) {
              holders.push_back(WorkerTarget{t, w->address, w->incarnation});
            }
          }
          return Record{{VariableDeleted{id}, RequestRecorded{key, "delete", {}, clock_->Now()}}};
        }));
    RankedLock lock(&mu_);
    fetched_.erase(id);
  }
  CallGroup drops(holders.size());
  for (size_t i = 0; i < holders.size(); ++i) {
    workers_->DropVariableAsync(holders[i], id, drops.Callback(i));
  }
  std::vector<absl::Status> statuses = drops.Wait();
  for (size_t i = 0; i < holders.size(); ++i) {
    if (!statuses[i].ok()) {
      spdlog::warn("drop of {} on {} failed: {}", std::string(name), holders[i].task.ToString(),
                   statuses[i].ToString());
    }
  }
  RankedLock lock(&mu_);
  write_locks_.erase(id);
  return absl::OkStatus();
}

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
        if (v->placement[i].task == task && v->replicas[i].state == ReplicaState::kStale) {
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
  absl::Status s = registry_->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
    Record record;
    for (const ReplicaWrite& w : writes) {
      const VariableRecord* v = state.FindId(w.variable_id);
      if (v == nullptr) continue;
      std::vector<Holder> holders;
      for (int32_t r : w.replicas) holders.push_back(Holder{r, target.incarnation});
      holders = LiveHolders(state, *v, holders);
      if (holders.empty()) continue;
      record.changes.push_back(
          ReplicasWritten{w.variable_id, w.version, w.value->checksum, std::move(holders)});
    }
    return record;
  });
  if (!s.ok()) {
    spdlog::error("cannot record the resync of {}: {}", task.ToString(), s.ToString());
    return;
  }
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
  WriteLocks locks(this, IdsOn(task));
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
  REPVAR_RETURN_IF_ERROR(registry_->Commit([&](const ClusterState& state)
                                               -> absl::StatusOr<Record> {
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
        const bool holds = version == v.version && checksum == v.checksum;
        const ReplicaState state_now = v.replicas[i].state;
        if ((state_now == ReplicaState::kUpToDate && !holds) ||
            (state_now == ReplicaState::kStale && holds)) {
          found[{version, checksum}].push_back(Holder{static_cast<int32_t>(i), target.incarnation});
          ++(holds ? promoted : demoted);
        }
      }
      for (auto& [vc, holders] : found) {
        record.changes.push_back(ReplicasWritten{id, vc.first, vc.second, std::move(holders)});
      }
    }
    return record;
  }));
  if (demoted > 0) {
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
  absl::Status s = registry_->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
    Record record;
    if (!state.IsLive(task, incarnation)) return record;
    for (const auto& [id, v] : state.variables()) {
      if (v.version == 0) continue;
      std::vector<Holder> holders;
      for (size_t i = 0; i < v.placement.size(); ++i) {
        if (v.placement[i].task == task && v.replicas[i].state == ReplicaState::kUpToDate) {
          holders.push_back(Holder{static_cast<int32_t>(i), incarnation});
        }
      }
      if (!holders.empty()) record.changes.push_back(ReplicasWritten{id, 0, 0, std::move(holders)});
    }
    return record;
  });
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
      if (w.state == WorkerState::kLive) out.push_back(WorkerTarget{key, w.address, w.incarnation});
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

void Replication::ResyncStale() {
  std::set<uint64_t> suspect;
  {
    RankedLock lock(&mu_);
    suspect.swap(suspect_);
  }
  std::set<TaskKey> tasks = registry_->Read([&](const ClusterState& state) {
    std::set<TaskKey> out;
    for (const auto& [id, v] : state.variables()) {
      for (size_t i = 0; i < v.placement.size(); ++i) {
        const WorkerRecord* w = state.Worker(v.placement[i].task);
        if (w == nullptr || w->state != WorkerState::kLive) continue;
        if (v.needs_resync || v.replicas[i].state == ReplicaState::kStale || suspect.contains(id)) {
          out.insert(v.placement[i].task);
        }
      }
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
  absl::Status s = registry_->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
    Record record;
    for (const auto& [id, v] : state.variables()) {
      if (!v.needs_resync) continue;
      bool clean = true;
      for (size_t i = 0; i < v.placement.size() && clean; ++i) {
        const WorkerRecord* w = state.Worker(v.placement[i].task);
        if (w == nullptr || w->state != WorkerState::kLive) continue;  // resynced on return
        clean =
            v.replicas[i].state != ReplicaState::kStale && verified.contains(v.placement[i].task);
      }
      if (clean) record.changes.push_back(ResyncFlagged{id, false});
    }
    return record;
  });
  if (!s.ok()) spdlog::error("cannot record cleared resync flags: {}", s.ToString());
  if (!all_verified) {
    RankedLock lock(&mu_);
    suspect_.insert(suspect.begin(), suspect.end());  // ask again next time
  }
}

}  // namespace repvar::server

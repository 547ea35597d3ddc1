// SPDX-License-Identifier: Apache-2.0
#include "server/core/replication.h"

#include <algorithm>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_util.h"
#include "common/tensor/element_math.h"
#include "server/core/replication_internal.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

// A collective's timeout: a base plus time for its bytes.
absl::Duration CollectiveTimeout(uint64_t bytes) {
  return absl::Seconds(30) + absl::Seconds(static_cast<double>(bytes) / 50e6);
}

// A recorded answer to an assign (C6), as results without values.
std::vector<WriteResult> Answered(const Answer& answer) {
  std::vector<WriteResult> results;
  for (const WriteOutcome& w : std::get<std::vector<WriteOutcome>>(answer)) {
    results.push_back(WriteResult{w.version, w.checksum, nullptr});
  }
  return results;
}

}  // namespace

Replication::Replication(ReplicationOptions options, Clock* clock, Registry* registry,
                         StateLog* log, StepCoordinator* steps, CollectiveGroups* groups,
                         WorkerClient* workers, MemoryBudget* budget)
    : options_(options),
      clock_(clock),
      registry_(registry),
      log_(log),
      steps_(steps),
      groups_(groups),
      workers_(workers),
      budget_(budget) {}

std::vector<std::shared_ptr<absl::Mutex>> Replication::WriteLocksOf(
    const std::vector<uint64_t>& ids) {
  std::vector<std::shared_ptr<absl::Mutex>> out;
  out.reserve(ids.size());
  RankedLock lock(&mu_);
  for (uint64_t id : ids) {
    auto& mu = write_locks_[id];
    if (mu == nullptr) mu = std::make_shared<absl::Mutex>();
    out.push_back(mu);
  }
  return out;
}

absl::StatusOr<uint64_t> Replication::IdOf(absl::string_view name) const {
  return registry_->Read([&](const ClusterState& s) { return IdIn(s, name); });
}

// ---- Delivery ----

absl::StatusOr<Replication::Delivery> Replication::Deliver(const std::vector<PlannedWrite>& writes,
                                                           const RequestRecorded* prepare) {
  // Room for the record before anything leaves: a full disk refuses the
  // write here, with nothing changed anywhere.
  uint64_t value_bytes = 0;
  for (const PlannedWrite& w : writes) value_bytes += w.value->bytes.size();
  REPVAR_RETURN_IF_ERROR(registry_->CheckRoom(prepare != nullptr ? 2 * value_bytes : value_bytes));
  REPVAR_ASSIGN_OR_RETURN(const uint64_t fence, registry_->NextFence());
  // The decision, before anything leaves; synced while the values travel.
  uint64_t prepared_at = 0;
  if (prepare != nullptr) {
    REPVAR_ASSIGN_OR_RETURN(
        prepared_at,
        registry_->Commit(
            [&](const ClusterState&) -> absl::StatusOr<Record> {
              WritePrepared p{fence, {}, *prepare};
              for (const PlannedWrite& w : writes) {
                p.values.push_back(PreparedValue{w.id, w.version, w.value->checksum, w.value});
              }
              return Record{{std::move(p)}};
            },
            Registry::Durability::kUnsynced));
  }
  absl::Status prepared_durable;
  // Group the replicas each live worker holds.
  struct Batch {
    WorkerTarget target;
    std::vector<ReplicaWrite> writes;
  };
  std::vector<Batch> batches = registry_->Peek([&](const ClusterState& state) {
    std::map<TaskKey, Batch> per_task;
    // The replicas on each live worker, per placement list; variables
    // created together share theirs, so a batch groups once per list, not
    // per write (as StepCoordinator::Describe finds each list's workers).
    struct Group {
      Batch* batch;
      std::vector<int32_t> replicas;
    };
    absl::flat_hash_map<const std::vector<Placement>*, std::vector<Group>> per_list;
    for (const PlannedWrite& w : writes) {
      const VariableRecord* v = state.FindId(w.id);
      if (v == nullptr) continue;
      auto [where, fresh] = per_list.try_emplace(&v->placement.list());
      std::vector<Group>& groups = where->second;
      if (fresh) {
        std::map<TaskKey, std::vector<int32_t>> replicas;
        for (size_t i = 0; i < v->placement.size(); ++i) {
          if (state.LiveWorker(v->placement[i].task) != nullptr) {
            replicas[v->placement[i].task].push_back(static_cast<int32_t>(i));
          }
        }
        for (auto& [task, idx] : replicas) {
          Batch& b = per_task[task];
          const WorkerRecord& worker = *state.Worker(task);
          b.target = WorkerTarget{task, worker.address, worker.incarnation};
          groups.push_back(Group{&b, std::move(idx)});
        }
      }
      for (const Group& g : groups) {
        g.batch->writes.push_back(
            ReplicaWrite{w.id, w.name, w.version, g.replicas, w.value, fence});
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
    // The WritePrepared's sync, on this thread while the workers take the
    // values (it leads the log's group commit or joins the one under way).
    if (prepared_at > 0) prepared_durable = registry_->AwaitDurable(prepared_at);
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
        if (absl::Status s = log_->Stage(*v); !s.ok()) {
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
  d.prepared = prepare != nullptr ? fence : 0;
  if (!prepared_durable.ok()) {
    d.failures.push_back(absl::StrCat("state log: ", prepared_durable.ToString()));
  }
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
  auto build = [&](const ClusterState& state) -> absl::StatusOr<Record> {
    Record record;
    for (const PlannedWrite& w : writes) {
      const VariableRecord* v = state.FindId(w.id);
      if (v == nullptr) continue;
      auto h = delivery.holders.find(w.id);
      std::vector<Holder> holders =
          LiveHolders(state, *v, h == delivery.holders.end() ? std::vector<Holder>{} : h->second);
      if (delivered) {
        auto init = initializers.find(w.id);
        record.changes.push_back(ValueCommitted{
            w.id, w.version, w.value->checksum, w.value, std::move(holders),
            init == initializers.end() ? std::nullopt : std::optional<Initializer>(init->second)});
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
    if (delivery.prepared != 0) record.changes.push_back(WriteResolved{delivery.prepared});
    return record;
  };
  // A prepared write that reached everyone was decided by its durable
  // WritePrepared: its commit is not waited for. A failure is, before the
  // caller hears of it (a restart must not roll the write forward then).
  absl::Status committed =
      registry_
          ->Commit(build, delivered && delivery.prepared != 0 ? Registry::Durability::kDecided
                                                              : Registry::Durability::kSynced)
          .status();
  // A durable WritePrepared that the log has no room to resolve would be
  // rolled forward by the next start, whatever its caller is told now:
  // stop, as a failed write does (the log stops the process itself then,
  // unless a test asked it not to), and let the restart resolve it (the
  // caller retries with its request id and gets the answer).
  REPVAR_CHECK_MSG(delivery.prepared == 0 || !absl::IsResourceExhausted(committed),
                   absl::StrCat("the write prepared with fence ", delivery.prepared,
                                " cannot be resolved in the state log (", committed.ToString(),
                                "); stopping so that a restart resolves it"));
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

// ---- Assign ----

absl::StatusOr<std::vector<WriteResult>> Replication::Assign(const RequestKey& key,
                                                             const std::vector<Assignment>& items) {
  if (items.empty()) return absl::InvalidArgumentError("assign needs at least one variable");
  const absl::string_view op = items.size() == 1 ? "assign" : "assign_batch";
  // C6 before anything that refuses new writes: the retry of a write that
  // was applied (its first answer lost, or too late for its caller) gets
  // that answer, even if a step opened since (S5) or the variable is gone.
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> earlier, registry_->Outcome(key, op));
  if (earlier) return Answered(*earlier);
  REPVAR_RETURN_IF_ERROR(steps_->EnterWriteGate());
  struct Leave {
    StepCoordinator* steps;
    ~Leave() { steps->LeaveWriteGate(); }
  } leave{steps_};
  // The decisions below read the state without waiting for it to be durable
  // (Registry::Peek): the commit at the end waits for all of it. A refusal
  // reports what was read, so it waits first.
  absl::StatusOr<std::vector<WriteResult>> done = AssignInGate(key, items, op);
  if (!done.ok()) {
    if (absl::Status durable = registry_->AwaitDurable(); !durable.ok()) return durable;
  }
  return done;
}

absl::StatusOr<std::vector<WriteResult>> Replication::AssignInGate(
    const RequestKey& key, const std::vector<Assignment>& items, absl::string_view op) {
  std::vector<uint64_t> ids;
  std::set<absl::string_view> names;
  for (const Assignment& item : items) {
    if (!names.insert(item.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", item.name, " appears twice in one batched assign"));
    }
    REPVAR_ASSIGN_OR_RETURN(
        uint64_t id, registry_->Peek([&](const ClusterState& s) { return IdIn(s, item.name); }));
    ids.push_back(id);
  }
  WriteLocks locks(this, ids);
  // Again under the locks: an attempt that was still running has finished.
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> earlier, registry_->Outcome(key, op));
  if (earlier) return Answered(*earlier);

  // The write locks are held: versions and values cannot move under us.
  struct Target {
    int64_t version = 0;
    bool allow_nonfinite = false;
    bool only_replicas = false;  // the committed value lives on the replicas alone
  };
  std::vector<Target> targets;
  REPVAR_RETURN_IF_ERROR(registry_->Peek([&](const ClusterState& state) -> absl::Status {
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
      targets.push_back(
          Target{v->version + 1, v->def.allow_nonfinite, v->version > 0 && v->value == nullptr});
    }
    return absl::OkStatus();
  }));
  // C3: the new value is computed once, from the committed value (fetched
  // from a replica when a step changed it).
  // A committed value only the replicas hold (a step changed it) is kept by
  // the coordinator before the write overwrites them: a write that fails or
  // is never recorded must not take it with it (F7).
  std::vector<PlannedWrite> writes;
  Record keep;
  MemoryCharge charge(budget_);  // the results computed here, while they are sent
  for (size_t i = 0; i < items.size(); ++i) {
    const Assignment& item = items[i];
    std::shared_ptr<const Tensor> value = item.value;
    std::optional<ReadResult> base;
    if (item.op != AssignOp::kAssign) {
      REPVAR_RETURN_IF_ERROR(
          charge.Add(item.value->bytes.size(),
                     absl::StrCat("the result of ", AssignOpName(item.op), " to ", item.name)));
      REPVAR_ASSIGN_OR_RETURN(base, CommittedValue(ids[i]));
    } else if (targets[i].only_replicas) {
      absl::StatusOr<ReadResult> read = CommittedValue(ids[i]);
      if (read.ok()) {
        base = *std::move(read);
      } else {
        // Nothing to keep: no replica can give it (the assign is how a
        // user gets the variable back).
        spdlog::warn("{}: the committed value cannot be read before it is overwritten: {}",
                     item.name, read.status().ToString());
      }
    }
    if (targets[i].only_replicas && base) {
      keep.changes.push_back(ValueKept{ids[i], base->version, base->value->checksum, base->value});
    }
    if (item.op != AssignOp::kAssign) {
      REPVAR_ASSIGN_OR_RETURN(
          Tensor sum, AddScaled(*base->value, *item.value, item.op == AssignOp::kAdd ? 1 : -1));
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
  if (!keep.empty()) {
    REPVAR_RETURN_IF_ERROR(registry_
                               ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
                                 Record record;
                                 for (const Change& c : keep.changes) {
                                   const ValueKept& k = std::get<ValueKept>(c);
                                   const VariableRecord* v = state.FindId(k.id);
                                   if (v != nullptr && v->version == k.version &&
                                       v->checksum == k.checksum) {
                                     record.changes.push_back(k);
                                   }
                                 }
                                 return record;
                               })
                               .status());
  }
  std::vector<WriteOutcome> answer;
  bool small = true;
  for (const PlannedWrite& w : writes) {
    answer.push_back(WriteOutcome{w.version, w.value->checksum});
    small = small && w.value->bytes.size() <= options_.prepare_max_bytes;
  }
  const RequestRecorded outcome{key, std::string(op), answer, clock_->Now()};
  REPVAR_ASSIGN_OR_RETURN(const Delivery delivery, Deliver(writes, small ? &outcome : nullptr));
  REPVAR_RETURN_IF_ERROR(CommitWrites(writes, delivery, {}, outcome));
  std::vector<WriteResult> results;
  for (const PlannedWrite& w : writes) {
    results.push_back(WriteResult{w.version, w.value->checksum, w.value});
  }
  return results;
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
    REPVAR_RETURN_IF_ERROR(registry_
                               ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
                                 const VariableRecord* v = state.FindId(id);
                                 if (v == nullptr) return VariableNotFound(name);
                                 std::set<TaskKey> tasks;
                                 for (const Placement& p : v->placement) tasks.insert(p.task);
                                 for (const TaskKey& t : tasks) {
                                   if (const WorkerRecord* w = state.LiveWorker(t)) {
                                     holders.push_back(WorkerTarget{t, w->address, w->incarnation});
                                   }
                                 }
                                 return Record{{VariableDeleted{id},
                                                RequestRecorded{key, "delete", {}, clock_->Now()}}};
                               })
                               .status());
    Cache(id, std::nullopt);
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
  spdlog::info("variable {} (id {}) deleted", std::string(name), id);
  return absl::OkStatus();
}

}  // namespace repvar::server

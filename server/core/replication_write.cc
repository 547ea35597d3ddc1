// SPDX-License-Identifier: Apache-2.0
// Replication's write path: assign (and the delivery initialize shares) and
// delete. docs/architecture.md, "The write path", walks through it.
#include <algorithm>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"
#include "common/tensor/element_math.h"
#include "server/core/replication.h"
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

uint64_t ValueBytes(const std::vector<PlannedWrite>& writes) {
  uint64_t bytes = 0;
  for (const PlannedWrite& w : writes) bytes += w.value->bytes.size();
  return bytes;
}

}  // namespace

// ---- Delivery ----

absl::StatusOr<Delivery> Replication::Deliver(const std::vector<PlannedWrite>& writes,
                                              const RequestRecorded* prepare) {
  REPVAR_ASSIGN_OR_RETURN(const uint64_t fence, MakeRoomForWrite(writes, prepare != nullptr));
  REPVAR_ASSIGN_OR_RETURN(const uint64_t prepared_at, Prepare(writes, fence, prepare));
  std::vector<WriteBatch> batches = registry_->Peek(
      [&](const ClusterState& state) { return GroupByWorker(state, writes, fence); });
  Notification staged;
  StageValues(writes, &staged);
  // The commit that follows finds the values staged.
  absl::Cleanup wait_staged = [&staged] { staged.WaitForNotification(); };
  absl::Status prepared_durable;
  std::vector<absl::Status> statuses =
      UseDataPlane(batches) ? FanOutOverDataPlane(batches, prepared_at, &prepared_durable)
                            : FanOut(batches, prepared_at, &prepared_durable);
  return FoldAnswers(batches, statuses, prepared_durable, prepare != nullptr ? fence : 0);
}

absl::StatusOr<uint64_t> Replication::MakeRoomForWrite(const std::vector<PlannedWrite>& writes,
                                                       bool prepared) {
  // A prepared write's values are in two records: its WritePrepared and
  // its commit.
  const uint64_t value_bytes = ValueBytes(writes);
  REPVAR_RETURN_IF_ERROR(registry_->CheckRoom(prepared ? 2 * value_bytes : value_bytes));
  return registry_->NextFence();
}

absl::StatusOr<uint64_t> Replication::Prepare(const std::vector<PlannedWrite>& writes,
                                              uint64_t fence, const RequestRecorded* prepare) {
  if (prepare == nullptr) return 0;
  return registry_->Commit(
      [&](const ClusterState&) -> absl::StatusOr<Record> {
        WritePrepared p{fence, {}, *prepare};
        for (const PlannedWrite& w : writes) {
          p.values.push_back(PreparedValue{w.id, w.version, w.value->checksum, w.value});
        }
        return Record{{std::move(p)}};
      },
      Registry::Durability::kUnsynced);
}

bool Replication::UseDataPlane(const std::vector<WriteBatch>& batches) const {
  if (!options_.data_plane || batches.size() < 2 ||
      batches.size() < static_cast<size_t>(options_.data_plane_min_workers)) {
    return false;
  }
  for (const WriteBatch& b : batches) {
    if (b.writes.size() != 1 || b.writes[0].value->bytes.size() < options_.data_plane_min_bytes) {
      return false;
    }
  }
  return !steps_->IsOpen();
}

void Replication::StageValues(const std::vector<PlannedWrite>& writes, Notification* staged) {
  std::vector<std::shared_ptr<const Tensor>> to_stage;
  for (const PlannedWrite& w : writes) {
    if (w.value->bytes.size() >= options_.stage_min_bytes) to_stage.push_back(w.value);
  }
  if (to_stage.empty()) {
    staged->Notify();
    return;
  }
  stagers_.Schedule([this, to_stage = std::move(to_stage), staged] {
    for (const auto& v : to_stage) {
      if (absl::Status s = log_->Stage(*v); !s.ok()) {
        spdlog::debug("staging a value failed ({}); the record writes it", s.ToString());
      }
    }
    staged->Notify();
  });
}

std::vector<absl::Status> Replication::FanOut(const std::vector<WriteBatch>& batches,
                                              uint64_t prepared_at,
                                              absl::Status* prepared_durable) {
  CallGroup calls(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    workers_->WriteReplicasAsync(batches[i].target, batches[i].writes, calls.Callback(i));
  }
  // The WritePrepared's sync, on this thread while the workers take the
  // values (it leads the log's group commit or joins the one under way).
  if (prepared_at > 0) *prepared_durable = registry_->AwaitDurable(prepared_at);
  return calls.Wait();
}

std::vector<absl::Status> Replication::FanOutOverDataPlane(std::vector<WriteBatch>& batches,
                                                           uint64_t prepared_at,
                                                           absl::Status* prepared_durable) {
  std::vector<GroupMember> members;
  for (const WriteBatch& b : batches) members.push_back({b.target.task, b.target.incarnation});
  std::vector<absl::Status> statuses;
  (void)groups_->RunBroadcast(members, [&](const std::string& group, uint32_t tag) {
    const int32_t size = static_cast<int32_t>(batches.size());
    const absl::Duration timeout = CollectiveTimeout(batches[0].writes[0].value->bytes.size());
    for (size_t i = 0; i < batches.size(); ++i) {
      batches[i].writes[0].collective =
          CollectiveSpec{group, static_cast<int32_t>(i), size, /*root=*/0, tag, timeout};
    }
    statuses = FanOut(batches, prepared_at, prepared_durable);
    for (const absl::Status& s : statuses) REPVAR_RETURN_IF_ERROR(s);
    return absl::OkStatus();
  });
  return statuses;
}

absl::Status Replication::CommitWrites(const std::vector<PlannedWrite>& writes,
                                       const Delivery& delivery,
                                       const std::map<uint64_t, Initializer>& initializers,
                                       std::optional<RequestRecorded> outcome) {
  const bool delivered = delivery.failures.empty();
  // A prepared write that reached everyone was decided by its durable
  // WritePrepared: its commit is not waited for. A failure is, before the
  // caller hears of it (a restart must not roll the write forward then).
  const auto durability = delivered && delivery.prepared != 0 ? Registry::Durability::kDecided
                                                              : Registry::Durability::kSynced;
  // A superseded worker process may still serve the values this replaces
  // from its local read table (C8): they are replaced once it cannot.
  if (delivered && registry_->membership_options().read_lease > absl::ZeroDuration()) {
    const absl::Time end = registry_->SupersededLeasesEnd();
    if (const absl::Time now = clock_->Now(); end > now) clock_->SleepFor(end - now);
  }
  absl::Status committed =
      registry_
          ->Commit(
              [&](const ClusterState& state) -> absl::StatusOr<Record> {
                return SettleWrites(state, writes, delivery, initializers, outcome);
              },
              durability)
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

namespace {

// How long, and how many, refusals are remembered (Replication::refused_):
// longer than any attempt of a request stays in flight.
constexpr absl::Duration kRememberRefusals = absl::Minutes(10);
constexpr size_t kMaxRefusals = 100'000;

// A refusal that says the write changed nothing and never will.
bool Refusal(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) || absl::IsNotFound(s) || absl::IsInvalidArgument(s);
}

}  // namespace

absl::StatusOr<std::vector<WriteResult>> Replication::Assign(const RequestKey& key,
                                                             const std::vector<Assignment>& items) {
  if (items.empty()) return absl::InvalidArgumentError("assign needs at least one variable");
  const absl::string_view op = items.size() == 1 ? "assign" : "assign_batch";
  // C6 before anything that refuses new writes: the retry of a write that
  // was applied (its first answer lost, or too late for its caller) gets
  // that answer, even if a step opened since (S5) or the variable is gone.
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> earlier, registry_->Outcome(key, op));
  if (earlier && !BugSeeded(SeededBug::kRetriesReapplied)) return Answered(*earlier);
  // One attempt of a request at a time: an earlier one still running may
  // yet apply the write, so a later one must not be refused meanwhile. And
  // a request refused stays refused: an attempt arriving after the refusal
  // (delayed, duplicated, queued while the coordinator was paused) gets it.
  // (A write without a request id is no request to remember.)
  const bool remembered = !key.id.empty();
  if (remembered) {
    RankedLock lock(&mu_);
    if (auto r = refused_.find(key.id);
        r != refused_.end() && !BugSeeded(SeededBug::kRefusalsForgotten)) {
      return r->second;
    }
    if (!running_.insert(key.id).second && !BugSeeded(SeededBug::kAttemptsOverlap)) {
      return absl::UnavailableError(
          absl::StrCat("an earlier attempt of request \"", key.id,
                       "\" is still running; retry with the same request id for its answer"));
    }
  }
  absl::Status refusal;  // set when this attempt refuses the request
  absl::Cleanup finished = [this, &key, &refusal, remembered] {
    if (!remembered) return;
    RankedLock lock(&mu_);
    running_.erase(key.id);
    if (refusal.ok()) return;
    const absl::Time now = clock_->Now();
    while (!refusal_order_.empty() && (refusal_order_.front().first < now - kRememberRefusals ||
                                       refusal_order_.size() >= kMaxRefusals)) {
      refused_.erase(refusal_order_.front().second);
      refusal_order_.pop_front();
    }
    if (refused_.emplace(key.id, refusal).second) refusal_order_.emplace_back(now, key.id);
  };
  if (remembered) {
    // Again, now that no other attempt runs: one that was running when this
    // one was checked above may have applied the write since.
    REPVAR_ASSIGN_OR_RETURN(earlier, registry_->Outcome(key, op));
    if (earlier && !BugSeeded(SeededBug::kRetriesReapplied)) return Answered(*earlier);
  }
  if (absl::Status gate = steps_->EnterWriteGate(); !gate.ok()) {
    refusal = gate;
    return gate;
  }
  absl::Cleanup leave = [this] { steps_->LeaveWriteGate(); };
  // The decisions below read the state without waiting for it to be durable
  // (Registry::Peek): the commit at the end waits for all of it. A refusal
  // reports what was read, so it waits first.
  absl::StatusOr<std::vector<WriteResult>> done = AssignInGate(key, items, op);
  if (!done.ok()) REPVAR_RETURN_IF_ERROR(registry_->AwaitDurable());
  if (!done.ok() && Refusal(done.status())) refusal = done.status();
  return done;
}

absl::StatusOr<std::vector<WriteResult>> Replication::AssignInGate(
    const RequestKey& key, const std::vector<Assignment>& items, absl::string_view op) {
  REPVAR_ASSIGN_OR_RETURN(const std::vector<uint64_t> ids, IdsOfItems(items));
  WriteLocks locks(this, ids);
  // Again under the locks: an attempt that was still running has finished.
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> earlier, registry_->Outcome(key, op));
  if (earlier && !BugSeeded(SeededBug::kRetriesReapplied)) return Answered(*earlier);
  // The write locks are held: versions and values cannot move under us.
  REPVAR_ASSIGN_OR_RETURN(const std::vector<AssignTarget> targets, CheckAssignments(items, ids));
  Record keep;
  MemoryCharge charge(budget_);  // the results computed here, while they are sent
  REPVAR_ASSIGN_OR_RETURN(const std::vector<PlannedWrite> writes,
                          ComputeValues(items, ids, targets, charge, keep));
  REPVAR_RETURN_IF_ERROR(KeepCommittedValues(keep));
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

absl::StatusOr<std::vector<uint64_t>> Replication::IdsOfItems(
    const std::vector<Assignment>& items) {
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
  return ids;
}

// One item against its variable. Errors: as CheckAssignments.
absl::StatusOr<Replication::AssignTarget> Replication::CheckAssignment(const Assignment& item,
                                                                       const VariableRecord* v) {
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat("variable \"", item.name, "\" was deleted"));
  }
  if (item.value == nullptr) return absl::InvalidArgumentError("assign without a value");
  if (!(item.value->spec == v->def.tensor)) {
    return absl::FailedPreconditionError(absl::StrCat("variable ", item.name, " is ",
                                                      v->def.tensor.ToString(), "; the value is ",
                                                      item.value->spec.ToString()));
  }
  if (item.op != AssignOp::kAssign && v->version == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "variable ", item.name, " is uninitialized; assign or initialize it before adding to it"));
  }
  if (!v->def.allow_nonfinite) {
    if (int64_t bad = FirstNonFinite(*item.value); bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("variable ", item.name,
                                                     ": non-finite value at element ", bad,
                                                     " (allow_nonfinite is off)"));
    }
  }
  return AssignTarget{v->version + 1, v->def.allow_nonfinite,
                      v->version > 0 && v->value == nullptr};
}

absl::StatusOr<std::vector<Replication::AssignTarget>> Replication::CheckAssignments(
    const std::vector<Assignment>& items, const std::vector<uint64_t>& ids) {
  return registry_->Peek(
      [&](const ClusterState& state) -> absl::StatusOr<std::vector<AssignTarget>> {
        std::vector<AssignTarget> targets;
        for (size_t i = 0; i < items.size(); ++i) {
          REPVAR_ASSIGN_OR_RETURN(AssignTarget t, CheckAssignment(items[i], state.FindId(ids[i])));
          targets.push_back(t);
        }
        return targets;
      });
}

absl::StatusOr<std::vector<PlannedWrite>> Replication::ComputeValues(
    const std::vector<Assignment>& items, const std::vector<uint64_t>& ids,
    const std::vector<AssignTarget>& targets, MemoryCharge& charge, Record& keep) {
  std::vector<PlannedWrite> writes;
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
  return writes;
}

absl::Status Replication::KeepCommittedValues(const Record& keep) {
  if (keep.empty()) return absl::OkStatus();
  return registry_
      ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
        Record record;
        for (const Change& c : keep.changes) {
          const ValueKept& k = std::get<ValueKept>(c);
          const VariableRecord* v = state.FindId(k.id);
          if (v != nullptr && v->version == k.version && v->checksum == k.checksum) {
            record.changes.push_back(k);
          }
        }
        return record;
      })
      .status();
}

// ---- Delete ----

void Replication::WaitOutLeases(const std::vector<TaskKey>& tasks) const {
  if (registry_->membership_options().read_lease <= absl::ZeroDuration() ||
      BugSeeded(SeededBug::kDeletesNotWaited)) {
    return;
  }
  const absl::Time end =
      std::max(registry_->SupersededLeasesEnd(), registry_->LeaseHeldUntil(tasks));
  if (const absl::Time now = clock_->Now(); end > now) clock_->SleepFor(end - now);
}

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
  std::vector<TaskKey> unreached;
  for (size_t i = 0; i < holders.size(); ++i) {
    if (!statuses[i].ok()) {
      spdlog::warn("drop of {} on {} failed: {}", std::string(name), holders[i].task.ToString(),
                   statuses[i].ToString());
      registry_->OwesDrop(holders[i].task, id);
      unreached.push_back(holders[i].task);
    }
  }
  WaitOutLeases(unreached);
  RankedLock lock(&mu_);
  write_locks_.erase(id);
  spdlog::info("variable {} (id {}) deleted", std::string(name), id);
  return absl::OkStatus();
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "server/core/registry.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"
#include "server/core/placement.h"
#include "spdlog/spdlog.h"

namespace repvar::server {

Registry::Registry(RegistryOptions options, Clock* clock, StateLog* log)
    : options_(std::move(options)), clock_(clock), log_(log), state_(options_.state) {
  // Fences start at the clock (in microseconds), so that a coordinator with
  // nothing recorded (--ephemeral, a new data dir) still fences above what
  // an earlier one sent to workers that outlived it; a recovered
  // reservation raises it further (Recover).
  last_fence_ = static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMicros(clock_->Now())));
}

absl::StatusOr<uint64_t> Registry::CommitLocked(Record record, bool decided) {
  if (record.empty()) return required_.load();
  REPVAR_ASSIGN_OR_RETURN(applied_, log_->Append(record));
  if (!decided) required_ = applied_;
  state_.Apply(record);
  log_->Applied(state_);
  return applied_;
}

absl::Status Registry::Recover() {
  RankedLock lock(&mu_);
  REPVAR_RETURN_IF_ERROR(log_->Recover(state_));
  // Roll-forward: a write prepared and never resolved was decided when its
  // WritePrepared was durable, and its caller may have been answered.
  if (!state_.prepared().empty()) {
    // A worker the write did not reach may still serve the value it
    // replaces under a read lease the earlier run granted: the write
    // becomes visible only once no such lease can hold.
    if (ReadLease() > absl::ZeroDuration()) clock_->SleepFor(LeaseBound());
    Record record;
    for (const auto& [fence, p] : state_.prepared()) {
      // It follows its variables' committed versions, unless its commit
      // failed in the log (a full disk) and the variables moved on.
      bool follows = true;
      for (const PreparedValue& v : p.values) {
        const VariableRecord* now = state_.FindId(v.id);
        follows = follows && now != nullptr && now->version + 1 == v.version;
      }
      if (follows && !BugSeeded(SeededBug::kNoRollForward)) {
        for (const PreparedValue& v : p.values) {
          // No holders: which replicas took it is verified after recovery.
          record.changes.push_back(ValueCommitted{v.id, v.version, v.checksum, v.value, {}, {}});
          record.changes.push_back(ResyncFlagged{v.id, true});
        }
        record.changes.push_back(p.outcome);
        spdlog::info("the write prepared with fence {} (request \"{}\") was committed at restart",
                     fence, p.outcome.key.id);
      } else {
        spdlog::warn("the write prepared with fence {} (request \"{}\") was overtaken; dropped",
                     fence, p.outcome.key.id);
      }
      record.changes.push_back(WriteResolved{fence});
    }
    REPVAR_RETURN_IF_ERROR(CommitLocked(std::move(record)).status());
  }
  // Workers recorded live get a whole heartbeat timeout from now to be heard
  // from again (they keep their incarnation across our restart).
  const absl::Time now = clock_->Now();
  // Tokens of the earlier run are at most the reservation; ours are above.
  last_fence_ = std::max(last_fence_, state_.fences_reserved());
  int live = 0;
  for (const auto& [key, w] : state_.workers()) {
    if (!w.IsLive()) continue;
    last_heartbeat_[key] = now;
    // The earlier run may have granted it a read lease.
    if (ReadLease() > absl::ZeroDuration()) lease_held_until_[key] = now + LeaseBound();
    ++live;
  }
  spdlog::info(
      "state recovered: {} variables (next id {}), {} workers recorded live, topology version {}, "
      "last committed step {}, last epoch {}",
      state_.variables().size(), state_.next_variable_id(), live, state_.topology_version(),
      state_.last_committed_step(), state_.last_epoch());
  return absl::OkStatus();
}

absl::Status Registry::CheckRoom(uint64_t value_bytes) const {
  RankedLock lock(&mu_);
  return log_->CheckRoom(value_bytes);
}

absl::StatusOr<uint64_t> Registry::NextFence() {
  constexpr uint64_t kBlock = 1 << 16;
  uint64_t fence = 0;
  uint64_t reserved_at = 0;
  {
    RankedLock lock(&mu_);
    if (last_fence_ >= state_.fences_reserved()) {
      REPVAR_ASSIGN_OR_RETURN(fences_position_,
                              CommitLocked(Record{{FencesReserved{last_fence_ + kBlock}}}));
    }
    fence = ++last_fence_;
    reserved_at = fences_position_;
  }
  // The token may reach a worker once its reservation would survive a
  // crash; other writers' records need not be.
  REPVAR_RETURN_IF_ERROR(AwaitDurable(reserved_at));
  return fence;
}

absl::StatusOr<uint64_t> Registry::Commit(Builder build, Durability durability) {
  absl::StatusOr<uint64_t> committed;
  uint64_t seen = 0;
  {
    RankedLock lock(&mu_);
    absl::StatusOr<Record> record = build(state_);
    committed = record.ok() ? CommitLocked(*std::move(record), durability == Durability::kDecided)
                            : record.status();
    seen = required_;
  }
  // A synced commit's caller, as every caller who saw the state, is
  // answered once what it saw is durable, even when it was refused.
  if (durability == Durability::kSynced) {
    const absl::Status durable = AwaitDurable(seen);
    if (committed.ok() && !durable.ok()) return durable;
  }
  return committed;
}

absl::Status Registry::AwaitDurable(uint64_t position) const {
  if (position == kEverythingApplied) position = required_;
  if (position == 0 || BugSeeded(SeededBug::kAnsweredBeforeSync)) return absl::OkStatus();
  return log_->Durable(position);
}

// ---- Membership ----

namespace {

// Bounds on what one registration may carry (it is kept and recorded).
constexpr size_t kMaxAddressBytes = 256;
constexpr size_t kMaxDevicesPerTask = 1024;

}  // namespace

absl::StatusOr<int64_t> Registry::Register(const WorkerRegistration& reg,
                                           std::optional<LiveTask>* superseded, bool joining) {
  // Validate everything before touching state.
  if (!IsValidJobName(reg.job)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job name \"", reg.job, "\": must match [a-z][a-z0-9_]*"));
  }
  if (reg.task < 0) return absl::InvalidArgumentError("task must be >= 0");
  if (reg.address.empty() || reg.address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker address is empty or over ", kMaxAddressBytes, " bytes"));
  }
  if (reg.devices.size() > kMaxDevicesPerTask) {
    return absl::InvalidArgumentError(absl::StrCat("a task registers at most ", kMaxDevicesPerTask,
                                                   " devices, not ", reg.devices.size()));
  }
  if (reg.incarnation == 0) return absl::InvalidArgumentError("incarnation must not be 0");
  const TaskKey key{reg.job, reg.task};
  std::vector<DeviceName> devices;
  std::set<DeviceName> seen;
  for (size_t i = 0; i < reg.devices.size(); ++i) {
    auto d = DeviceName::Parse(reg.devices[i]);
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "]: ", d.status().message()));
    }
    if (d->job != reg.job || d->task != reg.task) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "] ", d->ToString(),
                                                     " does not belong to task ", key.ToString()));
    }
    if (!seen.insert(*d).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "] ", d->ToString(), " is listed twice"));
    }
    devices.push_back(*std::move(d));
  }
  std::sort(devices.begin(), devices.end());

  CallLock lock(this);
  const WorkerRecord* w = state_.LiveWorker(key);
  // A new process, or one that lost its registration: its table is empty.
  if (w == nullptr || w->incarnation < reg.incarnation) owed_drops_.erase(key);
  Record record;
  if (w != nullptr) {
    if (w->incarnation > reg.incarnation) {
      return absl::AbortedError(absl::StrCat("task ", key.ToString(), " is live under incarnation ",
                                             w->incarnation, ", newer than ", reg.incarnation,
                                             ": this process was superseded and must stop"));
    }
    if (w->incarnation < reg.incarnation) {
      // T1: a newer process of the task supersedes the old one once no read
      // lease of the old one can hold; the old incarnation is fenced (its
      // calls refused, its step failed).
      if (auto until = lease_held_until_.find(key); until != lease_held_until_.end()) {
        superseded_leases_end_ = std::max(superseded_leases_end_, until->second);
      }
      if (superseded != nullptr) {
        *superseded = LiveTask{key, w->address, w->incarnation, w->devices, last_heartbeat_[key]};
      }
      spdlog::warn("{} incarnation {} supersedes incarnation {}", key.ToString(), reg.incarnation,
                   w->incarnation);
      record.changes.push_back(WorkerDied{key, w->incarnation});
    } else {
      if (w->devices != devices || w->address != reg.address) {
        return absl::InvalidArgumentError(absl::StrCat(
            "task ", key.ToString(), " incarnation ", reg.incarnation,
            " registered before with other devices or address; use a new incarnation"));
      }
      last_heartbeat_[key] = clock_->Now();
      return state_.topology_version();  // the same process again: idempotent
    }
  }
  record.changes.push_back(
      WorkerRegistered{key, reg.address, reg.incarnation, std::move(devices), joining});
  REPVAR_RETURN_IF_ERROR(CommitLocked(std::move(record)).status());
  last_heartbeat_[key] = clock_->Now();
  return state_.topology_version();
}

absl::Status Registry::Joined(const TaskKey& key, uint64_t incarnation) {
  CallLock lock(this);
  const WorkerRecord* w = state_.Worker(key);
  if (w == nullptr || !w->joining || !w->IsLive() || w->incarnation != incarnation) {
    return absl::OkStatus();
  }
  return CommitLocked(Record{{WorkerJoined{key, incarnation}}}).status();
}

std::vector<LiveTask> Registry::Joining() const {
  CallLock lock(this);
  std::vector<LiveTask> out;
  for (const auto& [key, w] : state_.workers()) {
    if (w.IsLive() && w.joining) {
      out.push_back(LiveTask{key, w.address, w.incarnation, w.devices, absl::InfinitePast()});
    }
  }
  return out;
}

absl::Duration Registry::ReadLease() const {
  return std::min(options_.membership.read_lease, options_.membership.heartbeat_timeout / 3);
}

absl::Duration Registry::LeaseBound() const {
  const absl::Duration lease = ReadLease();
  return lease + lease / 10 + absl::Milliseconds(50);
}

absl::Time Registry::SupersededLeasesEnd() const {
  RankedLock lock(&mu_);
  return superseded_leases_end_;
}

void Registry::LimitLeases(std::optional<absl::flat_hash_map<TaskKey, uint64_t>> to) {
  RankedLock lock(&mu_);
  lease_limit_ = std::move(to);
}

bool Registry::WithinLeaseLimit(const TaskKey& task, uint64_t incarnation) const {
  if (!lease_limit_) return true;
  auto it = lease_limit_->find(task);
  return it != lease_limit_->end() && it->second == incarnation;
}

void Registry::OwesDrop(const TaskKey& task, uint64_t variable_id) {
  RankedLock lock(&mu_);
  owed_drops_[task].insert(variable_id);
}

void Registry::DropConfirmed(const TaskKey& task, uint64_t variable_id) {
  RankedLock lock(&mu_);
  auto it = owed_drops_.find(task);
  if (it == owed_drops_.end()) return;
  it->second.erase(variable_id);
  if (it->second.empty()) owed_drops_.erase(it);
}

std::map<TaskKey, std::set<uint64_t>> Registry::OwedDrops() const {
  RankedLock lock(&mu_);
  return owed_drops_;
}

absl::Time Registry::LeaseHeldUntil(const std::vector<TaskKey>& tasks) const {
  RankedLock lock(&mu_);
  absl::Time until = absl::InfinitePast();
  for (const TaskKey& t : tasks) {
    auto it = lease_held_until_.find(t);
    if (it != lease_held_until_.end()) until = std::max(until, it->second);
  }
  return until;
}

absl::StatusOr<HeartbeatGrant> Registry::Heartbeat(const TaskKey& key, uint64_t incarnation,
                                                   bool read_lease,
                                                   const std::vector<HeldValue>& held) {
  if (held.size() > kMaxHeldValuesPerHeartbeat) {
    return absl::InvalidArgumentError(absl::StrCat("a heartbeat asks about at most ",
                                                   kMaxHeldValuesPerHeartbeat, " values, not ",
                                                   held.size()));
  }
  CallLock lock(this);
  const WorkerRecord* w = state_.LiveWorker(key);
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("task ", key.ToString(),
                                            " is not registered (or was declared dead); "
                                            "register again"));
  }
  if (w->incarnation != incarnation) {
    return absl::AbortedError(absl::StrCat("task ", key.ToString(), " incarnation ", incarnation,
                                           " is stale; live incarnation is ", w->incarnation));
  }
  const absl::Time now = clock_->Now();
  last_heartbeat_[key] = now;
  HeartbeatGrant grant;
  grant.topology_version = state_.topology_version();
  grant.confirmed.assign(held.size(), false);
  if (!read_lease || ReadLease() <= absl::ZeroDuration() ||
      (!WithinLeaseLimit(key, incarnation) && !BugSeeded(SeededBug::kBehindLeasedMidStep)) ||
      (owed_drops_.contains(key) && !BugSeeded(SeededBug::kDeletesNotWaited)) ||
      (!state_.HoldsOnlyNorm(key) && !BugSeeded(SeededBug::kStaleWorkersLeased))) {
    return grant;
  }
  grant.read_lease = ReadLease();
  lease_held_until_[key] = now + LeaseBound();
  for (size_t i = 0; i < held.size(); ++i) {
    const VariableRecord* v = state_.FindId(held[i].variable_id);
    const auto r = static_cast<size_t>(held[i].replica);
    grant.confirmed[i] = v != nullptr && v->version > 0 && held[i].version == v->version &&
                         held[i].checksum == v->checksum && held[i].replica >= 0 &&
                         r < v->replica_count() && v->placement[r].task == key &&
                         state_.Replica(*v, r).incarnation == w->incarnation &&
                         v->StateOf(r) == ReplicaState::kUpToDate;
  }
  return grant;
}

std::vector<LiveTask> Registry::CheckHeartbeats(absl::Time now) {
  std::vector<LiveTask> dead;
  {
    CallLock lock(this);
    Record record;
    for (const auto& [key, w] : state_.workers()) {
      if (!w.IsLive()) continue;
      const absl::Time last = last_heartbeat_[key];
      if (now - last <= options_.membership.heartbeat_timeout) continue;
      record.changes.push_back(WorkerDied{key, w.incarnation});
      dead.push_back(LiveTask{key, w.address, w.incarnation, w.devices, last});
    }
    if (absl::Status s = CommitLocked(std::move(record)).status(); !s.ok()) {
      spdlog::error("cannot record dead workers: {}", s.ToString());
      return {};
    }
  }
  for (const LiveTask& t : dead) {
    spdlog::warn("worker {} (incarnation {}) missed heartbeats for {}; declared dead",
                 t.key.ToString(), t.incarnation, absl::FormatDuration(now - t.last_heartbeat));
  }
  return dead;
}

TopologySnapshot Registry::VisibleTopology(const std::map<std::string, int32_t>& expected) const {
  return state_.Topology(expected);
}

TopologySnapshot Registry::SnapshotLocked() const {
  TopologySnapshot s = VisibleTopology(options_.membership.expected_tasks);
  for (LiveTask& t : s.tasks) {
    auto it = last_heartbeat_.find(t.key);
    if (it != last_heartbeat_.end()) t.last_heartbeat = it->second;
  }
  return s;
}

TopologySnapshot Registry::Snapshot() const {
  CallLock lock(this);
  return SnapshotLocked();
}

TopologySnapshot Registry::WaitForChange(int64_t after_version, absl::Time deadline) const {
  CallLock lock(this);
  auto changed = [this, after_version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_.topology_version() > after_version;
  };
  mu_.native()->AwaitWithDeadline(absl::Condition(&changed), deadline);
  return SnapshotLocked();
}

absl::StatusOr<TopologySnapshot> Registry::WaitForExpected(absl::Time deadline) const {
  CallLock lock(this);
  auto formed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return VisibleTopology(options_.membership.expected_tasks).missing_tasks.empty();
  };
  if (!mu_.native()->AwaitWithDeadline(absl::Condition(&formed), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("cluster did not form in time; missing tasks: ",
                     absl::StrJoin(SnapshotLocked().missing_tasks, ", ")));
  }
  return SnapshotLocked();
}

std::optional<LiveTask> Registry::Find(const TaskKey& key) const {
  CallLock lock(this);
  const WorkerRecord* w = state_.LiveWorker(key);
  if (w == nullptr) return std::nullopt;
  auto hb = last_heartbeat_.find(key);
  return LiveTask{key, w->address, w->incarnation, w->devices,
                  hb == last_heartbeat_.end() ? absl::InfinitePast() : hb->second};
}

// ---- Variables ----

absl::StatusOr<CreateResult> Registry::CreateVariables(const RequestKey& key,
                                                       const std::vector<CreateItem>& items,
                                                       VariableDetail detail) {
  REPVAR_RETURN_IF_ERROR(CheckCreateItems(items));
  CreateAnswer answer;
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> cached, Outcome(key, "create"));
  if (cached) {
    answer = std::get<CreateAnswer>(*cached);
  } else {
    auto create = [&](const ClusterState& state) -> absl::StatusOr<Record> {
      // Placed on the topology users see (a joining task's accelerators
      // have no ordinal yet).
      const TopologySnapshot topo = state.Topology({});
      REPVAR_RETURN_IF_ERROR(CheckCreatesAgainst(state, topo, items));
      return RecordCreates(state, topo, key, items, &answer);
    };
    REPVAR_RETURN_IF_ERROR(Commit(create).status());
    for (const std::string& w : answer.warnings) spdlog::warn("{}", w);
  }
  return Read([&](const ClusterState& state) -> absl::StatusOr<CreateResult> {
    CreateResult result;
    for (size_t i = 0; i < answer.names.size(); ++i) {
      const VariableRecord* v = state.Find(answer.names[i]);
      if (v == nullptr) {
        return absl::NotFoundError(
            absl::StrCat("variable \"", answer.names[i], "\" was deleted since it was created"));
      }
      result.variables.push_back(state.View(*v, detail));
      result.created.push_back(answer.created[i]);
    }
    result.warnings = answer.warnings;
    return result;
  });
}

absl::Status Registry::CheckCreateItems(const std::vector<CreateItem>& items) const {
  if (items.empty()) return absl::InvalidArgumentError("create needs at least one variable");
  for (const CreateItem& item : items) {
    REPVAR_RETURN_IF_ERROR(ValidateVariableDef(item.def, options_.max_variable_bytes));
    if (item.initializer.kind == InitializerKind::kValue &&
        (item.initializer.value == nullptr || !(item.initializer.value->spec == item.def.tensor))) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", item.def.name, ": initializer value does not match its spec"));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::Status AlreadyExists(const VariableDef& old, const VariableDef& def) {
  return absl::AlreadyExistsError(absl::StrCat(
      "variable ", def.name, " already exists as ", old.tensor.ToString(), " x", old.replica_count,
      " (aggregation ", AggregationName(old.aggregation), ", trainable ", old.trainable,
      "); the request asks for ", def.tensor.ToString(), " x", def.replica_count, " (aggregation ",
      AggregationName(def.aggregation), ", trainable ", def.trainable, ")"));
}

}  // namespace

absl::Status Registry::CheckCreatesAgainst(const ClusterState& state, const TopologySnapshot& topo,
                                           const std::vector<CreateItem>& items) {
  absl::flat_hash_map<absl::string_view, const VariableDef*> in_batch;
  in_batch.reserve(items.size());
  for (const CreateItem& item : items) {
    const VariableDef& def = item.def;
    const VariableRecord* existing = state.Find(def.name);
    if (existing != nullptr && !(existing->def == def)) return AlreadyExists(existing->def, def);
    auto [b, fresh] = in_batch.emplace(def.name, &def);
    if (!fresh && !(*b->second == def)) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", def.name, " appears twice in the batch with different specs"));
    }
    if (existing == nullptr && static_cast<size_t>(def.replica_count) > topo.accelerators.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "variable ", def.name, " asks for ", def.replica_count, " replicas but the cluster has ",
          topo.accelerators.size(), " accelerators (topology version ", topo.version,
          "); wait for the cluster to form or lower the replica count"));
    }
  }
  return absl::OkStatus();
}

Record Registry::RecordCreates(const ClusterState& state, const TopologySnapshot& topo,
                               const RequestKey& key, const std::vector<CreateItem>& items,
                               CreateAnswer* answer) const {
  // Every variable of n replicas has the same placement (Place): made once
  // per n the batch asks for.
  absl::flat_hash_map<int32_t, Placements> placements;
  Record record;
  answer->names.reserve(items.size());
  answer->created.reserve(items.size());
  uint64_t next_id = state.next_variable_id();
  absl::flat_hash_set<absl::string_view> made;
  for (const CreateItem& item : items) {
    const VariableDef& def = item.def;
    answer->names.push_back(def.name);
    const bool fresh = state.Find(def.name) == nullptr && made.insert(def.name).second;
    answer->created.push_back(fresh);
    if (!fresh) continue;
    Placements& placement = placements[def.replica_count];
    if (placement.empty()) placement = Place(topo, def.replica_count);
    if (OnOneHost(topo, def.replica_count)) {
      answer->warnings.push_back(
          absl::StrCat("variable ", def.name, ": all ", def.replica_count,
                       " replica(s) sit on one host (", topo.accelerators[0].task.ToString(),
                       "); in-step data cannot survive the loss of that host"));
    }
    // Recorded; it never moves.
    record.changes.push_back(VariableCreated{next_id++, def, placement, item.initializer});
  }
  record.changes.push_back(RequestRecorded{key, "create", *answer, clock_->Now()});
  return record;
}

absl::StatusOr<VariableView> Registry::GetVariable(absl::string_view name) const {
  CallLock lock(this);
  const VariableRecord* v = state_.Find(name);
  if (v == nullptr)
    return absl::NotFoundError(absl::StrCat("variable \"", name, "\" does not exist"));
  return state_.View(*v);
}

std::vector<VariableView> Registry::ListVariables(absl::string_view collection,
                                                  VariableDetail detail) const {
  CallLock lock(this);
  std::vector<VariableView> out;
  for (const auto& [id, v] : state_.variables()) {
    VariableView view = state_.View(v, detail);
    if (collection.empty() || std::find(view.collections.begin(), view.collections.end(),
                                        collection) != view.collections.end()) {
      out.push_back(std::move(view));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const VariableView& a, const VariableView& b) { return a.def.name < b.def.name; });
  return out;
}

absl::StatusOr<std::optional<Answer>> Registry::Outcome(const RequestKey& key,
                                                        absl::string_view op) const {
  const absl::Time now = clock_->Now();
  absl::StatusOr<std::optional<Answer>> found;
  uint64_t seen = 0;
  {
    RankedLock lock(&mu_);
    found = state_.Outcome(key, op, now);
    seen = required_;
  }
  // Nothing to answer from: the request goes on, and its commit waits.
  if (found.ok() && !found->has_value()) return found;
  // An answer (or a refusal) is reported: once what it came from is durable.
  REPVAR_RETURN_IF_ERROR(AwaitDurable(seen));
  return found;
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "server/core/cluster_state.h"

#include <algorithm>
#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"

namespace repvar::server {
void ClusterState::Moved() {
  ++layout_revision_;
  ++value_revision_;
}

void ClusterState::MoveReplica(VariableRecord& v, size_t i, ReplicaEvent event) {
  ReplicaRecord r = Replica(v, i);
  if (TransitionReplica(r.state, event, v.def.name, static_cast<int32_t>(i))) Moved();
  SetReplica(v, i, r);
}

ReplicaRecord ClusterState::Replica(const VariableRecord& v, size_t i) const {
  if (auto it = v.exceptions.find(static_cast<int32_t>(i)); it != v.exceptions.end()) {
    return it->second;
  }
  if (v.version == 0) return ReplicaRecord{};
  const WorkerRecord* w = Worker(v.placement[i].task);
  return ReplicaRecord{ReplicaState::kUpToDate, v.version, v.checksum,
                       w != nullptr ? w->incarnation : 0};
}

void ClusterState::SetReplica(VariableRecord& v, size_t i, const ReplicaRecord& r) {
  const auto index = static_cast<int32_t>(i);
  if (r.state != v.NormState() || r.version != v.version || r.checksum != v.checksum) {
    v.exceptions[index] = r;
    off_norm_.insert(v.placement[i].task);
    return;
  }
  // The norm's incarnation: none before the first value, else the live
  // worker's.
  const WorkerRecord* w = LiveWorker(v.placement[i].task);
  const uint64_t norm = v.version == 0 ? 0 : (w != nullptr ? w->incarnation : ~uint64_t{0});
  if (r.incarnation == norm) {
    v.exceptions.erase(index);
  } else {
    v.exceptions[index] = r;
    off_norm_.insert(v.placement[i].task);
  }
}

bool ClusterState::HoldsOnlyNorm(const TaskKey& task) const {
  if (!off_norm_.contains(task)) return true;
  const WorkerRecord* w = LiveWorker(task);
  if (w == nullptr) return false;
  for (const auto& [id, v] : variables_) {
    for (const auto& [i, r] : v.exceptions) {
      if (v.placement[static_cast<size_t>(i)].task != task) continue;
      const bool norm =
          v.version == 0 || (r.state == ReplicaState::kUpToDate && r.version == v.version &&
                             r.checksum == v.checksum && r.incarnation == w->incarnation);
      if (!norm) return false;
    }
  }
  off_norm_.erase(task);
  return true;
}

void ClusterState::Normalize(VariableRecord& v) {
  std::vector<std::pair<int32_t, ReplicaRecord>> listed(v.exceptions.begin(), v.exceptions.end());
  for (const auto& [i, r] : listed) SetReplica(v, static_cast<size_t>(i), r);
}

absl::Status ClusterState::Restore(ClusterStateData data) {
  REPVAR_CHECK_MSG(variables_.empty() && workers_.empty() && outcomes_.empty() &&
                       next_variable_id_ == 1 && last_epoch_ == 0,
                   "ClusterState::Restore into a state that is not empty");
  absl::flat_hash_set<absl::string_view> names;
  for (const auto& [id, v] : data.variables) {
    if (id != v.id || id == 0 || id >= data.next_variable_id) {
      return absl::DataLossError(absl::StrCat("checkpoint: variable id ", v.id, " filed under ", id,
                                              " (next id ", data.next_variable_id, ")"));
    }
    if (!names.insert(v.def.name).second) {
      return absl::DataLossError(absl::StrCat("checkpoint: variable name ", v.def.name, " twice"));
    }
    const bool in_range = v.exceptions.empty() ||
                          (v.exceptions.begin()->first >= 0 &&
                           static_cast<size_t>(v.exceptions.rbegin()->first) < v.placement.size());
    if (v.placement.size() != static_cast<size_t>(v.def.replica_count) || !in_range) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint: variable ", v.def.name, " has ", v.def.replica_count, " replicas, ",
          v.placement.size(), " placements and replica records out of range"));
    }
  }
  for (const auto& [key, w] : data.workers) {
    if (!(key == w.task)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint: worker ", w.task.ToString(), " filed under ", key.ToString()));
    }
  }
  absl::flat_hash_map<std::string, StoredOutcome> outcomes;
  std::deque<std::string> order;
  for (auto& [id, o] : data.outcomes) {
    if (id.empty() || !outcomes.emplace(id, std::move(o)).second) {
      return absl::DataLossError(
          absl::StrCat("checkpoint: request id \"", id, "\" twice or empty"));
    }
    order.push_back(id);
  }
  std::map<uint64_t, WritePrepared> prepared;
  for (WritePrepared& p : data.prepared) {
    for (const PreparedValue& value : p.values) {
      if (value.value == nullptr || value.value->checksum != value.checksum) {
        return absl::DataLossError(absl::StrCat("checkpoint: the write prepared with fence ",
                                                p.fence, " lacks the value of variable id ",
                                                value.id));
      }
    }
    const uint64_t fence = p.fence;
    if (!prepared.emplace(fence, std::move(p)).second) {
      return absl::DataLossError(absl::StrCat("checkpoint: fence ", fence, " prepared twice"));
    }
  }
  variables_ = std::move(data.variables);
  workers_ = std::move(data.workers);
  for (auto& [key, w] : workers_) worker_index_[key] = &w;
  for (auto& [id, v] : variables_) {
    names_[v.def.name] = &v;
    ids_[id] = &v;
    Normalize(v);
    Reassess(v);
  }
  next_variable_id_ = data.next_variable_id;
  topology_version_ = data.topology_version;
  last_committed_step_ = data.last_committed_step;
  last_step_ = std::move(data.last_step);
  last_epoch_ = data.last_epoch;
  fences_reserved_ = data.fences_reserved;
  outcomes_ = std::move(outcomes);
  outcome_order_ = std::move(order);
  prepared_ = std::move(prepared);
  Moved();
  return absl::OkStatus();
}

void ClusterState::Reassess(const VariableRecord& v) {
  bool needs = v.needs_resync;
  for (const auto& [i, r] : v.exceptions) needs = needs || r.state == ReplicaState::kStale;
  if (needs) {
    needing_repair_.insert(v.id);
  } else {
    needing_repair_.erase(v.id);
  }
}

void ClusterState::Apply(const Record& record) {
  for (const Change& change : record.changes) {
    std::visit([this](const auto& c) { ApplyChange(c); }, change);
  }
  // T4: one membership change (a registration, a batch of deaths) is one
  // version.
  if (membership_changed_) ++topology_version_;
  membership_changed_ = false;
}

VariableRecord& ClusterState::MustFind(uint64_t id, const char* change) {
  auto it = ids_.find(id);
  REPVAR_CHECK_MSG(it != ids_.end(),
                   absl::StrCat(change, " names variable id ", id, ", which does not exist"));
  return *it->second;
}

void ClusterState::ApplyChange(const WorkerRegistered& c) {
  Moved();
  WorkerRecord& w = workers_[c.task];
  worker_index_[c.task] = &w;
  TransitionWorker(w.state, WorkerEvent::kRegistered, c.task.ToString());
  w.task = c.task;
  w.address = c.address;
  w.incarnation = c.incarnation;
  w.devices = c.devices;
  w.joining = c.joining;
  membership_changed_ = true;
  // Its replicas come back unverified (F2: fenced off, listed and resynced
  // before they serve), even from the same process: a write cut off after
  // its last acknowledgement may have landed since (F7). They are all
  // UNAVAILABLE (it was declared dead, or is new): exceptions.
  for (auto& [id, v] : variables_) {
    std::vector<int32_t> on_task;
    for (const auto& [i, r] : v.exceptions) {
      if (v.placement[static_cast<size_t>(i)].task == c.task) on_task.push_back(i);
    }
    for (int32_t i : on_task) {
      const ReplicaRecord& r = v.exceptions.at(i);
      if (BugSeeded(SeededBug::kReturnedReplicasTrusted) && v.version != 0 &&
          r.incarnation == c.incarnation && r.version == v.version && r.checksum == v.checksum) {
        ReplicaRecord trusted = r;
        trusted.state = ReplicaState::kUpToDate;
        SetReplica(v, static_cast<size_t>(i), trusted);
        continue;
      }
      MoveReplica(v, static_cast<size_t>(i),
                  v.version == 0 ? ReplicaEvent::kReturnedUninitialized : ReplicaEvent::kReturned);
    }
    if (!on_task.empty()) Reassess(v);
  }
}

void ClusterState::ApplyChange(const WorkerDied& c) {
  Moved();
  auto it = workers_.find(c.task);
  REPVAR_CHECK_MSG(it != workers_.end() && it->second.incarnation == c.incarnation,
                   absl::StrCat("WorkerDied names ", c.task.ToString(), " incarnation ",
                                c.incarnation, ", which is not registered"));
  membership_changed_ = true;
  // Its replicas, found once per distinct placement list (the variables
  // created together share one), are lost; while the worker record still
  // says live, so that those at the norm are read with its incarnation.
  absl::flat_hash_map<const std::vector<Placement>*, std::vector<size_t>> on_task;
  for (auto& [id, v] : variables_) {
    auto [where, fresh] = on_task.try_emplace(&v.placement.list());
    if (fresh) {
      for (size_t i = 0; i < v.placement.size(); ++i) {
        if (v.placement[i].task == c.task) where->second.push_back(i);
      }
    }
    for (size_t i : where->second) MoveReplica(v, i, ReplicaEvent::kLost);
    if (!where->second.empty()) Reassess(v);
  }
  TransitionWorker(it->second.state, WorkerEvent::kDeclaredDead, c.task.ToString());
}

void ClusterState::ApplyChange(const WorkerJoined& c) {
  Moved();
  // Changes no record of the worker: what it holds is in its replicas'
  // states already. Listing it is a new topology.
  auto w = workers_.find(c.task);
  REPVAR_CHECK_MSG(
      w != workers_.end() && w->second.IsLive() && w->second.incarnation == c.incarnation,
      absl::StrCat("WorkerJoined names ", c.task.ToString(), " incarnation ", c.incarnation,
                   ", which is not live"));
  w->second.joining = false;
  membership_changed_ = true;
}

void ClusterState::ApplyChange(const VariableCreated& c) {
  Moved();
  REPVAR_CHECK_MSG(c.id >= next_variable_id_ && !names_.contains(c.def.name),
                   absl::StrCat("VariableCreated reuses id ", c.id, " or name ", c.def.name));
  VariableRecord v;
  v.id = c.id;
  v.def = c.def;
  v.placement = c.placement;
  v.initializer = c.initializer;
  const TaskKey* checked = nullptr;  // a host's replicas come together
  for (size_t i = 0; i < c.placement.size(); ++i) {
    if (checked != nullptr && *checked == c.placement[i].task) continue;
    checked = &c.placement[i].task;
    const WorkerRecord* w = LiveWorker(c.placement[i].task);
    REPVAR_CHECK_MSG(w != nullptr,
                     absl::StrCat("VariableCreated places ", ReplicaName(c.def.name, i), " on ",
                                  c.placement[i].task.ToString(), ", which is not live"));
  }
  next_variable_id_ = c.id + 1;
  VariableRecord& added = variables_.emplace(c.id, std::move(v)).first->second;
  names_[added.def.name] = &added;
  ids_[c.id] = &added;
}

void ClusterState::ApplyChange(const VariableDeleted& c) {
  Moved();
  VariableRecord& v = MustFind(c.id, "VariableDeleted");
  names_.erase(v.def.name);
  needing_repair_.erase(c.id);
  ids_.erase(c.id);
  variables_.erase(c.id);
}

void ClusterState::Acknowledge(VariableRecord& v, const Holder& h, int64_t version,
                               uint64_t checksum) {
  REPVAR_CHECK_MSG(
      h.replica >= 0 && static_cast<size_t>(h.replica) < v.replica_count() &&
          IsLive(v.placement[h.replica].task, h.incarnation),
      absl::StrCat("an acknowledgement of ", ReplicaName(v.def.name, h.replica), " by incarnation ",
                   h.incarnation, " of a worker that is not live"));
  const auto i = static_cast<size_t>(h.replica);
  ReplicaRecord r = Replica(v, i);
  r.version = version;
  r.checksum = checksum;
  r.incarnation = h.incarnation;
  const bool committed = version == v.version && checksum == v.checksum && v.version > 0;
  if (TransitionReplica(r.state, committed ? ReplicaEvent::kAcked : ReplicaEvent::kMissed,
                        v.def.name, h.replica)) {
    Moved();
  }
  SetReplica(v, i, r);
}

void ClusterState::AcknowledgeAllBut(VariableRecord& v, const std::vector<int32_t>& missing,
                                     int64_t version, uint64_t checksum) {
  // Those at the norm hold the committed value already (or take it, below,
  // when the norm moves); the exceptions acknowledge one by one.
  std::vector<int32_t> listed;
  for (const auto& [i, r] : v.exceptions) {
    if (!std::binary_search(missing.begin(), missing.end(), i)) listed.push_back(i);
  }
  for (int32_t i : listed) {
    const WorkerRecord* w = LiveWorker(v.placement[static_cast<size_t>(i)].task);
    REPVAR_CHECK_MSG(w != nullptr,
                     absl::StrCat("an acknowledgement of ", ReplicaName(v.def.name, i),
                                  " from a worker that is not live"));
    Acknowledge(v, Holder{i, w->incarnation}, version, checksum);
  }
}

void ClusterState::ApplyChange(const ValueCommitted& c) {
  VariableRecord& v = MustFind(c.id, "ValueCommitted");
  REPVAR_CHECK_MSG(c.version > v.version,
                   absl::StrCat("ValueCommitted moves ", v.def.name, " from version ", v.version,
                                " to ", c.version));
  // The replicas that do not take the value miss it (they sit steps out),
  // read before the norm moves.
  std::vector<int32_t> missing = c.holders.missing;
  if (!c.holders.all_but) {
    std::vector<bool> holds(v.replica_count(), false);
    for (const Holder& h : c.holders.listed) {
      REPVAR_CHECK_MSG(
          h.replica >= 0 && static_cast<size_t>(h.replica) < holds.size(),
          absl::StrCat("ValueCommitted names replica ", h.replica, " of ", v.def.name));
      holds[static_cast<size_t>(h.replica)] = true;
    }
    for (size_t i = 0; i < holds.size(); ++i) {
      if (!holds[i]) missing.push_back(static_cast<int32_t>(i));
    }
  }
  for (int32_t i : missing) MoveReplica(v, static_cast<size_t>(i), ReplicaEvent::kMissed);
  if (v.version == 0) Moved();  // the norm's replicas leave UNINITIALIZED
  v.version = c.version;
  v.checksum = c.checksum;
  v.value = c.value;
  if (c.initializer) v.initializer = *c.initializer;
  if (c.holders.all_but) {
    AcknowledgeAllBut(v, missing, c.version, c.checksum);
  } else {
    for (const Holder& h : c.holders.listed) Acknowledge(v, h, c.version, c.checksum);
  }
  Reassess(v);
  ++value_revision_;
}

void ClusterState::ApplyChange(const ValueKept& c) {
  // The coordinator's own copy of the committed value: no step sees it.
  VariableRecord& v = MustFind(c.id, "ValueKept");
  REPVAR_CHECK_MSG(c.version == v.version && c.checksum == v.checksum && c.value != nullptr &&
                       c.value->checksum == c.checksum,
                   absl::StrCat("ValueKept of ", v.def.name, " version ", c.version,
                                " is not its committed value (version ", v.version, ")"));
  v.value = c.value;
}

void ClusterState::ApplyChange(const WritePrepared& c) {
  for (const PreparedValue& p : c.values) {
    const VariableRecord& v = MustFind(p.id, "WritePrepared");
    REPVAR_CHECK_MSG(
        p.version == v.version + 1 && p.value != nullptr && p.value->checksum == p.checksum,
        absl::StrCat("WritePrepared of ", v.def.name, " version ", p.version,
                     " does not follow its committed version ", v.version));
  }
  const bool fresh = prepared_.emplace(c.fence, c).second;
  REPVAR_CHECK_MSG(fresh, absl::StrCat("WritePrepared with fence ", c.fence, " twice"));
}

void ClusterState::ApplyChange(const WriteResolved& c) {
  REPVAR_CHECK_MSG(prepared_.erase(c.fence) == 1,
                   absl::StrCat("WriteResolved of fence ", c.fence, ", which was not prepared"));
}

void ClusterState::ApplyChange(const ReplicasWritten& c) {
  VariableRecord& v = MustFind(c.id, "ReplicasWritten");
  if (c.holders.all_but) {
    REPVAR_CHECK_MSG(c.version == v.version && c.checksum == v.checksum,
                     absl::StrCat("ReplicasWritten of every replica of ", v.def.name,
                                  " with a value that is not the committed one"));
    AcknowledgeAllBut(v, c.holders.missing, c.version, c.checksum);
  } else {
    for (const Holder& h : c.holders.listed) Acknowledge(v, h, c.version, c.checksum);
  }
  Reassess(v);
}

void ClusterState::ApplyChange(const ResyncFlagged& c) {
  // The flag is the repair pass's; a step's layout does not read it.
  VariableRecord& v = MustFind(c.id, "ResyncFlagged");
  v.needs_resync = c.needs_resync;
  Reassess(v);
}

void ClusterState::ApplyChange(const StepBegun& c) {
  REPVAR_CHECK_MSG(c.epoch > last_epoch_, absl::StrCat("StepBegun reuses epoch ", c.epoch));
  last_epoch_ = c.epoch;
}

void ClusterState::ApplyChange(const StepCommitted& c) {
  REPVAR_CHECK_MSG(c.step > last_committed_step_ && c.epoch <= last_epoch_,
                   absl::StrCat("StepCommitted of step ", c.step, " (epoch ", c.epoch,
                                ") after step ", last_committed_step_));
  last_committed_step_ = c.step;
  last_step_ = LastStep{c.step, c.epoch, c.changed};
}

void ClusterState::ApplyChange(const StepFailed& c) {
  // Nothing committed; the record says the epoch ended (its id may be reused).
  REPVAR_CHECK_MSG(c.epoch <= last_epoch_,
                   absl::StrCat("StepFailed of epoch ", c.epoch, ", which never began"));
}

void ClusterState::ApplyChange(const FencesReserved& c) {
  REPVAR_CHECK_MSG(c.up_to > fences_reserved_,
                   absl::StrCat("FencesReserved moves the reservation from ", fences_reserved_,
                                " to ", c.up_to));
  fences_reserved_ = c.up_to;
}

void ClusterState::ApplyChange(const RequestRecorded& c) {
  if (c.key.id.empty()) return;
  auto [it, fresh] =
      outcomes_.try_emplace(c.key.id, StoredOutcome{c.op, c.key.digest, c.answer, c.at});
  if (fresh) outcome_order_.push_back(c.key.id);
  // Bounded by age only: an answer inside the window is never forgotten
  // (admission refuses new ids at the capacity instead: Outcome()).
  while (!outcome_order_.empty()) {
    auto oldest = outcomes_.find(outcome_order_.front());
    if (c.at - oldest->second.at <= options_.outcome_window) break;
    outcomes_.erase(oldest);
    outcome_order_.pop_front();
  }
}

const VariableRecord* ClusterState::Find(absl::string_view name) const {
  auto it = names_.find(name);
  return it == names_.end() ? nullptr : it->second;
}

const VariableRecord* ClusterState::FindId(uint64_t id) const {
  auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : it->second;
}

const WorkerRecord* ClusterState::Worker(const TaskKey& task) const {
  auto it = worker_index_.find(task);
  return it == worker_index_.end() ? nullptr : it->second;
}

const WorkerRecord* ClusterState::LiveWorker(const TaskKey& task) const {
  const WorkerRecord* w = Worker(task);
  return w != nullptr && w->IsLive() ? w : nullptr;
}

bool ClusterState::IsLive(const TaskKey& task, uint64_t incarnation) const {
  const WorkerRecord* w = LiveWorker(task);
  return w != nullptr && w->incarnation == incarnation;
}

VariableView ClusterState::View(const VariableRecord& v, VariableDetail detail) const {
  VariableView view;
  view.id = v.id;
  view.def = v.def;
  view.version = v.version;
  view.checksum = v.checksum;
  view.initialized = v.version > 0;
  view.needs_resync = v.needs_resync;
  view.collections.push_back(kGlobalVariables);
  if (v.def.trainable) view.collections.push_back(kTrainableVariables);
  for (const std::string& c : v.def.collections) {
    if (std::find(view.collections.begin(), view.collections.end(), c) == view.collections.end()) {
      view.collections.push_back(c);
    }
  }
  if (detail == VariableDetail::kBasic) return view;
  view.replicas.reserve(v.placement.size());
  for (size_t i = 0; i < v.placement.size(); ++i) {
    auto exception = v.exceptions.find(static_cast<int32_t>(i));
    const ReplicaRecord r = exception != v.exceptions.end()
                                ? exception->second
                                : ReplicaRecord{v.NormState(), v.version, v.checksum, 0};
    ReplicaView rv;
    rv.index = static_cast<int32_t>(i);
    rv.name = ReplicaName(v.def.name, rv.index);
    rv.device = v.placement[i].device;
    rv.task = v.placement[i].task;
    rv.version = r.version;
    rv.checksum = r.checksum;
    rv.state = r.state;
    view.replicas.push_back(std::move(rv));
  }
  return view;
}

TopologySnapshot ClusterState::Topology(
    const std::map<std::string, int32_t>& expected_tasks) const {
  TopologySnapshot s;
  s.version = topology_version_;
  for (const auto& [key, w] : workers_) {
    if (!w.IsLive() || w.joining) continue;
    s.tasks.push_back(LiveTask{key, w.address, w.incarnation, w.devices, absl::InfinitePast()});
    for (const DeviceName& d : w.devices) {
      if (d.IsAccelerator()) s.accelerators.push_back(Accelerator{0, d, key});
    }
  }
  std::sort(s.accelerators.begin(), s.accelerators.end(),
            [](const Accelerator& a, const Accelerator& b) { return a.device < b.device; });
  for (size_t i = 0; i < s.accelerators.size(); ++i) {
    s.accelerators[i].ordinal = static_cast<int32_t>(i);
  }
  if (!s.accelerators.empty()) {
    const Accelerator& first = s.accelerators.front();
    s.infeed_host = InfeedTask{first.task, workers_.at(first.task).address, first.device.HostCpu()};
  }
  for (const auto& [job, n] : expected_tasks) {
    for (int32_t i = 0; i < n; ++i) {
      const WorkerRecord* w = LiveWorker(TaskKey{job, i});
      if (w == nullptr || w->joining) {
        s.missing_tasks.push_back(TaskKey{job, i}.ToString());
      }
    }
  }
  return s;
}

absl::StatusOr<std::optional<Answer>> ClusterState::Outcome(const RequestKey& key,
                                                            absl::string_view op,
                                                            absl::Time now) const {
  if (key.id.empty()) return std::optional<Answer>();
  auto it = outcomes_.find(key.id);
  if (it == outcomes_.end() || now - it->second.at > options_.outcome_window) {
    // Room for its answer? Answers past the window go at the next record.
    size_t expired = 0;
    for (const std::string& id : outcome_order_) {
      if (now - outcomes_.at(id).at <= options_.outcome_window) break;
      ++expired;
    }
    const size_t within = outcomes_.size() - expired;
    if (within >= options_.outcome_capacity) {
      const absl::Duration wait =
          outcomes_.at(outcome_order_[expired]).at + options_.outcome_window - now;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the request-id table holds ", within, " answers from the last ",
          absl::FormatDuration(options_.outcome_window),
          " (its capacity); none may be forgotten inside that window, so a new request with an "
          "id is refused for ",
          absl::FormatDuration(wait),
          "; nothing was changed (retry later, or raise --idempotency_capacity)"));
    }
    return std::optional<Answer>();
  }
  if (it->second.op != op || it->second.digest != key.digest) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id \"", key.id, "\" was already used for another ", it->second.op,
                     " request with a different payload; use a fresh request_id"));
  }
  return std::optional<Answer>(it->second.answer);
}

namespace {

std::string AnswerText(const Answer& a) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return "delete";
        } else if constexpr (std::is_same_v<T, CreateAnswer>) {
          return absl::StrCat("create ", absl::StrJoin(x.names, ","), " ",
                              absl::StrJoin(x.created, ","), " ", absl::StrJoin(x.warnings, "|"));
        } else if constexpr (std::is_same_v<T, std::vector<InitializeResult>>) {
          std::string s = "initialize";
          for (const InitializeResult& r : x) {
            absl::StrAppend(&s, " ", r.name, ":", r.initialized_now, ":", r.version, ":",
                            r.checksum);
          }
          return s;
        } else {
          std::string s = "write";
          for (const WriteOutcome& w : x) absl::StrAppend(&s, " ", w.version, ":", w.checksum);
          return s;
        }
      },
      a);
}

}  // namespace

std::string ClusterState::Dump() const {
  std::string out;
  absl::StrAppend(&out, "next_variable_id ", next_variable_id_, "\ntopology_version ",
                  topology_version_, "\nlast_committed_step ", last_committed_step_,
                  "\nlast_epoch ", last_epoch_, "\nfences_reserved ", fences_reserved_,
                  "\nlast_step ", last_step_.step, " epoch ", last_step_.epoch, " changed");
  for (const CommittedVariable& c : last_step_.changed) {
    absl::StrAppend(&out, " ", c.variable_id, "/", c.name, "@", c.version, ":", c.checksum);
  }
  absl::StrAppend(&out, "\n");
  for (const auto& [key, w] : workers_) {
    std::vector<std::string> devices;
    for (const DeviceName& d : w.devices) devices.push_back(d.ToString());
    absl::StrAppend(&out, "worker ", key.ToString(), " ", WorkerStateName(w.state), " ",
                    w.incarnation, " ", w.address, " ", absl::StrJoin(devices, ","),
                    w.joining ? " joining" : "", "\n");
  }
  for (const auto& [id, v] : variables_) {
    absl::StrAppend(&out, "variable ", id, " ", v.def.name, " ", v.def.tensor.ToString(), " x",
                    v.def.replica_count, " ", AggregationName(v.def.aggregation), " version ",
                    v.version, " checksum ", v.checksum, " value ",
                    v.value ? absl::StrCat(v.value->checksum) : "replicas", " resync ",
                    v.needs_resync, " init ", static_cast<int>(v.initializer.kind), "\n");
    for (size_t i = 0; i < v.replica_count(); ++i) {
      const ReplicaRecord r = Replica(v, i);
      absl::StrAppend(&out, "  replica ", i, " on ", v.placement[i].device.ToString(), " ",
                      ReplicaStateName(r.state), " ", r.version, " ", r.checksum, " ",
                      r.incarnation, "\n");
    }
  }
  for (const std::string& id : outcome_order_) {
    const StoredOutcome& o = outcomes_.at(id);
    absl::StrAppend(&out, "request ", id, " ", o.op, " ", o.digest, " ", AnswerText(o.answer),
                    "\n");
  }
  for (const auto& [fence, p] : prepared_) {
    absl::StrAppend(&out, "prepared ", fence, " request ", p.outcome.key.id, " ",
                    AnswerText(p.outcome.answer));
    for (const PreparedValue& v : p.values) {
      absl::StrAppend(&out, " ", v.id, "@", v.version, ":", v.checksum);
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace repvar::server

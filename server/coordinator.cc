// SPDX-License-Identifier: Apache-2.0
#include "server/coordinator.h"

#include <algorithm>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_util.h"
#include "common/model/names.h"
#include "common/tensor/element_math.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

// Takes the write locks of `vars` in id order, so that batches never deadlock.
class WriteLocks {
 public:
  template <typename V>
  explicit WriteLocks(std::vector<V*> vars) {
    std::sort(vars.begin(), vars.end(), [](V* a, V* b) { return a->id < b->id; });
    vars.erase(std::unique(vars.begin(), vars.end()), vars.end());
    for (V* v : vars) locks_.push_back(std::make_unique<absl::MutexLock>(&v->write_mu));
  }

 private:
  std::vector<std::unique_ptr<absl::MutexLock>> locks_;
};

}  // namespace

// Wakes the waiters a change concerns, and only those: long polls of reports
// and finishes wait on step_cv_, which moves only when a step opens, starts
// aggregating or resolves (not on each of 32 reports); watchers of events
// wait on events_cv_.
// Callbacks to run once the step lock is released: declare it before the
// MutexLock, so that it is destroyed after it.
struct Coordinator::Wakers {
  std::vector<std::function<void()>> fns;
  ~Wakers() {
    for (auto& f : fns) f();
  }
};

class Coordinator::StepChangeNotifier {
 public:
  StepChangeNotifier(Coordinator* c, Wakers* wake) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->step_mu_)
      : c_(c), wake_(wake), seq_(c->steps_.next_event_seq()), state_(State()) {}
  ~StepChangeNotifier() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (c_->steps_.next_event_seq() != seq_) c_->events_cv_.SignalAll();
    if (State() != state_) {
      c_->step_cv_.SignalAll();
      for (auto& f : c_->step_wakers_) wake_->fns.push_back(std::move(f));
      c_->step_wakers_.clear();
    }
  }

 private:
  std::pair<uint64_t, int> State() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const StepInfo* open = c_->steps_.open();
    return open ? std::pair<uint64_t, int>{open->epoch, static_cast<int>(c_->steps_.open_state())}
                : std::pair<uint64_t, int>{0, 0};
  }
  Coordinator* const c_;
  Wakers* const wake_;
  const int64_t seq_;
  const std::pair<uint64_t, int> state_;
};

Coordinator::Coordinator(CoordinatorOptions options, Clock* clock, WorkerClient* workers)
    : options_(std::move(options)),
      clock_(clock),
      workers_(workers),
      membership_(options_.membership, clock),
      dedup_(options_.dedup_capacity, options_.dedup_window),
      steps_([this](const std::vector<StepParticipant>& p, size_t n,
                    bool fresh) { return StepGroup(p, n, fresh); },
             [this](const StepRecord& r) { return ApplyStepRecord(r); }) {}

absl::StatusOr<int64_t> Coordinator::RegisterWorker(const WorkerRegistration& reg) {
  REPVAR_ASSIGN_OR_RETURN(int64_t version, membership_.Register(reg));
  ResyncTask(TaskKey{reg.job, reg.task});
  return version;
}

absl::StatusOr<int64_t> Coordinator::Heartbeat(const TaskKey& key, uint64_t incarnation) {
  return membership_.Heartbeat(key, incarnation);
}

void Coordinator::Tick(absl::Time now) {
  std::vector<LiveTask> dead = membership_.CheckHeartbeats(now);
  Wakers wake;  // after the lock below is released
  absl::MutexLock lock(&step_mu_);
  StepChangeNotifier notify(this, &wake);
  for (const LiveTask& t : dead) steps_.WorkerDied(t.key, t.incarnation, now);
  steps_.Tick(now, [&](const TaskKey& task) -> std::string {
    std::optional<LiveTask> live = membership_.Find(task);
    if (!live) return "declared dead";
    return absl::StrCat("last heartbeat ", absl::ToDoubleSeconds(now - live->last_heartbeat),
                        " s ago");
  });
}

absl::StatusOr<std::shared_ptr<Coordinator::Variable>> Coordinator::Find(
    absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = variables_.find(name);
  if (it == variables_.end()) {
    return absl::NotFoundError(absl::StrCat("variable \"", name, "\" does not exist"));
  }
  return it->second;
}

VariableView Coordinator::ViewLocked(const Variable& v, const TopologySnapshot& topo) const {
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
  for (size_t i = 0; i < v.placement.size(); ++i) {
    const Placement& p = v.placement[i];
    const ReplicaRecord& r = v.replicas[i];
    ReplicaView rv;
    rv.index = static_cast<int32_t>(i);
    rv.name = ReplicaName(v.def.name, rv.index);
    rv.device = p.device;
    rv.task = p.task;
    rv.version = r.version;
    rv.checksum = r.checksum;
    const LiveTask* live = nullptr;
    for (const LiveTask& t : topo.tasks) {
      if (t.key == p.task) live = &t;
    }
    if (live == nullptr) {
      rv.state = ReplicaState::kUnavailable;
    } else if (v.version == 0) {
      rv.state = ReplicaState::kUninitialized;
    } else if (r.incarnation == live->incarnation && r.version == v.version &&
               r.checksum == v.checksum) {
      rv.state = ReplicaState::kUpToDate;
    } else {
      rv.state = ReplicaState::kStale;
    }
    view.replicas.push_back(std::move(rv));
  }
  return view;
}

absl::StatusOr<CreateResult> Coordinator::CreateVariables(const RequestKey& key,
                                                          const std::vector<CreateItem>& items) {
  if (items.empty()) return absl::InvalidArgumentError("create needs at least one variable");
  for (const CreateItem& item : items) {
    REPVAR_RETURN_IF_ERROR(ValidateVariableDef(item.def, options_.max_variable_bytes));
    if (item.initializer.kind == InitializerKind::kValue &&
        (item.initializer.value == nullptr || !(item.initializer.value->spec == item.def.tensor))) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", item.def.name, ": initializer value does not match its spec"));
    }
  }
  REPVAR_ASSIGN_OR_RETURN(auto cached, dedup_.Lookup(key, "create", clock_->Now()));
  if (cached) return std::any_cast<CreateResult>(*cached);

  TopologySnapshot topo = membership_.Snapshot();
  CreateResult result;
  {
    absl::MutexLock lock(&mu_);
    // Validate the whole batch against the registry before inserting anything.
    std::map<std::string, const VariableDef*, std::less<>> in_batch;
    for (const CreateItem& item : items) {
      const VariableDef& def = item.def;
      auto it = variables_.find(def.name);
      if (it != variables_.end() && !(it->second->def == def)) {
        const VariableDef& old = it->second->def;
        return absl::AlreadyExistsError(
            absl::StrCat("variable ", def.name, " already exists as ", old.tensor.ToString(), " x",
                         old.replica_count, " (aggregation ", static_cast<int>(old.aggregation),
                         ", trainable ", old.trainable, "); the request asks for ",
                         def.tensor.ToString(), " x", def.replica_count, " (aggregation ",
                         static_cast<int>(def.aggregation), ", trainable ", def.trainable, ")"));
      }
      auto [b, fresh] = in_batch.emplace(def.name, &def);
      if (!fresh && !(*b->second == def)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "variable ", def.name, " appears twice in the batch with different specs"));
      }
      if (it == variables_.end() &&
          static_cast<size_t>(def.replica_count) > topo.accelerators.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("variable ", def.name, " asks for ", def.replica_count,
                         " replicas but the cluster has ", topo.accelerators.size(),
                         " accelerators (topology version ", topo.version,
                         "); wait for the cluster to form or lower the replica count"));
      }
    }
    for (const CreateItem& item : items) {
      const VariableDef& def = item.def;
      auto it = variables_.find(def.name);
      if (it != variables_.end()) {
        result.variables.push_back(ViewLocked(*it->second, topo));
        result.created.push_back(false);
        continue;
      }
      std::vector<Placement> placement;
      std::set<TaskKey> hosts;
      for (int32_t i = 0; i < def.replica_count; ++i) {
        placement.push_back(Placement{topo.accelerators[i].device, topo.accelerators[i].task});
        hosts.insert(topo.accelerators[i].task);
      }
      auto v = std::make_shared<Variable>(next_id_++, def, std::move(placement));
      v->initializer = item.initializer;
      v->replicas.resize(def.replica_count);
      if (hosts.size() == 1) {
        result.warnings.push_back(absl::StrCat(
            "variable ", def.name, ": all ", def.replica_count, " replica(s) sit on one host (",
            hosts.begin()->ToString(), "); in-step data cannot survive the loss of that host"));
      }
      result.variables.push_back(ViewLocked(*v, topo));
      result.created.push_back(true);
      by_id_[v->id] = v;
      variables_.emplace(def.name, std::move(v));
    }
  }
  for (const std::string& w : result.warnings) spdlog::warn("{}", w);
  dedup_.Record(key, "create", result, clock_->Now());
  return result;
}

absl::StatusOr<VariableView> Coordinator::GetVariable(absl::string_view name) const {
  TopologySnapshot topo = membership_.Snapshot();
  absl::MutexLock lock(&mu_);
  auto it = variables_.find(name);
  if (it == variables_.end()) {
    return absl::NotFoundError(absl::StrCat("variable \"", name, "\" does not exist"));
  }
  return ViewLocked(*it->second, topo);
}

std::vector<VariableView> Coordinator::ListVariables(absl::string_view collection) const {
  TopologySnapshot topo = membership_.Snapshot();
  absl::MutexLock lock(&mu_);
  std::vector<VariableView> out;
  for (const auto& [name, v] : variables_) {
    VariableView view = ViewLocked(*v, topo);
    if (collection.empty() || std::find(view.collections.begin(), view.collections.end(),
                                        collection) != view.collections.end()) {
      out.push_back(std::move(view));
    }
  }
  return out;
}

absl::Status Coordinator::DeleteVariable(const RequestKey& key, absl::string_view name) {
  REPVAR_ASSIGN_OR_RETURN(auto cached, dedup_.Lookup(key, "delete", clock_->Now()));
  if (cached) return absl::OkStatus();
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<Variable> v, Find(name));
  {
    absl::MutexLock lock(&step_mu_);
    if (const StepInfo* open = steps_.open()) {
      for (const StepVariable& sv : open->variables) {
        if (sv.id == v->id) {
          return absl::FailedPreconditionError(
              absl::StrCat("variable ", name, " takes part in the open step ", open->step,
                           "; delete it after the step resolves"));
        }
      }
    }
  }
  std::set<TaskKey> tasks;
  {
    absl::MutexLock write(&v->write_mu);  // waits for an in-flight write
    absl::MutexLock lock(&mu_);
    if (v->deleted) {
      return absl::NotFoundError(absl::StrCat("variable \"", name, "\" does not exist"));
    }
    v->deleted = true;
    variables_.erase(v->def.name);
    by_id_.erase(v->id);
    for (const Placement& p : v->placement) tasks.insert(p.task);
  }
  dedup_.Record(key, "delete", true, clock_->Now());
  for (const TaskKey& t : tasks) {
    if (auto live = membership_.Find(t)) {
      absl::Status s = workers_->DropVariable({t, live->address, live->incarnation}, v->id);
      if (!s.ok()) {
        spdlog::warn("drop of {} on {} failed: {}", v->def.name, t.ToString(), s.ToString());
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<InitializeResult>> Coordinator::Initialize(
    const RequestKey& key, const std::vector<InitializeItem>& items) {
  if (items.empty()) return absl::InvalidArgumentError("initialize needs at least one variable");
  std::vector<std::shared_ptr<Variable>> vars;
  for (const InitializeItem& item : items) {
    REPVAR_ASSIGN_OR_RETURN(auto v, Find(item.name));
    vars.push_back(std::move(v));
  }
  std::vector<Variable*> raw;
  for (auto& v : vars) raw.push_back(v.get());
  WriteLocks locks(raw);
  REPVAR_ASSIGN_OR_RETURN(auto cached, dedup_.Lookup(key, "initialize", clock_->Now()));
  if (cached) return std::any_cast<std::vector<InitializeResult>>(*cached);

  // Decide who still needs a value, with which initializer.
  std::vector<std::optional<Initializer>> todo(items.size());
  {
    absl::MutexLock lock(&mu_);
    std::set<uint64_t> seen;
    for (size_t i = 0; i < items.size(); ++i) {
      Variable& v = *vars[i];
      if (v.deleted) {
        return absl::NotFoundError(absl::StrCat("variable \"", items[i].name, "\" was deleted"));
      }
      if (v.version > 0 || !seen.insert(v.id).second) continue;
      todo[i] = items[i].initializer ? *items[i].initializer : v.initializer;
    }
  }
  std::vector<PlannedWrite> writes;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!todo[i]) continue;
    auto value = MakeInitialValue(*todo[i], vars[i]->def.tensor);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("variable ", items[i].name, ": ", value.status().message()));
    }
    if (!vars[i]->def.allow_nonfinite) {
      if (int64_t bad = FirstNonFinite(*value); bad >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable ", items[i].name, ": initial value has a non-finite element at ",
                         bad, " (allow_nonfinite is off)"));
      }
    }
    writes.push_back(
        PlannedWrite{vars[i].get(), 1, std::make_shared<const Tensor>(*std::move(value))});
  }
  REPVAR_RETURN_IF_ERROR(Broadcast(writes));

  std::vector<InitializeResult> results;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      if (todo[i] && items[i].initializer) vars[i]->initializer = *items[i].initializer;
      results.push_back(InitializeResult{items[i].name, todo[i].has_value(), vars[i]->version,
                                         vars[i]->checksum});
    }
  }
  dedup_.Record(key, "initialize", results, clock_->Now());
  return results;
}

absl::Status Coordinator::ValidateAssignLocked(const Variable& v, const Assignment& item) const {
  if (v.deleted)
    return absl::NotFoundError(absl::StrCat("variable \"", item.name, "\" was deleted"));
  if (item.value == nullptr) return absl::InvalidArgumentError("assign without a value");
  if (!(item.value->spec == v.def.tensor)) {
    return absl::FailedPreconditionError(absl::StrCat("variable ", item.name, " is ",
                                                      v.def.tensor.ToString(), "; the value is ",
                                                      item.value->spec.ToString()));
  }
  if (item.op != AssignOp::kAssign && v.version == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "variable ", item.name, " is uninitialized; assign or initialize it before adding to it"));
  }
  if (!v.def.allow_nonfinite) {
    if (int64_t bad = FirstNonFinite(*item.value); bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("variable ", item.name,
                                                     ": non-finite value at element ", bad,
                                                     " (allow_nonfinite is off)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Tensor>> Coordinator::ComputeLocked(const Variable& v,
                                                                         const Assignment& item,
                                                                         const Tensor* base) const {
  if (item.op == AssignOp::kAssign) return item.value;
  REPVAR_ASSIGN_OR_RETURN(Tensor sum,
                          AddScaled(*base, *item.value, item.op == AssignOp::kAdd ? 1 : -1));
  if (!v.def.allow_nonfinite) {
    if (int64_t bad = FirstNonFinite(sum); bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("variable ", item.name,
                                                     ": the result is non-finite at element ", bad,
                                                     "; nothing changed"));
    }
  }
  return std::make_shared<const Tensor>(std::move(sum));
}

absl::StatusOr<WriteResult> Coordinator::Assign(const RequestKey& key, const Assignment& item) {
  REPVAR_ASSIGN_OR_RETURN(std::vector<WriteResult> r, AssignBatch(key, {item}));
  return r.front();
}

absl::StatusOr<std::vector<WriteResult>> Coordinator::AssignBatch(
    const RequestKey& key, const std::vector<Assignment>& items) {
  if (items.empty()) return absl::InvalidArgumentError("assign needs at least one variable");
  REPVAR_RETURN_IF_ERROR(EnterWriteGate());
  struct Leave {
    Coordinator* c;
    ~Leave() { c->LeaveWriteGate(); }
  } leave{this};
  std::vector<std::shared_ptr<Variable>> vars;
  std::set<absl::string_view> names;
  for (const Assignment& item : items) {
    if (!names.insert(item.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", item.name, " appears twice in one batched assign"));
    }
    REPVAR_ASSIGN_OR_RETURN(auto v, Find(item.name));
    vars.push_back(std::move(v));
  }
  std::vector<Variable*> raw;
  for (auto& v : vars) raw.push_back(v.get());
  WriteLocks locks(raw);
  absl::string_view op = items.size() == 1 ? "assign" : "assign_batch";
  REPVAR_ASSIGN_OR_RETURN(auto cached, dedup_.Lookup(key, op, clock_->Now()));
  if (cached) return std::any_cast<std::vector<WriteResult>>(*cached);

  // The write locks are held: versions and values cannot move under us, so
  // the new values can be computed outside mu_.
  std::vector<PlannedWrite> writes;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      REPVAR_RETURN_IF_ERROR(ValidateAssignLocked(*vars[i], items[i]));
    }
  }
  // AssignAdd/Sub start from the committed value (fetched from a replica
  // when a step changed it).
  std::vector<std::shared_ptr<const Tensor>> bases(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].op == AssignOp::kAssign) continue;
    REPVAR_ASSIGN_OR_RETURN(ReadResult base, CommittedValue(vars[i]));
    bases[i] = std::move(base.value);
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      REPVAR_ASSIGN_OR_RETURN(auto value, ComputeLocked(*vars[i], items[i], bases[i].get()));
      writes.push_back(PlannedWrite{vars[i].get(), vars[i]->version + 1, std::move(value)});
    }
  }
  REPVAR_RETURN_IF_ERROR(Broadcast(writes));
  std::vector<WriteResult> results;
  for (const PlannedWrite& w : writes) {
    results.push_back(WriteResult{w.version, w.value->checksum, nullptr});
  }
  // The dedup table remembers versions and checksums, never tensor bytes.
  dedup_.Record(key, op, results, clock_->Now());
  for (size_t i = 0; i < writes.size(); ++i) results[i].value = writes[i].value;
  return results;
}

absl::Status Coordinator::Broadcast(std::vector<PlannedWrite>& writes) {
  TopologySnapshot topo = membership_.Snapshot();
  std::map<TaskKey, const LiveTask*> live;
  for (const LiveTask& t : topo.tasks) live[t.key] = &t;

  // Group the replicas each live worker holds.
  std::map<TaskKey, std::vector<ReplicaWrite>> per_task;
  for (const PlannedWrite& w : writes) {
    const Variable& v = *w.variable;
    std::map<TaskKey, std::vector<int32_t>> replicas;
    for (size_t i = 0; i < v.placement.size(); ++i) {
      if (live.contains(v.placement[i].task)) {
        replicas[v.placement[i].task].push_back(static_cast<int32_t>(i));
      }
    }
    for (auto& [task, idx] : replicas) {
      per_task[task].push_back(ReplicaWrite{v.id, v.def.name, w.version, std::move(idx), w.value});
    }
  }
  std::vector<const LiveTask*> tasks;
  std::vector<std::vector<ReplicaWrite>> batches;
  for (auto& [task, rw] : per_task) {
    tasks.push_back(live[task]);
    batches.push_back(std::move(rw));
  }
  std::vector<absl::Status> status(tasks.size());
  auto call = [&](size_t i) {
    const LiveTask& t = *tasks[i];
    status[i] = workers_->WriteReplicas(WorkerTarget{t.key, t.address, t.incarnation}, batches[i]);
  };
  auto run_all = [&] {
    // All workers in parallel; the last call runs on this thread.
    std::vector<std::thread> threads;
    for (size_t i = 0; i + 1 < tasks.size(); ++i) threads.emplace_back(call, i);
    if (!tasks.empty()) call(tasks.size() - 1);
    for (std::thread& t : threads) t.join();
  };
  bool step_open;
  {
    absl::MutexLock lock(&step_mu_);
    step_open = steps_.open() != nullptr;
  }
  if (!step_open) {
    // (During a step the workers' data plane belongs to the step's
    // collectives, so writes of new variables go the plain way.)
    absl::MutexLock dp(&data_plane_mu_);
    if (PlanCollective(batches, tasks)) {
      run_all();
      for (const absl::Status& s : status) {
        if (!s.ok()) {
          // A failed collective leaves gloo contexts unusable: the next one
          // builds a fresh group.
          ++group_generation_;
          break;
        }
      }
    }
  }
  if (!batches.empty() && !batches[0].empty() && !batches[0][0].collective) run_all();

  std::vector<std::string> failures;
  absl::flat_hash_map<uint64_t, const PlannedWrite*> by_id;
  for (const PlannedWrite& w : writes) by_id[w.variable->id] = &w;
  absl::MutexLock lock(&mu_);
  for (size_t c = 0; c < tasks.size(); ++c) {
    const LiveTask& t = *tasks[c];
    if (!status[c].ok()) {
      failures.push_back(absl::StrCat(t.key.ToString(), ": ", status[c].ToString()));
      continue;
    }
    for (const ReplicaWrite& rw : batches[c]) {
      const PlannedWrite& w = *by_id.at(rw.variable_id);
      for (int32_t i : rw.replicas) {
        w.variable->replicas[i] = ReplicaRecord{w.version, w.value->checksum, t.incarnation};
      }
    }
  }
  if (!failures.empty()) {
    std::vector<std::string> names;
    for (PlannedWrite& w : writes) {
      w.variable->needs_resync = true;
      names.push_back(w.variable->def.name);
    }
    return absl::UnavailableError(
        absl::StrCat("write of ", absl::StrJoin(names, ", "), " did not reach every live replica (",
                     absl::StrJoin(failures, "; "),
                     "); the committed version is unchanged and the variable is marked for resync; "
                     "retry with the same request_id"));
  }
  for (PlannedWrite& w : writes) {
    Variable& v = *w.variable;
    if (v.deleted) continue;
    v.version = w.version;
    v.checksum = w.value->checksum;
    v.value = w.value;
    v.needs_resync = false;
  }
  return absl::OkStatus();
}

bool Coordinator::PlanCollective(std::vector<std::vector<ReplicaWrite>>& batches,
                                 const std::vector<const LiveTask*>& tasks) {
  if (!options_.data_plane || tasks.size() < static_cast<size_t>(options_.data_plane_min_workers) ||
      tasks.size() < 2) {
    return false;
  }
  for (const auto& b : batches) {
    if (b.size() != 1 || b[0].value->bytes.size() < options_.data_plane_min_bytes) return false;
  }
  // The group is the member set (tasks and incarnations, in order) and a
  // generation that moves on after a failed collective.
  std::string members;
  for (const LiveTask* t : tasks)
    absl::StrAppend(&members, t->key.ToString(), "@", t->incarnation, ";");
  std::string group = GroupLocked(members);
  uint32_t tag = next_tag_++;
  absl::Duration timeout =
      absl::Seconds(30) +
      absl::Seconds(static_cast<double>(batches[0][0].value->bytes.size()) / 50e6);
  for (size_t i = 0; i < batches.size(); ++i) {
    batches[i][0].collective = CollectiveSpec{
        group, static_cast<int32_t>(i), static_cast<int32_t>(tasks.size()), 0, tag, timeout};
  }
  return true;
}

void Coordinator::ResyncTask(const TaskKey& task) {
  std::optional<LiveTask> live = membership_.Find(task);
  if (!live) return;
  std::vector<std::shared_ptr<Variable>> vars;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, v] : variables_) {
      for (const Placement& p : v->placement) {
        if (p.task == task) {
          vars.push_back(v);
          break;
        }
      }
    }
  }
  if (vars.empty()) return;
  std::vector<Variable*> raw;
  for (auto& v : vars) raw.push_back(v.get());
  WriteLocks locks(raw);
  // Committed values first (a step may have left only replicas holding them).
  std::vector<std::shared_ptr<const Tensor>> keep;
  for (const auto& v : vars) {
    bool initialized;
    {
      absl::MutexLock lock(&mu_);
      initialized = !v->deleted && v->version > 0;
    }
    if (!initialized) continue;
    absl::StatusOr<ReadResult> r = CommittedValue(v);
    if (!r.ok()) {
      spdlog::warn("resync of {} on {}: {}", v->def.name, task.ToString(), r.status().ToString());
      continue;
    }
    keep.push_back(r->value);
  }
  std::vector<ReplicaWrite> writes;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& v : vars) {
      if (v->deleted || v->version == 0 || v->value == nullptr) continue;
      std::vector<int32_t> stale;
      for (size_t i = 0; i < v->placement.size(); ++i) {
        const ReplicaRecord& r = v->replicas[i];
        if (v->placement[i].task == task &&
            (r.incarnation != live->incarnation || r.version != v->version ||
             r.checksum != v->checksum)) {
          stale.push_back(static_cast<int32_t>(i));
        }
      }
      if (stale.empty()) continue;
      writes.push_back(ReplicaWrite{v->id, v->def.name, v->version, std::move(stale), v->value});
    }
  }
  if (writes.empty()) return;
  absl::Status s =
      workers_->WriteReplicas(WorkerTarget{task, live->address, live->incarnation}, writes);
  if (!s.ok()) {
    spdlog::warn("resync of {} replica set(s) on {} failed: {}", writes.size(), task.ToString(),
                 s.ToString());
    return;
  }
  absl::flat_hash_map<uint64_t, Variable*> by_id;
  for (const auto& v : vars) by_id[v->id] = v.get();
  absl::MutexLock lock(&mu_);
  for (const ReplicaWrite& rw : writes) {
    for (int32_t i : rw.replicas) {
      by_id.at(rw.variable_id)->replicas[i] =
          ReplicaRecord{rw.version, rw.value->checksum, live->incarnation};
    }
  }
  spdlog::info("resynced {} variable(s) on {}", writes.size(), task.ToString());
}

void Coordinator::ResyncStale() {
  TopologySnapshot topo = membership_.Snapshot();
  std::map<TaskKey, uint64_t> live;
  for (const LiveTask& t : topo.tasks) live[t.key] = t.incarnation;
  auto stale_on = [&](const Variable& v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::set<TaskKey> out;
    if (v.deleted || v.version == 0) return out;
    for (size_t i = 0; i < v.placement.size(); ++i) {
      auto l = live.find(v.placement[i].task);
      const ReplicaRecord& r = v.replicas[i];
      if (l != live.end() &&
          (r.incarnation != l->second || r.version != v.version || r.checksum != v.checksum)) {
        out.insert(l->first);
      }
    }
    return out;
  };
  std::set<TaskKey> tasks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, v] : variables_) tasks.merge(stale_on(*v));
  }
  for (const TaskKey& t : tasks) ResyncTask(t);
  absl::MutexLock lock(&mu_);
  for (const auto& [name, v] : variables_) {
    if (v->needs_resync && stale_on(*v).empty()) v->needs_resync = false;
  }
}

absl::StatusOr<ReadResult> Coordinator::Read(absl::string_view name) {
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<Variable> v, Find(name));
  return CommittedValue(v);
}

absl::StatusOr<ReadResult> Coordinator::CommittedValue(const std::shared_ptr<Variable>& v) {
  // Right after a step commits, a worker may not have installed the new
  // value yet: retry briefly when a replica answers with an older version.
  std::string last_error = "no up-to-date replica is live";
  for (int attempt = 0; attempt < 50; ++attempt) {
    int64_t version;
    uint64_t checksum;
    std::vector<std::pair<int32_t, TaskKey>> candidates;
    {
      absl::MutexLock lock(&mu_);
      if (v->version == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "variable ", v->def.name, " is uninitialized; initialize or assign it first"));
      }
      if (v->value != nullptr) return ReadResult{v->version, v->value};
      version = v->version;
      checksum = v->checksum;
      for (size_t i = 0; i < v->placement.size(); ++i) {  // primary first
        const ReplicaRecord& r = v->replicas[i];
        if (r.version == version && r.checksum == checksum) {
          candidates.emplace_back(static_cast<int32_t>(i), v->placement[i].task);
        }
      }
    }
    for (const auto& [replica, task] : candidates) {
      std::optional<LiveTask> live = membership_.Find(task);
      if (!live) continue;
      auto got = workers_->ReadReplica(WorkerTarget{task, live->address, live->incarnation}, v->id,
                                       replica);
      if (!got.ok()) {
        last_error = absl::StrCat(task.ToString(), ": ", got.status().ToString());
        continue;
      }
      if (got->version != version || got->value->checksum != checksum) {
        last_error = absl::StrCat(task.ToString(), " still holds version ", got->version);
        continue;
      }
      absl::MutexLock lock(&mu_);
      if (v->version == version && v->value == nullptr) v->value = got->value;
      return ReadResult{version, got->value};
    }
    if (candidates.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + attempt));
  }
  return absl::UnavailableError(absl::StrCat(
      "variable ", v->def.name, ": no up-to-date replica could be read (", last_error, ")"));
}

std::string Coordinator::GroupLocked(const std::string& members) {
  std::string group =
      absl::StrCat("g", group_generation_, "-",
                   absl::Hex(Checksum(std::as_bytes(std::span(members.data(), members.size())))));
  if (group != group_) {
    if (!group_.empty()) store_.DeletePrefix(group_ + "/");
    group_ = group;
  }
  return group;
}

// ---- Replicated steps ----

absl::Status Coordinator::EnterWriteGate() {
  absl::MutexLock lock(&step_mu_);
  if (const StepInfo* open = steps_.open()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", open->step, " is open: cross-replica writes are refused until it resolves (S5)"));
  }
  if (step_beginning_) {
    return absl::FailedPreconditionError(
        "a step is beginning: cross-replica writes are refused until it resolves (S5)");
  }
  ++writes_in_flight_;
  return absl::OkStatus();
}

void Coordinator::LeaveWriteGate() {
  absl::MutexLock lock(&step_mu_);
  --writes_in_flight_;
  step_cv_.SignalAll();
}

namespace {
StepInfo Copy(const Coordinator::SharedStep& s) {
  StepInfo info = *s.info;
  info.state = s.state;
  return info;
}
}  // namespace

absl::StatusOr<StepInfo> Coordinator::BeginStep(int64_t step, absl::Duration barrier_timeout) {
  REPVAR_ASSIGN_OR_RETURN(SharedStep s, BeginStepShared(step, barrier_timeout));
  return Copy(s);
}

absl::StatusOr<StepInfo> Coordinator::GetStep(uint64_t epoch) const {
  REPVAR_ASSIGN_OR_RETURN(SharedStep s, GetStepShared(epoch));
  return Copy(s);
}

absl::StatusOr<Coordinator::SharedStep> Coordinator::BeginStepShared(
    int64_t step, absl::Duration barrier_timeout) {
  if (barrier_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("a step needs a positive barrier timeout");
  }
  Wakers wake;  // after the lock below is released
  absl::MutexLock lock(&step_mu_);
  while (step_beginning_) step_cv_.Wait(&step_mu_);
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<const StepInfo> open, steps_.CheckBegin(step));
  if (open) return SharedStep{open, *steps_.state(open->epoch)};
  // S1: no new cross-replica write may start; wait for those in flight.
  step_beginning_ = true;
  while (writes_in_flight_ > 0) step_cv_.Wait(&step_mu_);

  // Participants: the live tasks (topo.tasks is sorted by task) holding an
  // up-to-date replica of an initialized variable, in that order.
  TopologySnapshot topo = membership_.Snapshot();
  std::map<TaskKey, int32_t> live;  // task -> index in topo.tasks
  for (size_t i = 0; i < topo.tasks.size(); ++i) live[topo.tasks[i].key] = static_cast<int32_t>(i);
  StepInfo info;
  info.step = step;
  info.barrier_timeout = barrier_timeout;
  std::vector<bool> holds(topo.tasks.size(), false);
  {
    absl::MutexLock registry(&mu_);
    std::vector<std::shared_ptr<Variable>> vars;
    for (const auto& [id, v] : by_id_) {
      if (!v->deleted && v->version > 0) vars.push_back(v);
    }
    std::sort(vars.begin(), vars.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
    for (const auto& v : vars) {
      StepVariable sv;
      sv.id = v->id;
      sv.name = v->def.name;
      sv.aggregation = v->def.aggregation;
      sv.spec = v->def.tensor;
      sv.begin_version = v->version;
      sv.begin_checksum = v->checksum;
      sv.allow_nonfinite = v->def.allow_nonfinite;
      sv.replica_participant.reserve(v->placement.size());
      for (size_t i = 0; i < v->placement.size(); ++i) {
        const ReplicaRecord& r = v->replicas[i];
        auto l = live.find(v->placement[i].task);
        bool up = l != live.end() && r.incarnation == topo.tasks[l->second].incarnation &&
                  r.version == v->version && r.checksum == v->checksum;
        // For now the index in topo.tasks; remapped to participants below.
        sv.replica_participant.push_back(up ? l->second : -1);
        if (up) holds[l->second] = true;
      }
      info.variables.push_back(std::move(sv));
    }
  }
  std::vector<int32_t> rank(topo.tasks.size(), -1);
  for (size_t i = 0; i < topo.tasks.size(); ++i) {
    if (!holds[i]) continue;
    rank[i] = static_cast<int32_t>(info.participants.size());
    const LiveTask& l = topo.tasks[i];
    info.participants.push_back(StepParticipant{l.key, l.incarnation, l.address});
  }
  for (StepVariable& sv : info.variables) {
    for (int32_t& p : sv.replica_participant) {
      if (p >= 0) p = rank[p];
    }
  }
  info.layout_id = LayoutId(info);
  step_beginning_ = false;
  StepChangeNotifier notify(this, &wake);
  const uint64_t epoch = steps_.Open(std::move(info), clock_->Now());
  SharedStep opened{steps_.shared_info(epoch), *steps_.state(epoch)};
  spdlog::info("step {} (epoch {}) begun: {} participant(s), {} variable(s)", step, epoch,
               opened.info->participants.size(), opened.info->variables.size());
  return opened;
}

absl::StatusOr<Coordinator::SharedStep> Coordinator::GetStepShared(uint64_t epoch) const {
  absl::MutexLock lock(&step_mu_);
  std::shared_ptr<const StepInfo> info = steps_.shared_info(epoch);
  if (!info) return absl::NotFoundError(absl::StrCat("no step with epoch ", epoch, " is known"));
  return SharedStep{std::move(info), *steps_.state(epoch)};
}

absl::Status Coordinator::AbortStep(uint64_t epoch, absl::string_view reason) {
  Wakers wake;  // after the lock below is released
  absl::MutexLock lock(&step_mu_);
  StepChangeNotifier notify(this, &wake);
  return steps_.Abort(epoch, reason, clock_->Now());
}

absl::Status Coordinator::ReportStep(const WorkerReport& report) {
  Wakers wake;  // after the lock below is released
  absl::MutexLock lock(&step_mu_);
  StepChangeNotifier notify(this, &wake);
  return steps_.Report(report, clock_->Now());
}

absl::Status Coordinator::FinishStep(const WorkerFinish& finish) {
  Wakers wake;  // after the lock below is released
  absl::MutexLock lock(&step_mu_);
  StepChangeNotifier notify(this, &wake);
  return steps_.Finish(finish, clock_->Now());
}

absl::StatusOr<std::variant<StepPlan, StepResolution>> Coordinator::WaitStepPlan(
    uint64_t epoch, absl::Time deadline) {
  absl::MutexLock lock(&step_mu_);
  while (true) {
    if (const StepPlan* p = steps_.plan(epoch)) return *p;
    if (const StepResolution* r = steps_.resolution(epoch)) return *r;
    if (!steps_.state(epoch)) {
      return absl::NotFoundError(absl::StrCat("no step with epoch ", epoch, " is known"));
    }
    if (step_cv_.WaitWithDeadline(&step_mu_, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("the barrier of epoch ", epoch, " has not resolved yet"));
    }
  }
}

absl::StatusOr<StepResolution> Coordinator::WaitStepResolution(uint64_t epoch,
                                                               absl::Time deadline) {
  absl::MutexLock lock(&step_mu_);
  while (true) {
    if (const StepResolution* r = steps_.resolution(epoch)) return *r;
    if (!steps_.state(epoch)) {
      return absl::NotFoundError(absl::StrCat("no step with epoch ", epoch, " is known"));
    }
    if (step_cv_.WaitWithDeadline(&step_mu_, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("the step of epoch ", epoch, " has not resolved yet"));
    }
  }
}

void Coordinator::WhenStepPlanned(uint64_t epoch, PlanCallback done) {
  absl::StatusOr<std::variant<StepPlan, StepResolution>> ready;
  {
    absl::MutexLock lock(&step_mu_);
    if (steps_shut_down_) {
      ready = absl::UnavailableError("the coordinator is shutting down");
    } else if (const StepPlan* p = steps_.plan(epoch)) {
      ready = *p;
    } else if (const StepResolution* r = steps_.resolution(epoch)) {
      ready = *r;
    } else if (!steps_.state(epoch)) {
      ready = absl::NotFoundError(absl::StrCat("no step with epoch ", epoch, " is known"));
    } else {
      // Checked and registered under one lock: no change can slip between.
      step_wakers_.push_back([this, epoch, done] { WhenStepPlanned(epoch, done); });
      return;
    }
  }
  done(std::move(ready));
}

void Coordinator::WhenStepResolved(uint64_t epoch, ResolutionCallback done) {
  absl::StatusOr<StepResolution> ready;
  {
    absl::MutexLock lock(&step_mu_);
    if (steps_shut_down_) {
      ready = absl::UnavailableError("the coordinator is shutting down");
    } else if (const StepResolution* r = steps_.resolution(epoch)) {
      ready = *r;
    } else if (!steps_.state(epoch)) {
      ready = absl::NotFoundError(absl::StrCat("no step with epoch ", epoch, " is known"));
    } else {
      step_wakers_.push_back([this, epoch, done] { WhenStepResolved(epoch, done); });
      return;
    }
  }
  done(std::move(ready));
}

void Coordinator::ShutdownStepWaiters() {
  Wakers wake;
  absl::MutexLock lock(&step_mu_);
  steps_shut_down_ = true;
  wake.fns.swap(step_wakers_);
}

StepsStatus Coordinator::GetSteps() const {
  absl::MutexLock lock(&step_mu_);
  StepsStatus out;
  if (const StepInfo* open = steps_.open()) {
    out.open = *open;
    out.open->state = steps_.open_state();
  }
  out.progress = steps_.progress(clock_->Now());
  out.recent.assign(steps_.recent().begin(), steps_.recent().end());
  out.last_committed_step = steps_.last_committed_step();
  return out;
}

std::vector<StepEvent> Coordinator::WaitStepEvents(int64_t after_seq, absl::Time deadline) {
  absl::MutexLock lock(&step_mu_);
  while (steps_.next_event_seq() <= after_seq + 1) {
    if (events_cv_.WaitWithDeadline(&step_mu_, deadline)) break;
  }
  return steps_.EventsAfter(after_seq);
}

std::pair<std::string, uint32_t> Coordinator::StepGroup(
    const std::vector<StepParticipant>& participants, size_t tags, bool fresh) {
  absl::MutexLock dp(&data_plane_mu_);
  // A failed step may have left gloo contexts broken: start a new generation.
  if (fresh) ++group_generation_;
  std::string members;
  for (const StepParticipant& p : participants) {
    absl::StrAppend(&members, p.task.ToString(), "@", p.incarnation, ";");
  }
  std::string group = GroupLocked(members);
  uint32_t first = next_tag_;
  next_tag_ += static_cast<uint32_t>(tags);
  return {group, first};
}

absl::Status Coordinator::ApplyStepRecord(const StepRecord& record) {
  absl::MutexLock lock(&mu_);
  for (const StepRecord::Variable& rv : record.variables) {
    auto it = by_id_.find(rv.id);
    if (it == by_id_.end()) continue;
    Variable& v = *it->second;
    v.version = rv.version;
    v.checksum = rv.checksum;
    if (rv.changed) v.value = nullptr;  // now held by the replicas only
    for (const auto& [replica, incarnation] : rv.replicas) {
      v.replicas[replica] = ReplicaRecord{rv.version, rv.checksum, incarnation};
    }
  }
  return absl::OkStatus();
}

}  // namespace repvar::server

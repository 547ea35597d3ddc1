// SPDX-License-Identifier: Apache-2.0
// The coordinator's state that must survive a restart: workers and their
// incarnations, variables with their placement, committed versions and
// values, what each replica holds, step ids and epochs, and the answers to
// mutating requests. Apply(Record) is the only code that changes it; replaying
// the records a coordinator applied into an empty ClusterState gives the same
// state (tests/server/core/replay_test.cc).
//
// Liveness (last heartbeats), open steps and caches are not here: they do not
// survive a restart (docs/architecture.md: an open step is aborted; workers
// reconnect).
//
// Not thread-safe: Registry owns it under its mutex.
#ifndef REPVAR_SERVER_CORE_CLUSTER_STATE_H_
#define REPVAR_SERVER_CORE_CLUSTER_STATE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/topology.h"
#include "common/model/variable.h"
#include "server/core/record.h"
#include "server/core/replica_state.h"
#include "server/core/worker_state.h"

namespace repvar::server {

struct ReplicaRecord {
  ReplicaState state = ReplicaState::kUninitialized;
  // What the replica was last acknowledged to hold, and by which
  // incarnation of its worker.
  int64_t version = 0;
  uint64_t checksum = 0;
  uint64_t incarnation = 0;
  friend bool operator==(const ReplicaRecord&, const ReplicaRecord&) = default;
};

// A variable's replicas are kept as exceptions to a norm (docs/architecture.md,
// "Replica state"): a replica not in `exceptions` is UNINITIALIZED (version,
// checksum and incarnation 0) while the variable is, and afterwards
// UP_TO_DATE at the committed version and checksum, acknowledged by its
// worker's incarnation, which is live. A variable whose replicas all hold its
// value costs nothing per replica, however many it has.
struct VariableRecord {
  uint64_t id = 0;
  VariableDef def;
  Placements placement;
  Initializer initializer;
  int64_t version = 0;  // 0: uninitialized
  uint64_t checksum = 0;
  std::shared_ptr<const Tensor> value;          // null once a step changed it
  std::map<int32_t, ReplicaRecord> exceptions;  // by replica index
  bool needs_resync = false;

  size_t replica_count() const { return placement.size(); }
  ReplicaState NormState() const {
    return version == 0 ? ReplicaState::kUninitialized : ReplicaState::kUpToDate;
  }
  ReplicaState StateOf(size_t i) const {
    auto it = exceptions.find(static_cast<int32_t>(i));
    return it == exceptions.end() ? NormState() : it->second.state;
  }
};

struct WorkerRecord {
  TaskKey task;
  std::string address;
  uint64_t incarnation = 0;
  std::vector<DeviceName> devices;  // sorted
  WorkerState state = WorkerState::kUnknown;
  bool joining = false;  // registered, not listed until WorkerJoined

  bool IsLive() const { return state == WorkerState::kLive; }
};

// A mutating request's answer, kept for its retries (C6).
struct StoredOutcome {
  std::string op;
  uint64_t digest = 0;
  Answer answer;
  absl::Time at;
};

// The last committed step and what it changed (StepCommitted).
struct LastStep {
  int64_t step = 0;
  uint64_t epoch = 0;  // 0: none committed
  std::vector<CommittedVariable> changed;
};

// Everything a ClusterState holds, as plain data: what a checkpoint of the
// state log saves, and what ClusterState::Restore takes back.
struct ClusterStateData {
  std::map<uint64_t, VariableRecord> variables;  // by id
  uint64_t next_variable_id = 1;
  std::map<TaskKey, WorkerRecord> workers;
  int64_t topology_version = 0;
  int64_t last_committed_step = 0;
  uint64_t last_epoch = 0;
  uint64_t fences_reserved = 0;
  LastStep last_step;
  std::vector<std::pair<std::string, StoredOutcome>> outcomes;  // by id, oldest first
  std::vector<WritePrepared> prepared;                          // unresolved writes
};

struct ClusterStateOptions {
  // Answers of mutating requests are kept for retries (C6) for the window,
  // never forgotten inside it. At the capacity, a new request with an id is
  // refused (RESOURCE_EXHAUSTED) until the oldest answers age out; requests
  // in flight when it filled may take it a little past (they were admitted).
  size_t outcome_capacity = 1000000;
  absl::Duration outcome_window = absl::Hours(1);
};

class ClusterState {
 public:
  explicit ClusterState(ClusterStateOptions options = {}) : options_(options) {}
  // names_ and ids_ point into variables_: a copy would point into the
  // original.
  ClusterState(const ClusterState&) = delete;
  ClusterState& operator=(const ClusterState&) = delete;

  // Takes back a state saved from another ClusterState (a checkpoint). The
  // state must be empty (nothing applied yet); data that contradicts itself
  // (a replica count that is not the placement's, a name twice) is an
  // error, and nothing changes.
  absl::Status Restore(ClusterStateData data);

  // Applies every change of `record`, in order. A change that contradicts
  // the state (an unknown variable, an illegal replica or worker transition)
  // is a bug in the code that built the record: it crashes, naming it.
  void Apply(const Record& record);

  // Variables.
  const VariableRecord* Find(absl::string_view name) const;
  const VariableRecord* FindId(uint64_t id) const;
  const std::map<uint64_t, VariableRecord>& variables() const { return variables_; }
  // The variables a repair pass looks at (F2): those flagged for resync and
  // those with a STALE replica, kept up to date as changes apply, so that a
  // pass costs what needs repair rather than the number of variables.
  const std::set<uint64_t>& needing_repair() const { return needing_repair_; }
  uint64_t next_variable_id() const { return next_variable_id_; }
  // Moves whenever what a step's layout is made of changes: a worker, a
  // variable created, deleted or first initialized, a replica's state. Not
  // on a new committed value whose replicas all took it, nor on the records
  // of requests, steps, fences or prepared writes: what was derived from
  // the workers, variables and replica states at one revision holds while
  // it stays.
  uint64_t layout_revision() const { return layout_revision_; }
  // Moves whenever a variable's committed version or checksum changes, and
  // with layout_revision().
  uint64_t value_revision() const { return value_revision_; }
  // Replica `i` of `v` in full: its exception, or the norm with its
  // worker's incarnation.
  ReplicaRecord Replica(const VariableRecord& v, size_t i) const;
  // kBasic leaves the replicas out.
  VariableView View(const VariableRecord& v, VariableDetail detail = VariableDetail::kFull) const;

  // Workers.
  const WorkerRecord* Worker(const TaskKey& task) const;
  const std::map<TaskKey, WorkerRecord>& workers() const { return workers_; }
  // The worker of `task` when it is live; null otherwise.
  const WorkerRecord* LiveWorker(const TaskKey& task) const;
  // Whether `task` is live under `incarnation`.
  bool IsLive(const TaskKey& task, uint64_t incarnation) const;
  // Whether every replica `task` holds is the norm (up to date at the
  // committed value, or every one of the variable uninitialized): what a
  // read lease needs (docs/architecture.md, "Local reads"). A scan of the
  // variables only for a task that had an exception since it was last
  // found clean.
  bool HoldsOnlyNorm(const TaskKey& task) const;
  // The live workers, the accelerators in ordinal order (T2), the infeed host
  // (T3) and the expected tasks that are missing; heartbeats left unset.
  // Joining workers are left out (and count as missing).
  TopologySnapshot Topology(const std::map<std::string, int32_t>& expected_tasks) const;
  int64_t topology_version() const { return topology_version_; }

  // Steps.
  int64_t last_committed_step() const { return last_committed_step_; }
  const LastStep& last_step() const { return last_step_; }
  uint64_t last_epoch() const { return last_epoch_; }

  // Fencing tokens (ReplicaWrite::fence) at or below this were reserved;
  // tokens handed out after a restart are above it.
  uint64_t fences_reserved() const { return fences_reserved_; }

  // The answer recorded for `key` (nullopt: none, or older than the window
  // at `now`). Errors: INVALID_ARGUMENT when the id was used for another
  // operation or payload; RESOURCE_EXHAUSTED when there is none and the
  // table already holds `outcome_capacity` answers from within the window
  // (a new request would have no room for its answer).
  absl::StatusOr<std::optional<Answer>> Outcome(const RequestKey& key, absl::string_view op,
                                                absl::Time now) const;

  // Writes prepared and not yet resolved (WritePrepared), by fence: after a
  // restart, those to roll forward.
  const std::map<uint64_t, WritePrepared>& prepared() const { return prepared_; }

  // Calls `fn(id, outcome)` for every recorded answer, oldest first.
  template <typename F>
  void ForEachOutcome(F&& fn) const {
    for (const std::string& id : outcome_order_) fn(id, outcomes_.at(id));
  }

  // The whole state as text, in a fixed order: two states are the same when
  // their dumps are.
  std::string Dump() const;

 private:
  void ApplyChange(const WorkerRegistered& c);
  void ApplyChange(const WorkerDied& c);
  void ApplyChange(const VariableCreated& c);
  void ApplyChange(const VariableDeleted& c);
  void ApplyChange(const ValueCommitted& c);
  void ApplyChange(const ReplicasWritten& c);
  void ApplyChange(const ResyncFlagged& c);
  void ApplyChange(const StepBegun& c);
  void ApplyChange(const StepCommitted& c);
  void ApplyChange(const StepFailed& c);
  void ApplyChange(const RequestRecorded& c);
  void ApplyChange(const FencesReserved& c);
  void ApplyChange(const WorkerJoined& c);
  void ApplyChange(const ValueKept& c);
  void ApplyChange(const WritePrepared& c);
  void ApplyChange(const WriteResolved& c);
  VariableRecord& MustFind(uint64_t id, const char* change);
  // Records what `h` acknowledged and moves its replica through the event
  // that follows from it (acked when it is the committed value).
  void Acknowledge(VariableRecord& v, const Holder& h, int64_t version, uint64_t checksum);
  // Files `v` in needing_repair_ or takes it out, from its flag and replicas.
  void Reassess(const VariableRecord& v);
  // Moves both revisions: what a step's layout is made of changed.
  void Moved();
  // Moves replica `i` of `v` through `event` (TransitionReplica, the one
  // writer of replica states); a new state moves the layout revision, since
  // a step's layout reads the states.
  void MoveReplica(VariableRecord& v, size_t i, ReplicaEvent event);
  // Keeps `r` as replica `i` of `v`: an exception unless it is the norm.
  void SetReplica(VariableRecord& v, size_t i, const ReplicaRecord& r);
  // Drops the exceptions of `v` that are the norm (a checkpoint's rows list
  // every replica).
  void Normalize(VariableRecord& v);
  // A step's form of ValueCommitted / ReplicasWritten: every replica but
  // `missing` acknowledges (version, checksum) with its worker's incarnation.
  void AcknowledgeAllBut(VariableRecord& v, const std::vector<int32_t>& missing, int64_t version,
                         uint64_t checksum);

  const ClusterStateOptions options_;

  std::map<uint64_t, VariableRecord> variables_;  // by id
  // Into variables_ (a std::map: its nodes stay where they are), by name
  // and by id: a hash lookup, not a walk down the map, whatever the number
  // of variables.
  absl::flat_hash_map<std::string, VariableRecord*> names_;
  absl::flat_hash_map<uint64_t, VariableRecord*> ids_;
  std::set<uint64_t> needing_repair_;
  uint64_t next_variable_id_ = 1;
  uint64_t layout_revision_ = 0;
  uint64_t value_revision_ = 0;

  std::map<TaskKey, WorkerRecord> workers_;
  // Into workers_ (its nodes stay where they are): a hash lookup per
  // replica, not a walk down the map, when records name thousands.
  absl::flat_hash_map<TaskKey, WorkerRecord*> worker_index_;
  int64_t topology_version_ = 0;
  // Tasks given an exception since HoldsOnlyNorm last found them clean.
  mutable absl::flat_hash_set<TaskKey> off_norm_;
  bool membership_changed_ = false;  // by the record being applied

  int64_t last_committed_step_ = 0;
  LastStep last_step_;
  uint64_t last_epoch_ = 0;
  uint64_t fences_reserved_ = 0;

  absl::flat_hash_map<std::string, StoredOutcome> outcomes_;
  std::deque<std::string> outcome_order_;       // oldest first
  std::map<uint64_t, WritePrepared> prepared_;  // by fence
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_CLUSTER_STATE_H_

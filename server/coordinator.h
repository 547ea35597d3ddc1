// SPDX-License-Identifier: Apache-2.0
// The coordinator's logic, with no network in it.
//
// How a cross-replica write flows:
//   1. register: workers join Membership with their devices; accelerator
//      ordinals are the sorted live accelerators; ordinal 0's task is the
//      infeed host.
//   2. place: CreateVariables records replica i of a variable on ordinal i
//      (its device and task); placement never moves afterwards.
//   3. publish: Assign/Initialize take the variable's write lock, validate,
//      compute the new value once (AssignAdd: current + delta) and name it
//      version n+1.
//   4. replicate: the value goes to every live worker holding replicas,
//      through WorkerClient: a large write to 3+ workers goes to one root
//      worker, which broadcasts it over the data plane (gloo; this class
//      keeps its rendezvous store and orders its collectives); otherwise the
//      coordinator writes every worker itself, all in parallel.
//   5. ack: only when every live replica holds version n+1 is it committed
//      (version, checksum, value) and the caller answered; otherwise the
//      caller gets UNAVAILABLE, the committed version stays n and the
//      variable is marked for resync.
//   6. serve: reads return the committed value and version: the copy kept
//      from the last cross-replica write, or, once a step has changed the
//      variable, a copy fetched from an up-to-date replica (primary first).
//
// Replicated steps (S1-S5) run on the StepBarrier (see step_barrier.h): a
// step is opened only when no cross-replica write is in flight, and while it
// is open cross-replica writes are refused. Workers report to the barrier;
// the bytes of step values never reach the coordinator except when a read
// or a resync fetches a committed value from a replica.
//
// State changes happen only in the Commit* helpers, each taking a plain record
// that a write-ahead log can store before it is applied.
#ifndef REPVAR_SERVER_COORDINATOR_H_
#define REPVAR_SERVER_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/model/variable.h"
#include "server/dedup.h"
#include "server/membership.h"
#include "server/rendezvous_store.h"
#include "server/step_barrier.h"
#include "server/worker_client.h"

namespace repvar::server {

struct CoordinatorOptions {
  MembershipOptions membership;
  // Largest variable accepted (RESOURCE_EXHAUSTED above it).
  uint64_t max_variable_bytes = uint64_t{64} << 30;
  size_t dedup_capacity = 100000;
  absl::Duration dedup_window = absl::Hours(1);
  // Data plane (DESIGN.md §4): a single write of at least
  // `data_plane_min_bytes` to at least `data_plane_min_workers` workers goes
  // to one root worker, which broadcasts it to the others over gloo.
  // Otherwise the coordinator writes every worker itself.
  bool data_plane = false;
  uint64_t data_plane_min_bytes = 1 << 20;
  int data_plane_min_workers = 3;
};

// Thread-safe. One mutex (mu_) guards the registry's maps and per-variable
// metadata and is never held while calling a worker; each variable also has a
// write lock that orders its cross-replica writes (C4) and is held across the
// broadcast. Batched writes take write locks in variable-id order.
class Coordinator {
 public:
  Coordinator(CoordinatorOptions options, Clock* clock, WorkerClient* workers);

  Membership& membership() { return membership_; }
  RendezvousStore& store() { return store_; }

  // T1 plus F2: after a new incarnation registers, its replicas of
  // initialized variables are rewritten from the committed values before this
  // returns. Errors: as Membership::Register; a failed resync leaves the
  // replicas STALE and is reported in the log, not to the worker.
  absl::StatusOr<int64_t> RegisterWorker(const WorkerRegistration& reg);
  // Errors: as Membership::Heartbeat.
  absl::StatusOr<int64_t> Heartbeat(const TaskKey& key, uint64_t incarnation);
  // Periodic work at `now`: declares silent workers dead (T5), times out
  // step barriers (S4).
  void Tick(absl::Time now);
  // Periodic repair, off the ticker (it moves bytes): rewrites every stale
  // replica on a live worker from the committed value — left behind by a
  // cross-replica write that did not reach it, or by a step it sat out —
  // and clears needs_resync once every live replica is up to date.
  void ResyncStale() ABSL_LOCKS_EXCLUDED(mu_);

  // V1-V3, V6. All-or-nothing. Errors: INVALID_ARGUMENT (name, spec, empty
  // batch, duplicate names with different specs in one batch),
  // FAILED_PRECONDITION (replica_count > accelerators, or < 1),
  // ALREADY_EXISTS (same name, different spec), RESOURCE_EXHAUSTED (larger
  // than max_variable_bytes).
  absl::StatusOr<CreateResult> CreateVariables(const RequestKey& key,
                                               const std::vector<CreateItem>& items);
  // Errors: NOT_FOUND.
  absl::StatusOr<VariableView> GetVariable(absl::string_view name) const;
  // Variables in `collection` (all when empty), by name.
  std::vector<VariableView> ListVariables(absl::string_view collection) const;
  // Errors: NOT_FOUND.
  absl::Status DeleteVariable(const RequestKey& key, absl::string_view name);

  // C5. First caller wins. Errors: NOT_FOUND, INVALID_ARGUMENT (no or bad
  // initializer), UNAVAILABLE (a live replica could not be written).
  absl::StatusOr<std::vector<InitializeResult>> Initialize(
      const RequestKey& key, const std::vector<InitializeItem>& items);

  // C2, C3, C6, C7 for one variable. Errors: NOT_FOUND, FAILED_PRECONDITION
  // (spec mismatch; ADD/SUB of an uninitialized variable), INVALID_ARGUMENT
  // (non-finite value or result, reused request id), UNAVAILABLE (see file
  // comment, step 5).
  absl::StatusOr<WriteResult> Assign(const RequestKey& key, const Assignment& item);
  // V6: validates every item, then writes them all in one broadcast.
  absl::StatusOr<std::vector<WriteResult>> AssignBatch(const RequestKey& key,
                                                       const std::vector<Assignment>& items);

  // C1. Errors: NOT_FOUND, FAILED_PRECONDITION (uninitialized),
  // UNAVAILABLE (a step changed it and no up-to-date replica answered).
  absl::StatusOr<ReadResult> Read(absl::string_view name);

  // ---- Replicated steps (S1-S5, F1); see step_barrier.h. ----
  // S1. Waits for cross-replica writes in flight, then opens `step` with
  // every up-to-date replica on a live worker taking part. Errors: as
  // StepBarrier::CheckBegin, INVALID_ARGUMENT for a non-positive timeout.
  absl::StatusOr<StepInfo> BeginStep(int64_t step, absl::Duration barrier_timeout);
  // Errors: NOT_FOUND (unknown epoch).
  absl::StatusOr<StepInfo> GetStep(uint64_t epoch) const;
  // The same without copying the step's description (1,000s of variables):
  // shared, as opened, with the current state beside it.
  struct SharedStep {
    std::shared_ptr<const StepInfo> info;
    StepState state = StepState::kOpen;
  };
  absl::StatusOr<SharedStep> BeginStepShared(int64_t step, absl::Duration barrier_timeout);
  absl::StatusOr<SharedStep> GetStepShared(uint64_t epoch) const;
  absl::Status AbortStep(uint64_t epoch, absl::string_view reason);
  // Errors: as StepBarrier::Report / Finish. Neither waits.
  absl::Status ReportStep(const WorkerReport& report);
  absl::Status FinishStep(const WorkerFinish& finish);
  // Waits until `deadline` for the barrier of `epoch`: the plan (the step is
  // aggregating) or its resolution. DEADLINE_EXCEEDED: still open.
  absl::StatusOr<std::variant<StepPlan, StepResolution>> WaitStepPlan(uint64_t epoch,
                                                                      absl::Time deadline);
  // Waits until `deadline` for the resolution. DEADLINE_EXCEEDED: not yet;
  // NOT_FOUND: unknown epoch.
  absl::StatusOr<StepResolution> WaitStepResolution(uint64_t epoch, absl::Time deadline);
  // The same without a waiting thread: `done` is called exactly once, on
  // this thread when the answer is ready now, else from the thread that
  // changes the step (outside every lock) — or with UNAVAILABLE after
  // ShutdownStepWaiters(). For the gRPC callback handlers.
  using PlanCallback = std::function<void(absl::StatusOr<std::variant<StepPlan, StepResolution>>)>;
  void WhenStepPlanned(uint64_t epoch, PlanCallback done) ABSL_LOCKS_EXCLUDED(step_mu_);
  using ResolutionCallback = std::function<void(absl::StatusOr<StepResolution>)>;
  void WhenStepResolved(uint64_t epoch, ResolutionCallback done) ABSL_LOCKS_EXCLUDED(step_mu_);
  // Answers every pending When* with UNAVAILABLE, and any later one at once.
  void ShutdownStepWaiters() ABSL_LOCKS_EXCLUDED(step_mu_);
  StepsStatus GetSteps() const;
  // Events after `after_seq`, waiting until `deadline` for one.
  std::vector<StepEvent> WaitStepEvents(int64_t after_seq, absl::Time deadline);

 private:
  struct ReplicaRecord {
    int64_t version = 0;
    uint64_t checksum = 0;
    uint64_t incarnation = 0;  // of the worker that holds this version
  };
  struct Variable {
    Variable(uint64_t id_in, VariableDef def_in, std::vector<Placement> placement_in)
        : id(id_in), def(std::move(def_in)), placement(std::move(placement_in)) {}
    const uint64_t id;
    const VariableDef def;
    const std::vector<Placement> placement;
    absl::Mutex write_mu;  // orders cross-replica writes; held across broadcast
    // Below: protected by Coordinator::mu_.
    Initializer initializer;
    int64_t version = 0;
    uint64_t checksum = 0;
    std::shared_ptr<const Tensor> value;
    std::vector<ReplicaRecord> replicas;
    bool needs_resync = false;
    bool deleted = false;
  };
  // A new version to publish.
  struct PlannedWrite {
    Variable* variable;
    int64_t version;
    std::shared_ptr<const Tensor> value;
  };

  // Sends every planned write to every live replica; records per-replica
  // results; commits all only when every live replica got its write.
  absl::Status Broadcast(std::vector<PlannedWrite>& writes) ABSL_LOCKS_EXCLUDED(mu_);
  // The committed value of `v`: the kept copy, or one fetched from an
  // up-to-date replica (primary first) after a step changed it.
  absl::StatusOr<ReadResult> CommittedValue(const std::shared_ptr<Variable>& v)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cross-replica writes (assign) enter the write gate: refused while a step
  // is open or beginning; BeginStep waits for those inside to leave.
  absl::Status EnterWriteGate() ABSL_LOCKS_EXCLUDED(step_mu_);
  void LeaveWriteGate() ABSL_LOCKS_EXCLUDED(step_mu_);
  absl::Status ApplyStepRecord(const StepRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  std::pair<std::string, uint32_t> StepGroup(const std::vector<StepParticipant>& participants,
                                             size_t tags, bool fresh)
      ABSL_LOCKS_EXCLUDED(data_plane_mu_);
  // The data-plane group name of a member set. A new group deletes the
  // previous one's rendezvous keys.
  std::string GroupLocked(const std::string& members) ABSL_EXCLUSIVE_LOCKS_REQUIRED(data_plane_mu_);
  void ResyncTask(const TaskKey& task) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<Variable>> Find(absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  VariableView ViewLocked(const Variable& v, const TopologySnapshot& topo) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateAssignLocked(const Variable& v, const Assignment& item) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<const Tensor>> ComputeLocked(const Variable& v,
                                                              const Assignment& item,
                                                              const Tensor* base) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Assigns collective specs to `calls` when the data plane should carry
  // them; returns false when the coordinator should write every worker.
  bool PlanCollective(std::vector<std::vector<ReplicaWrite>>& calls,
                      const std::vector<const LiveTask*>& tasks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(data_plane_mu_);

  const CoordinatorOptions options_;
  Clock* const clock_;
  WorkerClient* const workers_;
  Membership membership_;
  DedupTable dedup_;
  RendezvousStore store_;

  // Collectives run one at a time, in tag order: gloo needs every member to
  // issue the same collectives in the same order.
  absl::Mutex data_plane_mu_;
  std::string group_ ABSL_GUARDED_BY(data_plane_mu_);
  uint64_t group_generation_ ABSL_GUARDED_BY(data_plane_mu_) = 0;
  uint32_t next_tag_ ABSL_GUARDED_BY(data_plane_mu_) = 0;

  // Step state. Lock order: step_mu_, then data_plane_mu_ or mu_.
  mutable absl::Mutex step_mu_;
  StepBarrier steps_ ABSL_GUARDED_BY(step_mu_);
  int writes_in_flight_ ABSL_GUARDED_BY(step_mu_) = 0;
  bool step_beginning_ ABSL_GUARDED_BY(step_mu_) = false;
  // step_cv_: a step opened, started aggregating or resolved, or
  // writes_in_flight_ moved. events_cv_: a step event was recorded.
  absl::CondVar step_cv_;
  absl::CondVar events_cv_;
  class StepChangeNotifier;
  struct Wakers;
  // One-shot callbacks run when the step state changes (see WhenStepPlanned).
  std::vector<std::function<void()>> step_wakers_ ABSL_GUARDED_BY(step_mu_);
  bool steps_shut_down_ ABSL_GUARDED_BY(step_mu_) = false;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Variable>, std::less<>> variables_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Variable>> by_id_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_COORDINATOR_H_

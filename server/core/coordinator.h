// SPDX-License-Identifier: Apache-2.0
// The coordinator's logic, with no network in it: a thin facade over its
// units, each a monitor with one mutex (lock order: lock_order.h).
//
//   Registry          who is in the cluster, which variables exist and where
//                     their replicas live; the one commit point of the state
//                     (ClusterState::Apply, through the StateLog)
//   Replication       cross-replica writes, reads of committed values,
//                     resync and repair, over an asynchronous WorkerClient
//   StepCoordinator   replicated steps: the StepBarrier, the write gate
//   CollectiveGroups  the data plane's groups, tags and rendezvous store
//
// docs/architecture.md walks through a cross-replica write ("The write
// path") and a replicated step ("A step").
//
// Thread-safe. Lifecycle: construct, serve, ShutdownStepWaiters(), destroy.
#ifndef REPVAR_SERVER_CORE_COORDINATOR_H_
#define REPVAR_SERVER_CORE_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/memory_budget.h"
#include "common/model/step.h"
#include "common/model/variable.h"
#include "server/core/collective_groups.h"
#include "server/core/registry.h"
#include "server/core/replication.h"
#include "server/core/state_log.h"
#include "server/core/step_coordinator.h"
#include "server/core/worker_client.h"

namespace repvar::server {

struct CoordinatorOptions {
  MembershipOptions membership;
  // Largest variable accepted (RESOURCE_EXHAUSTED above it).
  uint64_t max_variable_bytes = uint64_t{64} << 30;
  // Answers of mutating requests kept for retries (C6): never forgotten
  // within the window; at the capacity new request ids are refused
  // (ClusterStateOptions).
  size_t idempotency_capacity = 1000000;
  absl::Duration idempotency_window = absl::Hours(1);
  ReplicationOptions replication;
  // Memory lent to requests (tensors being received or computed); beyond it
  // they get RESOURCE_EXHAUSTED (MemoryBudget).
  uint64_t max_inflight_bytes = MemoryBudget::HalfOfMemoryLimit();
};

class Coordinator {
 public:
  // `log` receives every record before it is applied; null: a
  // VolatileStateLog (nothing survives a restart).
  Coordinator(CoordinatorOptions options, Clock* clock, WorkerClient* workers,
              StateLog* log = nullptr);

  Registry& registry() { return registry_; }
  Replication& replication() { return replication_; }
  // What requests may hold in memory at once (CoordinatorOptions).
  MemoryBudget* budget() { return &budget_; }

  // Loads the state the log kept from an earlier run (see
  // Registry::Recover), then verifies what the workers recorded live hold
  // (Replication::VerifyAll); call once, before serving.
  absl::Status Recover();
  RendezvousStore& store() { return groups_.store(); }

  // ---- Membership ----
  // T1 plus F2: after a worker registers, what it holds is verified and its
  // replicas of initialized variables that are not up to date are rewritten
  // from the committed values before this returns (Replication::Rejoin);
  // only then is it listed in the topology (Registry::Joined), and the
  // version returned is that topology's. Errors: as Registry::Register; a
  // failed resync leaves the replicas STALE and is reported in the log, not
  // to the worker.
  absl::StatusOr<int64_t> RegisterWorker(const WorkerRegistration& reg);
  // Errors: as Registry::Heartbeat.
  absl::StatusOr<HeartbeatGrant> Heartbeat(const TaskKey& key, uint64_t incarnation,
                                           bool read_lease = false,
                                           const std::vector<HeldValue>& held = {});
  // Periodic work at `now`: declares silent workers dead (T5), ends the
  // calls in flight to them and fails the open step when a participant died
  // (F1), times out step barriers (S4).
  void Tick(absl::Time now);
  // Periodic repair, off the ticker (it moves bytes): see
  // Replication::ResyncStale.
  void ResyncStale() { replication_.ResyncStale(); }

  // ---- Draining (an operator's, before maintenance) ----
  // While draining, new changes -- creating, deleting, initializing, writing,
  // beginning a step -- are refused with UNAVAILABLE (clients retry until
  // the coordinator serves again); reads, membership, and the open step's
  // reports and resolution go on. SetDraining(false) resumes.
  // Logged when it changes (an operator's audit trail).
  void SetDraining(bool draining);
  bool draining() const { return draining_; }

  // ---- Variables (see Registry and Replication for the errors) ----
  absl::StatusOr<CreateResult> CreateVariables(const RequestKey& key,
                                               const std::vector<CreateItem>& items,
                                               VariableDetail detail = VariableDetail::kFull) {
    REPVAR_RETURN_IF_ERROR(RefuseIfDraining());
    return registry_.CreateVariables(key, items, detail);
  }
  absl::StatusOr<VariableView> GetVariable(absl::string_view name) const {
    return registry_.GetVariable(name);
  }
  std::vector<VariableView> ListVariables(absl::string_view collection,
                                          VariableDetail detail = VariableDetail::kFull) const {
    return registry_.ListVariables(collection, detail);
  }
  absl::Status DeleteVariable(const RequestKey& key, absl::string_view name) {
    REPVAR_RETURN_IF_ERROR(RefuseIfDraining());
    return replication_.Delete(key, name);
  }
  absl::StatusOr<std::vector<InitializeResult>> Initialize(
      const RequestKey& key, const std::vector<InitializeItem>& items) {
    REPVAR_RETURN_IF_ERROR(RefuseIfDraining());
    return replication_.Initialize(key, items);
  }
  absl::StatusOr<WriteResult> Assign(const RequestKey& key, const Assignment& item);
  absl::StatusOr<std::vector<WriteResult>> AssignBatch(const RequestKey& key,
                                                       const std::vector<Assignment>& items) {
    REPVAR_RETURN_IF_ERROR(RefuseIfDraining());
    return replication_.Assign(key, items);
  }
  absl::StatusOr<ReadResult> Read(absl::string_view name) { return replication_.Read(name); }
  // Read of each of `names` from one look at the state
  // (Replication::ReadBatch); RESOURCE_EXHAUSTED beyond `max_bytes`.
  absl::StatusOr<std::vector<ReadResult>> ReadBatch(absl::Span<const absl::string_view> names,
                                                    uint64_t max_bytes) {
    return replication_.ReadBatch(names, max_bytes);
  }
  // The same without waiting on a worker or a sync
  // (Replication::ReadBatchHeld): nullopt when a value must be read from a
  // replica, or the values come to more than `held_bytes`.
  absl::StatusOr<std::optional<std::vector<ReadResult>>> ReadBatchHeld(
      absl::Span<const absl::string_view> names, uint64_t max_bytes, uint64_t held_bytes) {
    return replication_.ReadBatchHeld(names, max_bytes, held_bytes);
  }

  // ---- Consistent cuts (checkpoints) ----
  // While it lives, cross-replica writes and new steps wait
  // (StepCoordinator::HoldWrites): reads in between see one cut.
  class WriteHold {
   public:
    explicit WriteHold(StepCoordinator* steps) : steps_(steps) {}
    WriteHold(WriteHold&& o) noexcept : steps_(std::exchange(o.steps_, nullptr)) {}
    WriteHold& operator=(WriteHold&&) = delete;
    ~WriteHold() {
      if (steps_ != nullptr) steps_->ReleaseWrites();
    }

   private:
    StepCoordinator* steps_;
  };
  // Errors: DEADLINE_EXCEEDED (a step stayed open or writes in flight).
  absl::StatusOr<WriteHold> HoldWrites(absl::Time deadline) {
    if (absl::Status s = steps_.HoldWrites(deadline); !s.ok()) return s;
    return WriteHold(&steps_);
  }
  int64_t LastCommittedStep() const {
    return registry_.Read([](const ClusterState& s) { return s.last_committed_step(); });
  }
  // What a checkpoint saves: the variables as they are under a hold, which
  // lasts as long as the cut does.
  struct Cut {
    WriteHold hold;
    int64_t last_committed_step = 0;
    std::vector<VariableView> variables;     // initialized ones, by name
    std::vector<std::string> uninitialized;  // no value to save
  };
  // Errors: DEADLINE_EXCEEDED (a step stayed open or writes in flight).
  absl::StatusOr<Cut> TakeCut(absl::Time deadline);
  // The committed value of `v`, one of `cut`'s variables. Errors: Read's;
  // INTERNAL when it is not the cut's (nothing may write under the hold).
  absl::StatusOr<ReadResult> ReadInCut(const VariableView& v);

  // ---- Replicated steps (see StepCoordinator) ----
  // Errors: UNAVAILABLE while draining; as StepCoordinator::BeginStep.
  absl::StatusOr<SharedStep> BeginStep(int64_t step, absl::Duration barrier_timeout) {
    REPVAR_RETURN_IF_ERROR(RefuseIfDraining());
    return steps_.BeginStep(step, barrier_timeout);
  }
  // BeginStep's answer when it would not wait (StepCoordinator::JoinOpenStep).
  std::optional<absl::StatusOr<SharedStep>> JoinOpenStep(int64_t step,
                                                         absl::Duration barrier_timeout) const {
    if (absl::Status s = RefuseIfDraining(); !s.ok()) return s;
    return steps_.JoinOpenStep(step, barrier_timeout);
  }
  absl::StatusOr<SharedStep> GetStep(uint64_t epoch) const { return steps_.GetStep(epoch); }
  absl::Status AbortStep(uint64_t epoch, absl::string_view reason) {
    return steps_.AbortStep(epoch, reason);
  }
  absl::Status ReportStep(const WorkerReport& report) { return steps_.ReportStep(report); }
  absl::Status FinishStep(const WorkerFinish& finish) { return steps_.FinishStep(finish); }
  // The step's plan, or its resolution, once its barrier resolves
  // (StepCoordinator::WhenStepPlanned); `done` is called exactly once.
  void WhenStepPlanned(uint64_t epoch, bool detailed, StepCoordinator::PlanCallback done) {
    steps_.WhenStepPlanned(epoch, detailed, std::move(done));
  }
  // The step's resolution once it resolves (StepCoordinator::WhenStepResolved).
  void WhenStepResolved(uint64_t epoch, StepCoordinator::ResolutionCallback done) {
    steps_.WhenStepResolved(epoch, std::move(done));
  }
  void ShutdownStepWaiters() { steps_.ShutdownWaiters(); }
  StepsStatus GetSteps() const { return steps_.GetSteps(); }
  std::vector<StepEvent> WaitStepEvents(int64_t after_seq, absl::Time deadline) {
    return steps_.WaitStepEvents(after_seq, deadline);
  }
  int64_t LatestStepEventSeq() const { return steps_.LatestStepEventSeq(); }

 private:
  absl::Status RefuseIfDraining() const {
    if (!draining_) return absl::OkStatus();
    return absl::UnavailableError(
        "the coordinator is draining for maintenance: no new changes until it resumes (retry)");
  }

  std::atomic<bool> draining_{false};
  Clock* const clock_;
  WorkerClient* const workers_;
  MemoryBudget budget_;
  std::unique_ptr<StateLog> owned_log_;  // when none was given
  StateLog* const log_;
  Registry registry_;
  CollectiveGroups groups_;
  StepCoordinator steps_;
  Replication replication_;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_COORDINATOR_H_

// SPDX-License-Identifier: Apache-2.0
// Replicated steps on the coordinator (docs/contract.md S1-S5, F1): the
// StepBarrier (the state machine), the write gate between steps and
// cross-replica writes, and the waiters of the workers' long polls. Every
// step that begins, commits or fails is recorded through the registry's
// commit point; a committed step is one record.
//
// The write gate: a cross-replica write enters it before it takes any
// variable's write lock and leaves it when it is done. BeginStep closes the
// gate, waits for the writes inside to leave, then opens the step; while a
// step is open or beginning, writes are refused (S5). A hold (HoldWrites)
// makes writes and new steps wait instead while a consistent cut is taken.
//
// Thread-safe (a monitor, rank kStepsRank); callbacks run outside the lock.
#ifndef REPVAR_SERVER_CORE_STEP_COORDINATOR_H_
#define REPVAR_SERVER_CORE_STEP_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/ranked_mutex.h"
#include "common/model/step.h"
#include "common/model/topology.h"
#include "server/core/collective_groups.h"
#include "server/core/lock_order.h"
#include "server/core/registry.h"
#include "server/core/step_barrier.h"

namespace repvar::server {

// A step's description shared without copying it (1,000s of variables): as
// opened, with the current state beside it.
struct SharedStep {
  std::shared_ptr<const StepInfo> info;
  StepState state = StepState::kOpen;
};

class StepCoordinator {
 public:
  StepCoordinator(Clock* clock, Registry* registry, CollectiveGroups* groups);

  // After the registry recovered its state (Registry::Recover): steps go on
  // from its last committed step, and epochs from above both its last epoch
  // and the clock in microseconds (a coordinator that recorded nothing
  // still never repeats an epoch workers saw). Before any step opens.
  void Recovered() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- The write gate (S1, S5). ----
  // Errors: FAILED_PRECONDITION (a step is open or beginning).
  absl::Status EnterWriteGate() ABSL_LOCKS_EXCLUDED(mu_);
  void LeaveWriteGate() ABSL_LOCKS_EXCLUDED(mu_);
  bool IsOpen() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Holding writes: a consistent cut between steps (checkpoints). ----
  // From now until ReleaseWrites, cross-replica writes wait at the gate
  // and no new step begins (a trainer joining the step already open still
  // does); returns once the open step resolved and the writes in flight
  // left. Holds nest. Errors: DEADLINE_EXCEEDED (still a step open or
  // writes in flight at `deadline`: nothing is held).
  absl::Status HoldWrites(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseWrites() ABSL_LOCKS_EXCLUDED(mu_);
  // The open step's id when variable `id` takes part in it.
  std::optional<int64_t> OpenStepOf(uint64_t variable_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Steps. ----
  // S1. Waits for cross-replica writes in flight, then opens `step` with
  // every up-to-date replica on a live worker taking part. Errors: as
  // StepBarrier::CheckBegin, INVALID_ARGUMENT for a non-positive timeout.
  absl::StatusOr<SharedStep> BeginStep(int64_t step, absl::Duration barrier_timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // BeginStep's answer when it would not wait: `step` is open already (the
  // call of every trainer but the first), or the call is refused. nullopt
  // when BeginStep has to open the step or wait (call it then).
  std::optional<absl::StatusOr<SharedStep>> JoinOpenStep(int64_t step,
                                                         absl::Duration barrier_timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: NOT_FOUND (unknown epoch).
  absl::StatusOr<SharedStep> GetStep(uint64_t epoch) const ABSL_LOCKS_EXCLUDED(mu_);
  // Fails the open step `epoch` with ABORTED; idempotent for a failed step.
  // Errors: FAILED_PRECONDITION (it committed), NOT_FOUND (unknown epoch).
  absl::Status AbortStep(uint64_t epoch, absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: as StepBarrier::Report / Finish. Neither waits.
  absl::Status ReportStep(const WorkerReport& report) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status FinishStep(const WorkerFinish& finish) ABSL_LOCKS_EXCLUDED(mu_);
  // The barrier of `epoch`, once it resolves: the plan (the step is
  // aggregating) or its resolution (StepPlanned), and the resolution
  // (StepResolved). For the waiter of a summary report (`detailed` false),
  // the barrier's request for detail is an answer too (StepPlan::send_detail). `done` is called
  // exactly once, on this thread when the answer is ready now, else from the thread that changes
  // the step (outside every lock), or with UNAVAILABLE after ShutdownWaiters(). A resolution is
  // shared by every waiter of the step, not copied for each. NOT_FOUND: unknown epoch.
  using SharedResolution = std::shared_ptr<const StepResolution>;
  using PlanCallback =
      std::function<void(absl::StatusOr<std::variant<StepPlan, SharedResolution>>)>;
  void WhenStepPlanned(uint64_t epoch, bool detailed, PlanCallback done) ABSL_LOCKS_EXCLUDED(mu_);
  using ResolutionCallback = std::function<void(absl::StatusOr<SharedResolution>)>;
  void WhenStepResolved(uint64_t epoch, ResolutionCallback done) ABSL_LOCKS_EXCLUDED(mu_);
  // Answers every pending When* with UNAVAILABLE, and any later one at once.
  void ShutdownWaiters() ABSL_LOCKS_EXCLUDED(mu_);
  StepsStatus GetSteps() const ABSL_LOCKS_EXCLUDED(mu_);
  // Events after `after_seq`, waiting until `deadline` for one.
  std::vector<StepEvent> WaitStepEvents(int64_t after_seq, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The seq of the last event so far (0 before any): watching after it
  // shows only what happens from now on.
  int64_t LatestStepEventSeq() const ABSL_LOCKS_EXCLUDED(mu_);

  // Periodic work at `now`: F1 (a participant in `dead` fails the open
  // step) and barrier timeouts with straggler warnings (S4).
  void Tick(absl::Time now, const std::vector<LiveTask>& dead) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Callbacks to run once mu_ is released: declare before the lock.
  struct Wakers {
    std::vector<std::function<void()>> fns;
    ~Wakers() {
      for (auto& f : fns) f();
    }
  };
  // Where the steps stood before a change: waiters are woken only by a
  // change that concerns them. Long polls of reports and finishes wait on
  // step_cv_ (and the registered wakers), which move only when a step
  // opens, starts aggregating or resolves (not on each of 32 reports);
  // watchers of events wait on events_cv_.
  struct ChangeMark {
    int64_t event_seq = 0;
    // The open step's epoch, and its state * 2 + whether it wants detail.
    std::pair<uint64_t, int> open;
  };
  ChangeMark MarkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the waiters of what changed since `before`; the registered
  // wakers go to `wake`, which runs them once mu_ is released.
  void NotifyLocked(const ChangeMark& before, Wakers* wake) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The step's participants and variables from the registry's state. While
  // the layout revision stays (ClusterState::layout_revision), each step
  // shares the kept layout's variables: no build, no copy; values
  // committed since cost one version and checksum per variable.
  StepInfo Describe(int64_t step, absl::Duration barrier_timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The barrier's hooks, called with mu_ held.
  absl::Status RecordCommit(const StepRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordFailure(int64_t step, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::pair<std::string, uint32_t> Group(const std::vector<StepParticipant>& participants,
                                         size_t tags, bool fresh);
  // A step the barrier does not know. One of an earlier run (before a
  // restart) is answered from the state log: the last committed step as
  // committed, with what it changed (its workers may not have heard before
  // the restart, and install it now: two-phase commit); a later one as
  // failed (the restart aborted it). Any other: NOT_FOUND.
  absl::StatusOr<SharedResolution> Unknown(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  Registry* const registry_;
  CollectiveGroups* const groups_;

  // State below is protected by mu_.
  mutable RankedMutex mu_{kStepsRank, "StepCoordinator::mu_"};
  StepBarrier steps_ ABSL_GUARDED_BY(mu_);
  int writes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool step_beginning_ ABSL_GUARDED_BY(mu_) = false;
  // The last layout Describe built, and the state's layout and value
  // revisions it holds.
  mutable std::pair<uint64_t, uint64_t> described_revisions_ ABSL_GUARDED_BY(mu_);
  // The live tasks with a replica that sits out of the described layout.
  mutable std::vector<TaskKey> described_behind_ ABSL_GUARDED_BY(mu_);
  // UNAVAILABLE while one of them, or a superseded incarnation, may hold a
  // read lease.
  absl::Status CheckLeasesOfThoseBehind(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable std::optional<StepInfo> described_ ABSL_GUARDED_BY(mu_);
  int holds_ ABSL_GUARDED_BY(mu_) = 0;  // HoldWrites not yet released
  // step_cv_: a step opened, started aggregating or resolved, or
  // writes_in_flight_ or holds_ moved. events_cv_: a step event was recorded.
  CondVar step_cv_;
  CondVar events_cv_;
  // One-shot callbacks run when the step state changes (see WhenStepPlanned).
  std::vector<std::function<void()>> wakers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // From Recovered: the first epoch of this run, and the last step the
  // earlier runs committed.
  uint64_t first_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  LastStep earlier_ ABSL_GUARDED_BY(mu_);
  uint64_t earlier_begun_ ABSL_GUARDED_BY(mu_) = 0;  // the last epoch earlier runs began
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_STEP_COORDINATOR_H_

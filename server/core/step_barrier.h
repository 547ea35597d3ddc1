// SPDX-License-Identifier: Apache-2.0
// The replicated-step state machine (docs/contract.md S1-S5, F1), with no network,
// no threads and no clock of its own: every call takes `now`.
//
// One step is open at a time. Its life:
//
//          Begin(k)                  every participant
//   (none) -------> OPEN -----------------reported-------------+
//                    |  \                                      |
//                    |   '-- at half the barrier timeout:      v
//                    |       a STRAGGLERS event          plan needs collectives?
//                    |                                    no /           \ yes
//   barrier timeout, |                                      v             v
//   a participant    |                              COMMITTED  <-- AGGREGATING
//   died, Abort, a   |                                 ^   every participant finished
//   bad report mix   v                                 |   with agreeing values
//                 FAILED  <----------------------------+-- (else FAILED)
//
// COMMITTED and FAILED are final; the resolution is kept (the last few) so a
// late worker or trainer gets the same answer. Committed step ids strictly
// increase; a failed step's id may be opened again, under a new epoch.
//
// Reports are summaries (docs/architecture.md, "A step"): each worker's
// changed variables as layout index ranges, a digest of its NONE and
// ONLY_FIRST_REPLICA values and the checksums it is the reporter of. When
// the last report arrives and a digest does not hold, the step stays OPEN
// and asks every worker for its report again in detail (plan() answers a
// summary's waiter with send_detail); the barrier resolves when the last
// detailed report arrives.
//
// Aggregation (decided when the last report arrives):
//   NONE               every participating replica must agree; otherwise the
//                      majority value wins (ties: the lowest replica, so the
//                      primary first), a Divergence is reported and the
//                      winner is broadcast from its holder to the others.
//   ONLY_FIRST_REPLICA replica 0's value is broadcast to the others (the lowest
//                      replica taking part, when replica 0 sits the step out).
//   SUM / MEAN         if any replica changed, one fused ring allreduce per
//                      accumulator type over all participants, in variable
//                      id order; workers apply it to the begin value.
// A changed variable gets version + 1; a repaired but unchanged one keeps its
// version. The commit is handed to the owner as one StepRecord.
//
// Not thread-safe: the StepCoordinator holds its mutex around it.
#ifndef REPVAR_SERVER_CORE_STEP_BARRIER_H_
#define REPVAR_SERVER_CORE_STEP_BARRIER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/status_util.h"
#include "common/model/step.h"
#include "common/model/topology.h"
#include "common/tensor/step_math.h"
#include "common/tensor/tensor.h"
#include "server/core/step_plan.h"

namespace repvar::server {

class StepBarrier {
 public:
  // Hands out the data-plane group and `count` consecutive tags for a plan;
  // `fresh`: the last step that ran collectives failed, so the group's gloo
  // contexts may be broken and a new generation is needed.
  using GroupFn = std::function<std::pair<std::string, uint32_t>(
      const std::vector<StepParticipant>&, size_t count, bool fresh)>;
  // Records a commit (the owner's commit point). A failure fails the step
  // instead.
  using CommitFn = std::function<absl::Status(const StepRecord&)>;
  // Told of every step that failed (after it closed).
  using FailedFn = std::function<void(int64_t step, uint64_t epoch)>;

  // `next_epoch` and `last_committed` continue what the owner's state says.
  StepBarrier(GroupFn group, CommitFn commit, FailedFn failed, uint64_t next_epoch = 1,
              int64_t last_committed = 0)
      : group_(std::move(group)),
        commit_(std::move(commit)),
        failed_(std::move(failed)),
        next_epoch_(next_epoch),
        last_committed_(last_committed) {}

  // The open step when it is `step` (BeginStep again: idempotent), null
  // when `step` may be opened. Errors: INVALID_ARGUMENT (step < 1),
  // FAILED_PRECONDITION (another step is open, or `step` is not above the
  // last committed one).
  absl::StatusOr<std::shared_ptr<const StepInfo>> CheckBegin(int64_t step) const;
  // The epoch the next Open() gives (the owner records it first).
  uint64_t next_epoch() const { return next_epoch_; }
  // Continues from the owner's recovered state, before any step opened.
  void ContinueFrom(uint64_t next_epoch, int64_t last_committed) {
    REPVAR_CHECK_MSG(!open_ && next_epoch >= next_epoch_,
                     "StepBarrier::ContinueFrom after a step opened");
    next_epoch_ = next_epoch;
    last_committed_ = last_committed;
  }
  // Opens a step (after CheckBegin said it may); returns its new epoch. A
  // step without participants commits at once.
  uint64_t Open(StepInfo info, absl::Time now);

  // S3. Errors (nothing changes): FAILED_PRECONDITION (closed step),
  // OUT_OF_RANGE (future step), PERMISSION_DENIED (not a participant, or a
  // replica it does not hold), ABORTED (stale incarnation), ALREADY_EXISTS
  // (a different report already received), INVALID_ARGUMENT (unknown
  // variable or a duplicate entry).
  absl::Status Report(const WorkerReport& report, absl::Time now);
  // After the plan's collectives. Errors as Report.
  absl::Status Finish(const WorkerFinish& finish, absl::Time now);

  // Fails the open step `epoch` with ABORTED. FAILED_PRECONDITION: that
  // step committed. Unknown or already failed epochs: OK.
  absl::Status Abort(uint64_t epoch, absl::string_view reason, absl::Time now);
  // F1: a participant declared dead fails the open step with UNAVAILABLE.
  void WorkerDied(const TaskKey& task, uint64_t incarnation, absl::Time now);
  // Barrier timeouts and straggler warnings. `describe(task)` says what the
  // owner knows of a task (its last heartbeat), for the error message.
  void Tick(absl::Time now, const std::function<std::string(const TaskKey&)>& describe);

  // The open step as it was opened (its `state` field says OPEN; see
  // open_state()).
  const StepInfo* open() const { return open_ ? &*open_ : nullptr; }
  StepState open_state() const { return open_state_; }
  // Whether the open step asks for detailed reports.
  bool detail_wanted() const { return open_ != nullptr && detail_wanted_; }
  // The answer for a waiter of the open step's barrier: its plan once it is
  // aggregating; for a summary's waiter (`detailed` false), the request for
  // detail while one is out. Null otherwise.
  const StepPlan* plan(uint64_t epoch, bool detailed) const;
  // A recent step's resolution, shared as it was closed: it never changes,
  // so every waiter of the step gets it without a copy. Null when the step
  // is open or unknown.
  std::shared_ptr<const StepResolution> resolution(uint64_t epoch) const;
  // The open or a recent step as it was opened (its `state` field says
  // OPEN; state() has the current one). Null for an unknown epoch.
  std::shared_ptr<const StepInfo> shared_info(uint64_t epoch) const;
  std::optional<StepState> state(uint64_t epoch) const;
  std::vector<ParticipantProgress> progress(absl::Time now) const;
  const std::deque<std::shared_ptr<const StepResolution>>& recent() const { return recent_; }
  int64_t last_committed_step() const { return last_committed_; }
  int64_t next_event_seq() const { return next_seq_; }
  std::vector<StepEvent> EventsAfter(int64_t seq) const;

 private:
  struct Progress {
    std::optional<WorkerReport> report;
    std::optional<WorkerFinish> finish;
    absl::Time reported_at;
  };

  // Checks what a report names against the layout (nothing changes).
  absl::Status CheckReport(const WorkerReport& r, size_t me) const;
  // Validates step/epoch/task/incarnation; returns the participant index.
  absl::StatusOr<size_t> CheckCaller(int64_t step, uint64_t epoch, const TaskKey& task,
                                     uint64_t incarnation, absl::string_view what) const;
  // The open step's variable `id` (they are sorted by id), or null.
  const StepVariable* FindVariable(uint64_t id) const;
  // Its index in the layout (`id` must be in the step).
  uint32_t IndexOf(uint64_t id) const;
  // Its position in plan_->changed (`index` must be in it).
  size_t ChangedPosition(uint32_t index) const;
  // The committed version and checksum of `v`, a variable of the open step,
  // when it began.
  const VariableBegin& BeginOf(const StepVariable& v) const;
  // Every participant reported: the plan (MergeReports, then
  // PlanCollectives), or the commit when it needs no collective.
  void ResolveBarrier(absl::Time now);
  // The variables the reports changed (step_plan.h); nullopt when a digest
  // does not hold (detail is needed). INVALID_ARGUMENT: a non-finite value
  // where the variable refuses them. Its phases: GatherReports,
  // DigestsHold, Exceptional, then the merge.
  absl::StatusOr<std::optional<std::vector<ChangedVariable>>> MergeReports() const;
  struct Gathered;
  absl::StatusOr<Gathered> GatherReports() const;
  bool DigestsHold(const Gathered& g) const;
  // Per variable: 1 when it is merged replica by replica.
  std::vector<uint8_t> Exceptional(const Gathered& g) const;
  // ResolveFinish's phases; each fails the step and returns false (or
  // nullopt) when it finds a reason to.
  bool ResultsFinite(absl::Time now);
  std::optional<std::vector<uint64_t>> FinalChecksums(absl::Time now);
  bool FinishDigestsHold(const std::vector<uint64_t>& final_checksums, absl::Time now);
  void ReportDivergences(const std::vector<Divergence>& divergences) const;
  void ResolveFinish(absl::Time now);
  void Fail(absl::Status status, absl::Time now);
  void Commit(std::vector<Divergence> divergences, absl::Time now);
  // Records the open step's resolution and closes it.
  void Close(StepResolution res, absl::Time now);
  StepEvent NewEvent(StepEvent::Kind kind, absl::Time now) const;  // of the open step
  void Emit(StepEvent e);

  GroupFn group_;
  CommitFn commit_;
  FailedFn failed_;
  // The open step, shared as it was opened with readers (shared_info()); its
  // state lives in open_state_, so the shared description never changes.
  std::shared_ptr<StepInfo> open_;
  StepState open_state_ = StepState::kOpen;
  std::vector<Progress> progress_;
  // Per participant, the variables it holds a replica of that takes part
  // (layout indices), and per variable the replicas that sit the step out
  // (sorted; absent when none); rebuilt only when the layout changes.
  struct HeldIndex {
    SharedVector<StepVariable> variables;  // the layout's, shared
    uint64_t layout_id = 0;
    std::vector<IndexRanges> held;
    absl::flat_hash_map<uint32_t, std::vector<int32_t>> sitting_out;
    absl::flat_hash_map<uint64_t, uint32_t> index_of;  // by variable id
    absl::flat_hash_map<TaskKey, size_t> participant_of;
  };
  // Builds the index of a layout: O(variables x replicas), once per layout.
  static HeldIndex IndexLayout(const StepInfo& info);
  HeldIndex held_;
  bool detail_wanted_ = false;
  StepPlan detail_request_;  // the plan with send_detail, while detail_wanted_
  std::optional<StepPlan> plan_;
  // plan_->changed one by one, and the checksum each ends with (0: the
  // reduction decides, until the finishes say).
  std::vector<uint32_t> changed_list_;
  // Per layout index, its position in changed_list_ (when it is there).
  std::vector<uint32_t> changed_position_;
  std::vector<uint64_t> expected_;
  std::vector<Divergence> divergences_;  // found at the barrier
  bool warned_ = false;
  bool last_plan_failed_ = false;
  uint64_t next_epoch_;
  int64_t last_committed_;
  // Recent resolutions and their steps' infos, newest last.
  std::deque<std::shared_ptr<const StepResolution>> recent_;
  std::deque<std::shared_ptr<const StepInfo>> recent_info_;
  std::deque<StepEvent> events_;
  int64_t next_seq_ = 1;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_STEP_BARRIER_H_

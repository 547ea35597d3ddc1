// SPDX-License-Identifier: Apache-2.0
#include "server/core/step_coordinator.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "spdlog/spdlog.h"

namespace repvar::server {

StepCoordinator::ChangeMark StepCoordinator::MarkLocked() const {
  const StepInfo* open = steps_.open();
  return ChangeMark{
      steps_.next_event_seq(),
      open ? std::pair<uint64_t, int>{open->epoch, static_cast<int>(steps_.open_state()) * 2 +
                                                       (steps_.detail_wanted() ? 1 : 0)}
           : std::pair<uint64_t, int>{0, 0}};
}

void StepCoordinator::NotifyLocked(const ChangeMark& before, Wakers* wake) {
  const ChangeMark now = MarkLocked();
  if (now.event_seq != before.event_seq) events_cv_.SignalAll();
  if (now.open != before.open) {
    if (now.open.first == 0) registry_->LimitLeases(std::nullopt);  // no step open
    step_cv_.SignalAll();
    for (auto& f : wakers_) wake->fns.push_back(std::move(f));
    wakers_.clear();
  }
}

namespace {

// The first epoch of a run: after every epoch recorded, and at least the
// clock in microseconds, so that a coordinator with nothing recorded
// (--ephemeral, a new data dir) still begins above the epochs an earlier one
// gave workers that outlived it (as fences do, Registry::NextFence).
uint64_t FirstEpoch(uint64_t last_recorded, absl::Time now) {
  return std::max<uint64_t>(last_recorded + 1,
                            static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMicros(now))));
}

// S1: a step is begun with a positive barrier timeout. INVALID_ARGUMENT.
absl::Status CheckBarrierTimeout(absl::Duration barrier_timeout) {
  if (barrier_timeout > absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError("a step needs a positive barrier timeout");
}

}  // namespace

StepCoordinator::StepCoordinator(Clock* clock, Registry* registry, CollectiveGroups* groups)
    : clock_(clock),
      registry_(registry),
      groups_(groups),
      steps_([this](const std::vector<StepParticipant>& p, size_t n,
                    bool fresh) { return Group(p, n, fresh); },
             // Called by the barrier, which mu_ guards.
             [this](const StepRecord& r)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return RecordCommit(r); },
             [this](int64_t step, uint64_t epoch)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { RecordFailure(step, epoch); },
             FirstEpoch(registry->Read([](const ClusterState& s) { return s.last_epoch(); }),
                        clock->Now()),
             registry->Read([](const ClusterState& s) { return s.last_committed_step(); })) {}

void StepCoordinator::Recovered() {
  const auto [last_epoch, last_committed, last_step] = registry_->Read([](const ClusterState& s) {
    return std::make_tuple(s.last_epoch(), s.last_committed_step(), s.last_step());
  });
  const uint64_t next_epoch = FirstEpoch(last_epoch, clock_->Now());
  RankedLock lock(&mu_);
  steps_.ContinueFrom(next_epoch, last_committed);
  first_epoch_ = next_epoch;
  earlier_ = last_step;
  earlier_begun_ = last_epoch;
}

absl::StatusOr<StepCoordinator::SharedResolution> StepCoordinator::Unknown(uint64_t epoch) const {
  // An earlier run's epochs that may still be asked about lie between its
  // last resolved step and the last step it began.
  if (epoch == 0 || epoch >= first_epoch_ || epoch < earlier_.epoch || epoch > earlier_begun_) {
    return absl::NotFoundError(absl::StrCat("no step with epoch ", epoch, " is known"));
  }
  StepResolution r;
  r.epoch = epoch;
  if (epoch == earlier_.epoch) {
    r.step = earlier_.step;
    r.state = StepState::kCommitted;
    r.changed = earlier_.changed;
  } else {
    r.state = StepState::kFailed;
    r.status = absl::AbortedError(absl::StrCat(
        "the step of epoch ", epoch,
        " was open when the coordinator restarted; it did not commit (begin it again)"));
  }
  return std::make_shared<const StepResolution>(std::move(r));
}

// ---- The write gate ----

absl::Status StepCoordinator::EnterWriteGate() {
  RankedLock lock(&mu_);
  while (holds_ > 0) step_cv_.Wait(mu_.native());  // a cut is being taken
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

void StepCoordinator::LeaveWriteGate() {
  RankedLock lock(&mu_);
  --writes_in_flight_;
  step_cv_.SignalAll();
}

absl::Status StepCoordinator::HoldWrites(absl::Time deadline) {
  RankedLock lock(&mu_);
  ++holds_;
  auto busy = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return step_beginning_ || steps_.open() != nullptr || writes_in_flight_ > 0;
  };
  while (busy()) {
    if (step_cv_.WaitWithDeadline(mu_.native(), deadline) && busy()) {
      --holds_;
      step_cv_.SignalAll();
      const StepInfo* open = steps_.open();
      return absl::DeadlineExceededError(
          open != nullptr
              ? absl::StrCat("step ", open->step, " is still open")
              : absl::StrCat(writes_in_flight_, " cross-replica write(s) still in flight"));
    }
  }
  return absl::OkStatus();
}

void StepCoordinator::ReleaseWrites() {
  RankedLock lock(&mu_);
  --holds_;
  step_cv_.SignalAll();
}

bool StepCoordinator::IsOpen() const {
  RankedLock lock(&mu_);
  return steps_.open() != nullptr;
}

std::optional<int64_t> StepCoordinator::OpenStepOf(uint64_t variable_id) const {
  RankedLock lock(&mu_);
  const StepInfo* open = steps_.open();
  if (open == nullptr) return std::nullopt;
  for (const StepVariable& sv : open->variables) {
    if (sv.id == variable_id) return open->step;
  }
  return std::nullopt;
}

// ---- Steps ----

namespace {

// Each replica's worker as an index into the live workers (-1: not live),
// one list per distinct placement list: the variables created together
// share theirs, so 10,000 variables cost a few lists here.
class LiveLists {
 public:
  explicit LiveLists(const std::map<TaskKey, int32_t>& index) : index_(index) {}
  // The same list for equal placement lists, even when created apart.
  const std::vector<int32_t>& Of(const Placements& placement) {
    auto [where, fresh] = by_list_.try_emplace(&placement.list());
    if (!fresh) return *where->second;
    for (const auto& [list, live] : distinct_) {
      if (*list == placement.list()) return *(where->second = live.get());
    }
    auto live = std::make_unique<std::vector<int32_t>>();
    live->reserve(placement.size());
    for (const Placement& p : placement) {
      auto l = index_.find(p.task);
      live->push_back(l != index_.end() ? l->second : -1);
    }
    where->second = live.get();
    distinct_.emplace_back(&placement.list(), std::move(live));
    return *where->second;
  }

 private:
  const std::map<TaskKey, int32_t>& index_;
  absl::flat_hash_map<const std::vector<Placement>*, const std::vector<int32_t>*> by_list_;
  std::vector<std::pair<const std::vector<Placement>*, std::unique_ptr<std::vector<int32_t>>>>
      distinct_;
};

// A variable's replicas on live workers that are not up to date: they sit
// out (those on workers that are not live do in every variable's list).
std::vector<int32_t> SittingOut(const VariableRecord& v, const std::vector<int32_t>& live_of) {
  std::vector<int32_t> out;
  for (const auto& [i, r] : v.exceptions) {
    if (r.state != ReplicaState::kUpToDate && live_of[static_cast<size_t>(i)] >= 0) {
      out.push_back(i);
    }
  }
  return out;
}

// The participants and variables a step begun now would have (no step
// number, no barrier timeout). The variables whose replicas are all up to
// date share one replica -> participant list per placement list.
// `behind`: the live tasks with a replica that sits out.
StepInfo LayoutOf(const ClusterState& state, std::vector<TaskKey>& behind) {
  // Participants: the live tasks (in task order) holding an up-to-date
  // replica of an initialized variable, in that order.
  std::vector<const WorkerRecord*> live;
  std::map<TaskKey, int32_t> index;
  for (const auto& [key, w] : state.workers()) {
    if (!w.IsLive()) continue;
    index[key] = static_cast<int32_t>(live.size());
    live.push_back(&w);
  }
  // Which live workers hold an up-to-date replica, and which hold only
  // others.
  LiveLists lists(index);
  std::vector<bool> holds(live.size(), false);
  std::vector<bool> stale(live.size(), false);
  absl::flat_hash_set<const std::vector<int32_t>*> counted;
  std::vector<std::pair<const VariableRecord*, std::vector<int32_t>>> taking_part;
  for (const auto& [id, v] : state.variables()) {  // by id
    if (v.version == 0) continue;
    const std::vector<int32_t>& live_of = lists.Of(v.placement);
    std::vector<int32_t> out = SittingOut(v, live_of);
    if (out.empty() && counted.insert(&live_of).second) {
      for (int32_t l : live_of) {
        if (l >= 0) holds[static_cast<size_t>(l)] = true;
      }
    }
    for (size_t i = 0, k = 0; i < live_of.size() && !out.empty(); ++i) {
      const bool sits = k < out.size() && out[k] == static_cast<int32_t>(i);
      k += sits ? 1 : 0;
      if (live_of[i] >= 0) (sits ? stale : holds)[static_cast<size_t>(live_of[i])] = true;
    }
    taking_part.emplace_back(&v, std::move(out));
  }
  StepInfo info;
  std::vector<int32_t> rank(live.size(), -1);
  for (size_t i = 0; i < live.size(); ++i) {
    if (stale[i]) behind.push_back(live[i]->task);
    if (stale[i] && !holds[i]) info.sitting_out.push_back(live[i]->task);
    if (!holds[i]) continue;
    rank[i] = static_cast<int32_t>(info.participants.size());
    info.participants.push_back(
        StepParticipant{live[i]->task, live[i]->incarnation, live[i]->address});
  }
  // Each variable's list in participant ranks: the placement's, shared,
  // unless some of its replicas sit out.
  absl::flat_hash_map<const std::vector<int32_t>*, SharedVector<int32_t>> ranked;
  std::vector<StepVariable> variables;
  std::vector<VariableBegin> begin;
  for (const auto& [v, out] : taking_part) {
    const std::vector<int32_t>& live_of = lists.Of(v->placement);
    auto [where, fresh] = ranked.try_emplace(&live_of);
    if (fresh) {
      std::vector<int32_t> r;
      r.reserve(live_of.size());
      for (int32_t l : live_of) r.push_back(l >= 0 ? rank[static_cast<size_t>(l)] : -1);
      where->second = std::move(r);
    }
    StepVariable sv;
    sv.id = v->id;
    sv.name = v->def.name;
    sv.aggregation = v->def.aggregation;
    sv.spec = v->def.tensor;
    sv.allow_nonfinite = v->def.allow_nonfinite;
    sv.replica_participant = where->second;
    if (!out.empty()) {
      std::vector<int32_t>& own = sv.replica_participant.Own();
      for (int32_t i : out) own[static_cast<size_t>(i)] = -1;
    }
    variables.push_back(std::move(sv));
    begin.push_back(VariableBegin{v->version, v->checksum});
  }
  info.variables = std::move(variables);
  info.begin = std::move(begin);
  info.layout_id = LayoutId(info);
  return info;
}

// The committed version and checksum of each of `variables`, all of which
// `state` still holds: deleting one moves the layout revision.
std::vector<VariableBegin> CommittedOf(const ClusterState& state,
                                       const SharedVector<StepVariable>& variables) {
  std::vector<VariableBegin> begin;
  begin.reserve(variables.size());
  for (const StepVariable& sv : variables) {
    const VariableRecord* v = state.FindId(sv.id);
    REPVAR_CHECK_MSG(v != nullptr, absl::StrCat("variable ", sv.name,
                                                " left the layout without a new layout revision"));
    begin.push_back(VariableBegin{v->version, v->checksum});
  }
  return begin;
}

// The replicas of `v` that miss a step's values: those that sat it out,
// and those whose participant is `gone` (sorted).
std::vector<int32_t> MissingWith(const std::vector<int32_t>& sitting_out, const StepVariable& v,
                                 const std::vector<bool>& gone) {
  std::vector<int32_t> missing;
  for (size_t r = 0; r < v.replica_participant.size(); ++r) {
    const int32_t p = v.replica_participant[r];
    if (p >= 0 && gone[static_cast<size_t>(p)]) missing.push_back(static_cast<int32_t>(r));
  }
  std::vector<int32_t> all;
  std::merge(sitting_out.begin(), sitting_out.end(), missing.begin(), missing.end(),
             std::back_inserter(all));
  return all;
}

// Who may hold a read lease while `info` is open: its participants, by the
// incarnation taking part, but those with a replica `behind`.
absl::flat_hash_map<TaskKey, uint64_t> LeaseHoldersDuring(const StepInfo& info,
                                                          const std::vector<TaskKey>& behind) {
  absl::flat_hash_map<TaskKey, uint64_t> holders;
  holders.reserve(info.participants.size());
  for (const StepParticipant& p : info.participants) holders[p.task] = p.incarnation;
  for (const TaskKey& t : behind) holders.erase(t);
  return holders;
}

}  // namespace

StepInfo StepCoordinator::Describe(int64_t step, absl::Duration barrier_timeout) const {
  // Nothing in the layout moves without a new layout revision: while it
  // stays, each step shares the kept layout's variables (SharedVector)
  // instead of building or copying them. Values committed since (a step's
  // writes) change only the begin versions, one pair per variable; while
  // no value changes either, those are shared too.
  const SharedVector<StepVariable>* kept = described_ ? &described_->variables : nullptr;
  const std::pair<uint64_t, uint64_t> kept_revisions = described_revisions_;
  std::optional<StepInfo> fresh;
  std::optional<std::vector<VariableBegin>> begin;
  std::pair<uint64_t, uint64_t> revisions;
  std::vector<TaskKey> behind;
  registry_->Read([&](const ClusterState& state) {
    revisions = {state.layout_revision(), state.value_revision()};
    if (kept == nullptr || kept_revisions.first != revisions.first) {
      fresh = LayoutOf(state, behind);
    } else if (kept_revisions.second != revisions.second) {
      begin = CommittedOf(state, *kept);
    }
  });
  if (fresh) {
    described_ = *std::move(fresh);
    described_behind_ = std::move(behind);
  } else if (begin) {
    described_->begin = *std::move(begin);
  }
  described_revisions_ = revisions;
  StepInfo info = *described_;
  info.step = step;
  info.barrier_timeout = barrier_timeout;
  return info;
}

absl::StatusOr<SharedStep> StepCoordinator::BeginStep(int64_t step,
                                                      absl::Duration barrier_timeout) {
  REPVAR_RETURN_IF_ERROR(CheckBarrierTimeout(barrier_timeout));
  Wakers wake;  // run after the lock below is released
  RankedLock lock(&mu_);
  while (true) {
    while (step_beginning_) step_cv_.Wait(mu_.native());
    REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<const StepInfo> open, steps_.CheckBegin(step));
    if (open) return SharedStep{open, *steps_.state(open->epoch)};
    if (holds_ == 0) break;
    step_cv_.Wait(mu_.native());  // a cut is being taken: begin after it
  }
  // S1: no new cross-replica write may start; wait for those in flight.
  step_beginning_ = true;
  while (writes_in_flight_ > 0) step_cv_.Wait(mu_.native());
  StepInfo info = Describe(step, barrier_timeout);
  // Limited first: a lease granted before the limit is one the check sees.
  registry_->LimitLeases(LeaseHoldersDuring(info, described_behind_));
  if (absl::Status leases = CheckLeasesOfThoseBehind(step); !leases.ok()) {
    registry_->LimitLeases(std::nullopt);
    step_beginning_ = false;
    step_cv_.SignalAll();
    return leases;
  }
  const uint64_t epoch = steps_.next_epoch();
  absl::Status recorded = registry_
                              ->Commit([&](const ClusterState&) -> absl::StatusOr<Record> {
                                return Record{{StepBegun{step, epoch}}};
                              })
                              .status();
  step_beginning_ = false;
  step_cv_.SignalAll();
  if (!recorded.ok()) {
    registry_->LimitLeases(std::nullopt);
    return recorded;
  }
  const ChangeMark before = MarkLocked();
  steps_.Open(std::move(info), clock_->Now());
  NotifyLocked(before, &wake);
  SharedStep opened{steps_.shared_info(epoch), *steps_.state(epoch)};
  spdlog::debug("step {} (epoch {}) begun: {} participant(s), {} variable(s)", step, epoch,
                opened.info->participants.size(), opened.info->variables.size());
  return opened;
}

absl::Status StepCoordinator::CheckLeasesOfThoseBehind(int64_t step) const {
  // A replica that sits out keeps its value while the step commits a new
  // one: its worker must not be serving the old one from a read lease
  // (docs/architecture.md, "Local reads"). It gets none while it is behind,
  // so this waits out one granted before, once; and a superseded process's.
  if (registry_->membership_options().read_lease <= absl::ZeroDuration()) return absl::OkStatus();
  const absl::Time until =
      std::max(registry_->SupersededLeasesEnd(), registry_->LeaseHeldUntil(described_behind_));
  const absl::Time now = clock_->Now();
  if (until <= now) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "step ", step, " waits ", absl::FormatDuration(until - now),
      " for the read lease of a worker whose replica sits it out to end; begin it again then"));
}

std::optional<absl::StatusOr<SharedStep>> StepCoordinator::JoinOpenStep(
    int64_t step, absl::Duration barrier_timeout) const {
  REPVAR_RETURN_IF_ERROR(CheckBarrierTimeout(barrier_timeout));
  RankedLock lock(&mu_);
  if (step_beginning_) return std::nullopt;  // BeginStep waits for that one
  absl::StatusOr<std::shared_ptr<const StepInfo>> open = steps_.CheckBegin(step);
  if (!open.ok()) return open.status();
  if (*open == nullptr) return std::nullopt;  // this call would open it
  return SharedStep{*open, *steps_.state((*open)->epoch)};
}

absl::StatusOr<SharedStep> StepCoordinator::GetStep(uint64_t epoch) const {
  RankedLock lock(&mu_);
  std::shared_ptr<const StepInfo> info = steps_.shared_info(epoch);
  if (!info) return absl::NotFoundError(absl::StrCat("no step with epoch ", epoch, " is known"));
  return SharedStep{std::move(info), *steps_.state(epoch)};
}

absl::Status StepCoordinator::AbortStep(uint64_t epoch, absl::string_view reason) {
  Wakers wake;
  RankedLock lock(&mu_);
  if (!steps_.state(epoch)) {
    // Not this run's: an earlier run's step that the restart failed is
    // aborted already; one it committed cannot be; any other is unknown.
    REPVAR_ASSIGN_OR_RETURN(SharedResolution earlier, Unknown(epoch));
    if (earlier->state == StepState::kCommitted) {
      return absl::FailedPreconditionError(
          absl::StrCat("the step of epoch ", epoch, " already committed; it cannot be aborted"));
    }
    return absl::OkStatus();
  }
  const ChangeMark before = MarkLocked();
  absl::Status aborted = steps_.Abort(epoch, reason, clock_->Now());
  NotifyLocked(before, &wake);
  return aborted;
}

absl::Status StepCoordinator::ReportStep(const WorkerReport& report) {
  Wakers wake;
  RankedLock lock(&mu_);
  const ChangeMark before = MarkLocked();
  absl::Status reported = steps_.Report(report, clock_->Now());
  NotifyLocked(before, &wake);
  return reported;
}

absl::Status StepCoordinator::FinishStep(const WorkerFinish& finish) {
  Wakers wake;
  RankedLock lock(&mu_);
  const ChangeMark before = MarkLocked();
  absl::Status finished = steps_.Finish(finish, clock_->Now());
  NotifyLocked(before, &wake);
  return finished;
}

void StepCoordinator::WhenStepPlanned(uint64_t epoch, bool detailed, PlanCallback done) {
  absl::StatusOr<std::variant<StepPlan, SharedResolution>> ready;
  {
    RankedLock lock(&mu_);
    if (shut_down_) {
      ready = absl::UnavailableError("the coordinator is shutting down");
    } else if (const StepPlan* p = steps_.plan(epoch, detailed)) {
      ready = *p;
    } else if (SharedResolution r = steps_.resolution(epoch)) {
      ready = std::move(r);
    } else if (!steps_.state(epoch)) {
      absl::StatusOr<SharedResolution> earlier = Unknown(epoch);
      if (earlier.ok()) {
        ready = *std::move(earlier);
      } else {
        ready = earlier.status();
      }
    } else {
      // Checked and registered under one lock: no change can slip between.
      wakers_.push_back([this, epoch, detailed, done] { WhenStepPlanned(epoch, detailed, done); });
      return;
    }
  }
  done(std::move(ready));
}

void StepCoordinator::WhenStepResolved(uint64_t epoch, ResolutionCallback done) {
  absl::StatusOr<SharedResolution> ready;
  {
    RankedLock lock(&mu_);
    if (shut_down_) {
      ready = absl::UnavailableError("the coordinator is shutting down");
    } else if (SharedResolution r = steps_.resolution(epoch)) {
      ready = std::move(r);
    } else if (!steps_.state(epoch)) {
      ready = Unknown(epoch);
    } else {
      wakers_.push_back([this, epoch, done] { WhenStepResolved(epoch, done); });
      return;
    }
  }
  done(std::move(ready));
}

void StepCoordinator::ShutdownWaiters() {
  Wakers wake;
  RankedLock lock(&mu_);
  shut_down_ = true;
  wake.fns.swap(wakers_);
}

StepsStatus StepCoordinator::GetSteps() const {
  RankedLock lock(&mu_);
  StepsStatus out;
  if (const StepInfo* open = steps_.open()) {
    out.open = *open;
    out.open->state = steps_.open_state();
  }
  out.progress = steps_.progress(clock_->Now());
  out.recent.reserve(steps_.recent().size());
  for (const SharedResolution& r : steps_.recent()) out.recent.push_back(*r);
  out.last_committed_step = steps_.last_committed_step();
  return out;
}

std::vector<StepEvent> StepCoordinator::WaitStepEvents(int64_t after_seq, absl::Time deadline) {
  RankedLock lock(&mu_);
  while (steps_.next_event_seq() <= after_seq + 1) {
    if (events_cv_.WaitWithDeadline(mu_.native(), deadline)) break;
  }
  return steps_.EventsAfter(after_seq);
}

int64_t StepCoordinator::LatestStepEventSeq() const {
  RankedLock lock(&mu_);
  return steps_.next_event_seq() - 1;
}

void StepCoordinator::Tick(absl::Time now, const std::vector<LiveTask>& dead) {
  Wakers wake;
  RankedLock lock(&mu_);
  const ChangeMark before = MarkLocked();
  for (const LiveTask& t : dead) steps_.WorkerDied(t.key, t.incarnation, now);
  steps_.Tick(now, [&](const TaskKey& task) -> std::string {
    std::optional<LiveTask> live = registry_->Find(task);
    if (!live) return "declared dead";
    return absl::StrCat("last heartbeat ", absl::ToDoubleSeconds(now - live->last_heartbeat),
                        " s ago");
  });
  NotifyLocked(before, &wake);
}

// ---- The barrier's hooks ----

std::pair<std::string, uint32_t> StepCoordinator::Group(
    const std::vector<StepParticipant>& participants, size_t tags, bool fresh) {
  std::vector<GroupMember> members;
  for (const StepParticipant& p : participants) members.push_back({p.task, p.incarnation});
  return groups_->ForStep(members, tags, fresh);
}

absl::Status StepCoordinator::RecordCommit(const StepRecord& step) {
  return registry_
      ->Commit([&](const ClusterState& state) -> absl::StatusOr<Record> {
        // Only a worker still live under the incarnation that took part
        // acknowledges; any other misses the values (and is resynced).
        const std::vector<StepParticipant>& participants = step.layout->participants;
        std::vector<bool> gone(participants.size(), false);
        bool any_gone = false;
        for (size_t p = 0; p < participants.size(); ++p) {
          gone[p] = !state.IsLive(participants[p].task, participants[p].incarnation);
          any_gone = any_gone || gone[p];
        }
        Record record;
        StepCommitted committed{step.step, step.epoch, {}};
        for (const StepRecord::Variable& rv : step.variables) {
          const VariableRecord* v = state.FindId(rv.id);
          if (v == nullptr) continue;  // deleted since (not while in the step: refused)
          std::vector<int32_t> missing = rv.sitting_out;
          if (any_gone) {
            missing = MissingWith(rv.sitting_out, step.layout->variables[rv.index], gone);
          }
          if (rv.changed) {
            committed.changed.push_back(
                CommittedVariable{rv.id, v->def.name, rv.version, rv.checksum});
            // The value now lives on the replicas only.
            record.changes.push_back(ValueCommitted{
                rv.id, rv.version, rv.checksum, nullptr, Holders::AllBut(std::move(missing)), {}});
          } else {
            record.changes.push_back(ReplicasWritten{rv.id, rv.version, rv.checksum,
                                                     Holders::AllBut(std::move(missing))});
          }
        }
        record.changes.push_back(std::move(committed));
        return record;
      })
      .status();
}

void StepCoordinator::RecordFailure(int64_t step, uint64_t epoch) {
  absl::Status s = registry_
                       ->Commit([&](const ClusterState&) -> absl::StatusOr<Record> {
                         return Record{{StepFailed{step, epoch}}};
                       })
                       .status();
  if (!s.ok()) spdlog::error("cannot record the failure of step {}: {}", step, s.ToString());
}

}  // namespace repvar::server

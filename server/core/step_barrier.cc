// SPDX-License-Identifier: Apache-2.0
#include "server/core/step_barrier.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/metrics.h"
#include "common/base/status_util.h"
#include "server/core/core_metrics.h"
#include "server/core/step_plan.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

constexpr size_t kRecentSteps = 32;
constexpr size_t kRecentEvents = 4096;

std::string StepName(int64_t step, uint64_t epoch) {
  return absl::StrCat("step ", step, " (epoch ", epoch, ")");
}

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

}  // namespace

absl::StatusOr<std::shared_ptr<const StepInfo>> StepBarrier::CheckBegin(int64_t step) const {
  if (step < 1) return absl::InvalidArgumentError("step ids start at 1");
  if (open_) {
    if (open_->step == step) return open_;
    return absl::FailedPreconditionError(absl::StrCat(StepName(open_->step, open_->epoch),
                                                      " is open; commit or abort it before ",
                                                      "beginning step ", step));
  }
  if (step <= last_committed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " is not above the last ", "committed step ", last_committed_));
  }
  return std::shared_ptr<const StepInfo>();
}

uint64_t StepBarrier::Open(StepInfo info, absl::Time now) {
  REPVAR_CHECK_MSG(info.begin.size() == info.variables.size(),
                   "a step opens with a begin version for each of its variables");
  info.epoch = next_epoch_++;
  info.state = StepState::kOpen;
  info.begun = now;
  open_ = std::make_shared<StepInfo>(std::move(info));
  open_state_ = StepState::kOpen;
  progress_.assign(open_->participants.size(), Progress{});
  plan_.reset();
  divergences_.clear();
  warned_ = false;
  Emit(NewEvent(StepEvent::Kind::kBegun, now));
  const uint64_t epoch = open_->epoch;
  if (progress_.empty()) ResolveBarrier(now);  // nobody to wait for
  return epoch;
}

absl::StatusOr<size_t> StepBarrier::CheckCaller(int64_t step, uint64_t epoch, const TaskKey& task,
                                                uint64_t incarnation,
                                                absl::string_view what) const {
  if (!open_ || open_->epoch != epoch || open_->step != step) {
    bool closed = step <= last_committed_ || (open_ && step < open_->step) ||
                  (epoch != 0 && epoch < next_epoch_ && (!open_ || open_->epoch != epoch));
    if (closed) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " for ", StepName(step, epoch), " from ", task.ToString(), ": that step is closed",
          open_ ? absl::StrCat("; the open step is ", StepName(open_->step, open_->epoch)) : ""));
    }
    return absl::OutOfRangeError(absl::StrCat(what, " for ", StepName(step, epoch), " from ",
                                              task.ToString(), ": that step has not begun"));
  }
  for (size_t i = 0; i < open_->participants.size(); ++i) {
    const StepParticipant& p = open_->participants[i];
    if (p.task != task) continue;
    if (p.incarnation != incarnation) {
      return absl::AbortedError(
          absl::StrCat(what, " from ", task.ToString(), " incarnation ", incarnation,
                       ": the step's participant is incarnation ", p.incarnation));
    }
    return i;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, " from ", task.ToString(), ": not a participant of ", StepName(step, epoch)));
}

absl::Status StepBarrier::Report(const WorkerReport& report, absl::Time now) {
  auto who = CheckCaller(report.step, report.epoch, report.task, report.incarnation, "report");
  if (!who.ok()) return who.status();
  const size_t me = *who;
  // Normalize (sorted by variable, replica) so that a retry in another order
  // is recognised as identical.
  WorkerReport r = report;
  std::sort(r.replicas.begin(), r.replicas.end(), [](const auto& a, const auto& b) {
    return std::tie(a.variable_id, a.replica) < std::tie(b.variable_id, b.replica);
  });
  for (size_t i = 0; i < r.replicas.size(); ++i) {
    const ReplicaReport& rr = r.replicas[i];
    if (i > 0 && rr.variable_id == r.replicas[i - 1].variable_id &&
        rr.replica == r.replicas[i - 1].replica) {
      return absl::InvalidArgumentError(absl::StrCat("report from ", r.task.ToString(),
                                                     " names variable ", rr.variable_id,
                                                     " replica ", rr.replica, " twice"));
    }
    const StepVariable* v = FindVariable(rr.variable_id);
    if (v == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("report from ", r.task.ToString(), " names variable id ", rr.variable_id,
                       ", which is not in ", StepName(open_->step, open_->epoch),
                       " (variables created or initialized during a step join the next one)"));
    }
    if (rr.replica < 0 || static_cast<size_t>(rr.replica) >= v->replica_participant.size() ||
        v->replica_participant[rr.replica] != static_cast<int32_t>(me)) {
      return absl::PermissionDeniedError(
          absl::StrCat("report from ", r.task.ToString(), " names ", v->name, "/", rr.replica,
                       ", a replica this worker does not hold in this step"));
    }
  }
  Progress& p = progress_[me];
  if (p.report) {
    if (p.report->replicas == r.replicas) return absl::OkStatus();  // a retry
    return absl::AlreadyExistsError(absl::StrCat(
        r.task.ToString(), " already reported for ", StepName(open_->step, open_->epoch),
        " with different contents; a worker sends one report per step"));
  }
  if (open_state_ != StepState::kOpen) {
    return absl::FailedPreconditionError("the step's barrier already resolved");
  }
  p.report = std::move(r);
  p.reported_at = now;
  StepEvent e = NewEvent(StepEvent::Kind::kReported, now);
  e.task = report.task;
  Emit(std::move(e));
  for (const Progress& q : progress_) {
    if (!q.report) return absl::OkStatus();
  }
  ResolveBarrier(now);
  return absl::OkStatus();
}

void StepBarrier::ResolveBarrier(absl::Time now) {
  absl::StatusOr<std::vector<ChangedVariable>> changed = MergeReports();
  if (!changed.ok()) {
    Fail(changed.status(), now);
    return;
  }
  StepDecision decision = PlanCollectives(*changed);
  ReportDivergences(decision.divergences);
  StepPlan plan;
  plan.step = open_->step;
  plan.epoch = open_->epoch;
  plan.changed_ids = std::move(decision.changed_ids);
  plan.changed_checksums = std::move(decision.changed_checksums);
  plan.collectives = std::move(decision.collectives);
  divergences_ = std::move(decision.divergences);
  if (plan.collectives.empty()) {
    plan_ = std::move(plan);
    Commit(std::move(divergences_), now);
    return;
  }
  auto [group, first_tag] = group_(open_->participants, plan.collectives.size(), last_plan_failed_);
  last_plan_failed_ = false;
  plan.group = std::move(group);
  for (size_t i = 0; i < plan.collectives.size(); ++i) {
    plan.collectives[i].tag = first_tag + static_cast<uint32_t>(i);
  }
  // Reductions move every byte about twice; allow 50 MB/s.
  uint64_t bytes = 0;
  for (const StepVariable& v : open_->variables) bytes += static_cast<uint64_t>(*v.spec.ByteSize());
  plan.timeout = absl::Seconds(30) + absl::Seconds(static_cast<double>(bytes) / 25e6);
  plan_ = std::move(plan);
  open_state_ = StepState::kAggregating;
  Emit(NewEvent(StepEvent::Kind::kAggregating, now));
}

absl::StatusOr<std::vector<ChangedVariable>> StepBarrier::MergeReports() const {
  // Only the variables some worker reported are walked (a report names the
  // replicas whose value changed): the barrier's work follows what changed,
  // not the step's size. Reports are sorted by (variable, replica): one
  // merge walk over them, in variable order.
  std::vector<uint64_t> reported;
  for (const Progress& p : progress_) {
    for (const ReplicaReport& rr : p.report->replicas) reported.push_back(rr.variable_id);
  }
  std::sort(reported.begin(), reported.end());
  reported.erase(std::unique(reported.begin(), reported.end()), reported.end());
  std::vector<size_t> cursor(progress_.size(), 0);
  std::vector<ChangedVariable> changed;
  for (uint64_t id : reported) {
    const StepVariable& v = *FindVariable(id);  // Report checked it is in the step
    const uint64_t begin_checksum = BeginOf(v).checksum;
    ChangedVariable c{&v, std::vector<uint64_t>(v.replica_participant.size(), begin_checksum)};
    bool differs = false;
    for (size_t w = 0; w < progress_.size(); ++w) {
      const std::vector<ReplicaReport>& reports = progress_[w].report->replicas;
      for (; cursor[w] < reports.size() && reports[cursor[w]].variable_id == v.id; ++cursor[w]) {
        const ReplicaReport& rr = reports[cursor[w]];
        if (rr.first_nonfinite >= 0 && !v.allow_nonfinite) {
          const TaskKey& t = open_->participants[v.replica_participant[rr.replica]].task;
          return absl::InvalidArgumentError(
              absl::StrCat(StepName(open_->step, open_->epoch), " failed: ", v.name, "/",
                           rr.replica, " on ", t.ToString(), " has a non-finite value at element ",
                           rr.first_nonfinite, " (allow_nonfinite is off); nothing changed"));
        }
        c.checksums[rr.replica] = rr.checksum;
        differs = differs || rr.checksum != begin_checksum;
      }
    }
    if (differs) changed.push_back(std::move(c));
  }
  return changed;
}

void StepBarrier::ReportDivergences(const std::vector<Divergence>& divergences) const {
  static Counter& diverged = DivergencesRepaired("step");
  for (const Divergence& d : divergences) {
    diverged.Add(d.repaired.size());
    const std::vector<int32_t> voters = Voters(*FindVariable(d.variable_id));
    const int32_t source = *std::find_if(voters.begin(), voters.end(), [&](int32_t i) {
      return d.replica_checksums[i] == d.chosen_checksum;
    });
    spdlog::warn("{}: {} diverged ({} of {} replicas disagree); repairing from replica {}",
                 StepName(open_->step, open_->epoch), d.name, d.repaired.size(), voters.size(),
                 source);
  }
}

absl::Status StepBarrier::Finish(const WorkerFinish& finish, absl::Time now) {
  auto who = CheckCaller(finish.step, finish.epoch, finish.task, finish.incarnation, "finish");
  if (!who.ok()) return who.status();
  if (open_state_ != StepState::kAggregating) {
    return absl::FailedPreconditionError(absl::StrCat("finish from ", finish.task.ToString(), ": ",
                                                      StepName(open_->step, open_->epoch),
                                                      " is not aggregating (report first)"));
  }
  Progress& p = progress_[*who];
  if (p.finish) return absl::OkStatus();  // a retry
  p.finish = finish;
  std::sort(p.finish->variables.begin(), p.finish->variables.end(),
            [](const auto& a, const auto& b) { return a.variable_id < b.variable_id; });
  if (!finish.error.empty()) {
    Fail(absl::UnavailableError(absl::StrCat(StepName(open_->step, open_->epoch),
                                             " failed: ", finish.task.ToString(),
                                             " could not aggregate: ", finish.error)),
         now);
    return absl::OkStatus();
  }
  for (const Progress& q : progress_) {
    if (!q.finish) return absl::OkStatus();
  }
  ResolveFinish(now);
  return absl::OkStatus();
}

void StepBarrier::ResolveFinish(absl::Time now) {
  // Every worker holding a replica of a changed variable must end with the
  // same value (and the planned one when the plan named it).
  for (size_t c = 0; c < plan_->changed_ids.size(); ++c) {
    const uint64_t id = plan_->changed_ids[c];
    const StepVariable* v = FindVariable(id);
    std::optional<uint64_t> agreed;
    if (plan_->changed_checksums[c] != 0) agreed = plan_->changed_checksums[c];
    for (size_t w = 0; w < progress_.size(); ++w) {
      bool holds = std::find(v->replica_participant.begin(), v->replica_participant.end(),
                             static_cast<int32_t>(w)) != v->replica_participant.end();
      if (!holds) continue;
      const std::vector<PreparedVariable>& prepared = progress_[w].finish->variables;
      auto it = std::lower_bound(
          prepared.begin(), prepared.end(), id,
          [](const PreparedVariable& x, uint64_t want) { return x.variable_id < want; });
      const PreparedVariable* pv = it != prepared.end() && it->variable_id == id ? &*it : nullptr;
      const TaskKey& t = open_->participants[w].task;
      if (pv == nullptr) {
        Fail(absl::InternalError(absl::StrCat(StepName(open_->step, open_->epoch),
                                              " failed: ", t.ToString(),
                                              " did not report its value of ", v->name)),
             now);
        return;
      }
      if (pv->first_nonfinite >= 0 && !v->allow_nonfinite) {
        // Name the replica whose own value was non-finite, if any worker
        // found one; otherwise the sum itself overflowed.
        for (size_t x = 0; x < progress_.size(); ++x) {
          for (const PreparedVariable& other : progress_[x].finish->variables) {
            if (other.variable_id != id || other.nonfinite_replica < 0) continue;
            Fail(absl::InvalidArgumentError(absl::StrCat(
                     StepName(open_->step, open_->epoch), " failed: ", v->name, "/",
                     other.nonfinite_replica, " on ", open_->participants[x].task.ToString(),
                     " has a non-finite value at element ", other.first_nonfinite,
                     " (allow_nonfinite is off); nothing changed")),
                 now);
            return;
          }
        }
        Fail(absl::InvalidArgumentError(absl::StrCat(
                 StepName(open_->step, open_->epoch), " failed: the aggregated value of ", v->name,
                 " is non-finite at element ", pv->first_nonfinite, " (on ", t.ToString(),
                 "; every replica's own value was finite, so the sum overflowed)")),
             now);
        return;
      }
      if (!agreed) agreed = pv->checksum;
      if (pv->checksum != *agreed) {
        Fail(absl::DataLossError(
                 absl::StrCat(StepName(open_->step, open_->epoch), " failed: ", t.ToString(),
                              " ended with a different value of ", v->name, " (checksum ",
                              absl::Hex(pv->checksum), ", expected ", absl::Hex(*agreed), ")")),
             now);
        return;
      }
    }
    plan_->changed_checksums[c] = agreed.value_or(BeginOf(*v).checksum);
  }
  Commit(std::move(divergences_), now);
}

void StepBarrier::Commit(std::vector<Divergence> divergences, absl::Time now) {
  StepRecord record{open_->step, open_->epoch, {}};
  StepResolution res;
  res.step = open_->step;
  res.epoch = open_->epoch;
  res.state = StepState::kCommitted;
  for (size_t c = 0; c < plan_->changed_ids.size(); ++c) {
    const uint64_t id = plan_->changed_ids[c];
    const StepVariable& v = *FindVariable(id);
    StepRecord::Variable rv;
    rv.id = id;
    rv.checksum = plan_->changed_checksums[c];
    const VariableBegin& begin = BeginOf(v);
    rv.changed = rv.checksum != begin.checksum;
    rv.version = begin.version + (rv.changed ? 1 : 0);
    for (size_t i = 0; i < v.replica_participant.size(); ++i) {
      if (v.replica_participant[i] < 0) continue;
      rv.replicas.emplace_back(static_cast<int32_t>(i),
                               open_->participants[v.replica_participant[i]].incarnation);
    }
    if (rv.changed) res.changed.push_back(CommittedVariable{id, v.name, rv.version, rv.checksum});
    record.variables.push_back(std::move(rv));
  }
  if (absl::Status s = commit_(record); !s.ok()) {
    Fail(s, now);
    return;
  }
  for (size_t i = 0; i < progress_.size(); ++i) {
    res.latencies.emplace_back(open_->participants[i].task,
                               progress_[i].reported_at - open_->begun);
  }
  res.divergences = std::move(divergences);
  last_committed_ = open_->step;
  Close(std::move(res), now);
}

void StepBarrier::Close(StepResolution res, absl::Time now) {
  open_state_ = res.state;
  StepEvent e = NewEvent(StepEvent::Kind::kResolved, now);
  e.resolution = res;
  Emit(std::move(e));
  recent_.push_back(std::make_shared<const StepResolution>(std::move(res)));
  recent_info_.push_back(open_);
  open_.reset();
  if (recent_.size() > kRecentSteps) {
    recent_.pop_front();
    recent_info_.pop_front();
  }
}

void StepBarrier::Fail(absl::Status status, absl::Time now) {
  if (!open_) return;
  spdlog::warn("{}", status.ToString());
  StepResolution res;
  res.step = open_->step;
  res.epoch = open_->epoch;
  res.state = StepState::kFailed;
  res.status = std::move(status);
  for (size_t i = 0; i < progress_.size(); ++i) {
    if (progress_[i].report) {
      res.latencies.emplace_back(open_->participants[i].task,
                                 progress_[i].reported_at - open_->begun);
    }
  }
  if (open_state_ == StepState::kAggregating) last_plan_failed_ = true;
  const int64_t step = res.step;
  const uint64_t epoch = res.epoch;
  Close(std::move(res), now);
  if (failed_) failed_(step, epoch);
}

absl::Status StepBarrier::Abort(uint64_t epoch, absl::string_view reason, absl::Time now) {
  if (open_ && open_->epoch == epoch) {
    Fail(absl::AbortedError(absl::StrCat(StepName(open_->step, epoch), " was aborted",
                                         reason.empty() ? "" : ": ", reason)),
         now);
    return absl::OkStatus();
  }
  if (std::shared_ptr<const StepResolution> r = resolution(epoch);
      r && r->state == StepState::kCommitted) {
    return absl::FailedPreconditionError(
        absl::StrCat(StepName(r->step, epoch), " already committed; it cannot be aborted"));
  }
  return absl::OkStatus();
}

void StepBarrier::WorkerDied(const TaskKey& task, uint64_t incarnation, absl::Time now) {
  if (!open_) return;
  for (const StepParticipant& p : open_->participants) {
    if (p.task == task && p.incarnation == incarnation) {
      Fail(absl::UnavailableError(
               absl::StrCat(StepName(open_->step, open_->epoch), " failed: worker ",
                            task.ToString(), " (incarnation ", incarnation,
                            ") was declared dead (missed heartbeats); begin the step again")),
           now);
      return;
    }
  }
}

void StepBarrier::Tick(absl::Time now, const std::function<std::string(const TaskKey&)>& describe) {
  if (!open_) return;
  const absl::Duration elapsed = now - open_->begun;
  const bool aggregating = open_state_ == StepState::kAggregating;
  const absl::Duration limit =
      open_->barrier_timeout + (aggregating ? plan_->timeout : absl::ZeroDuration());
  std::vector<std::string> missing;
  for (size_t i = 0; i < progress_.size(); ++i) {
    const Progress& p = progress_[i];
    if (aggregating ? !p.finish : !p.report) {
      missing.push_back(open_->participants[i].task.ToString());
    }
  }
  if (!aggregating && !warned_ && elapsed >= open_->barrier_timeout / 2) {
    warned_ = true;
    spdlog::warn("{}: half the barrier timeout ({}) passed; still waiting for {}",
                 StepName(open_->step, open_->epoch), Seconds(open_->barrier_timeout),
                 absl::StrJoin(missing, ", "));
    StepEvent e = NewEvent(StepEvent::Kind::kStragglers, now);
    e.missing = missing;
    Emit(std::move(e));
  }
  if (elapsed < limit) return;
  std::vector<std::string> detail;
  for (size_t i = 0; i < progress_.size(); ++i) {
    const Progress& p = progress_[i];
    const TaskKey& t = open_->participants[i].task;
    if (aggregating ? p.finish.has_value() : p.report.has_value()) continue;
    std::string last = aggregating
                           ? absl::StrCat("reported after ", Seconds(p.reported_at - open_->begun),
                                          ", never finished aggregating")
                           : "sent no report";
    detail.push_back(absl::StrCat(t.ToString(), " (", last, "; ", describe(t), ")"));
  }
  Fail(absl::DeadlineExceededError(absl::StrCat(
           StepName(open_->step, open_->epoch),
           " failed: ", aggregating ? "aggregation" : "the barrier", " timed out after ",
           Seconds(elapsed), "; missing: ", absl::StrJoin(detail, ", "))),
       now);
}

const VariableBegin& StepBarrier::BeginOf(const StepVariable& v) const {
  return open_->begin[static_cast<size_t>(&v - open_->variables.view().data())];
}

const StepVariable* StepBarrier::FindVariable(uint64_t id) const {
  auto v = std::lower_bound(open_->variables.begin(), open_->variables.end(), id,
                            [](const StepVariable& a, uint64_t want) { return a.id < want; });
  return v != open_->variables.end() && v->id == id ? &*v : nullptr;
}

const StepPlan* StepBarrier::plan(uint64_t epoch) const {
  if (open_ && open_->epoch == epoch && open_state_ == StepState::kAggregating) return &*plan_;
  return nullptr;
}

std::shared_ptr<const StepResolution> StepBarrier::resolution(uint64_t epoch) const {
  for (const std::shared_ptr<const StepResolution>& r : recent_) {
    if (r->epoch == epoch) return r;
  }
  return nullptr;
}

std::shared_ptr<const StepInfo> StepBarrier::shared_info(uint64_t epoch) const {
  if (open_ && open_->epoch == epoch) return open_;
  for (const auto& i : recent_info_) {
    if (i->epoch == epoch) return i;
  }
  return nullptr;
}

std::optional<StepState> StepBarrier::state(uint64_t epoch) const {
  if (open_ && open_->epoch == epoch) return open_state_;
  if (std::shared_ptr<const StepResolution> r = resolution(epoch)) return r->state;
  return std::nullopt;
}

std::vector<ParticipantProgress> StepBarrier::progress(absl::Time now) const {
  std::vector<ParticipantProgress> out;
  if (!open_) return out;
  for (size_t i = 0; i < progress_.size(); ++i) {
    const Progress& p = progress_[i];
    ParticipantProgress pp;
    pp.task = open_->participants[i].task;
    pp.reported = p.report.has_value();
    pp.finished = p.finish.has_value();
    if (pp.reported) {
      pp.report_latency = p.reported_at - open_->begun;
      pp.last_activity = absl::StrCat("reported after ", Seconds(pp.report_latency));
    } else {
      pp.last_activity =
          absl::StrCat("no report yet (", Seconds(now - open_->begun), " since the step began)");
    }
    out.push_back(std::move(pp));
  }
  return out;
}

StepEvent StepBarrier::NewEvent(StepEvent::Kind kind, absl::Time now) const {
  StepEvent e;
  e.kind = kind;
  e.step = open_->step;
  e.epoch = open_->epoch;
  e.at = now;
  return e;
}

void StepBarrier::Emit(StepEvent e) {
  e.seq = next_seq_++;
  events_.push_back(std::move(e));
  if (events_.size() > kRecentEvents) events_.pop_front();
}

std::vector<StepEvent> StepBarrier::EventsAfter(int64_t seq) const {
  std::vector<StepEvent> out;
  for (const StepEvent& e : events_) {
    if (e.seq > seq) out.push_back(e);
  }
  return out;
}

}  // namespace repvar::server

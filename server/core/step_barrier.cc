// SPDX-License-Identifier: Apache-2.0
#include "server/core/step_barrier.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/metrics.h"
#include "common/base/seeded_bug.h"
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

StepBarrier::HeldIndex StepBarrier::IndexLayout(const StepInfo& info) {
  HeldIndex index;
  index.variables = info.variables;
  index.layout_id = info.layout_id;
  index.held.assign(info.participants.size(), IndexRanges());
  for (size_t p = 0; p < info.participants.size(); ++p) {
    index.participant_of.emplace(info.participants[p].task, p);
  }
  index.index_of.reserve(info.variables.size());
  for (uint32_t i = 0; i < info.variables.size(); ++i) {
    index.index_of.emplace(info.variables[i].id, i);
    const std::vector<int32_t>& participant = info.variables[i].replica_participant.view();
    for (size_t r = 0; r < participant.size(); ++r) {
      if (participant[r] < 0) {  // a replica on no participant
        index.sitting_out[i].push_back(static_cast<int32_t>(r));
        continue;
      }
      // Indices arrive in order: `i` is there when it was the last appended.
      IndexRanges& h = index.held[static_cast<size_t>(participant[r])];
      if (h.empty() || h.bounds().back() <= i) h.Append(i);
    }
  }
  return index;
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
  if (!held_.variables.SharesWith(open_->variables) || held_.layout_id != open_->layout_id) {
    held_ = IndexLayout(*open_);
  }
  detail_wanted_ = false;
  plan_.reset();
  changed_list_.clear();
  expected_.clear();
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
  if (auto at = held_.participant_of.find(task); at != held_.participant_of.end()) {
    const StepParticipant& p = open_->participants[at->second];
    if (p.incarnation != incarnation) {
      return absl::AbortedError(
          absl::StrCat(what, " from ", task.ToString(), " incarnation ", incarnation,
                       ": the step's participant is incarnation ", p.incarnation));
    }
    return at->second;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, " from ", task.ToString(), ": not a participant of ", StepName(step, epoch)));
}

absl::Status StepBarrier::CheckReport(const WorkerReport& r, size_t me) const {
  const std::string from = absl::StrCat("report from ", r.task.ToString());
  if (!r.changed.empty() && r.changed.bounds().back() > open_->variables.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " names variable index ", r.changed.bounds().back() - 1, "; ",
        StepName(open_->step, open_->epoch), " has ", open_->variables.size(), " variables"));
  }
  if (!r.changed.IsSubsetOf(held_.held[me])) {
    return absl::PermissionDeniedError(
        absl::StrCat(from, " names variables this worker holds no replica of in this step"));
  }
  for (size_t i = 0; i < r.replicas.size(); ++i) {
    const ReplicaReport& rr = r.replicas[i];
    if (i > 0 && rr.variable_id == r.replicas[i - 1].variable_id &&
        rr.replica == r.replicas[i - 1].replica) {
      return absl::InvalidArgumentError(absl::StrCat(from, " names variable ", rr.variable_id,
                                                     " replica ", rr.replica, " twice"));
    }
    const StepVariable* v = FindVariable(rr.variable_id);
    if (v == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(from, " names variable id ", rr.variable_id, ", which is not in ",
                       StepName(open_->step, open_->epoch),
                       " (variables created or initialized during a step join the next one)"));
    }
    if (rr.replica < 0 || static_cast<size_t>(rr.replica) >= v->replica_participant.size() ||
        v->replica_participant[rr.replica] != static_cast<int32_t>(me)) {
      return absl::PermissionDeniedError(
          absl::StrCat(from, " names ", v->name, "/", rr.replica,
                       ", a replica this worker does not hold in this step"));
    }
    if (!r.detailed && r.changed.Contains(IndexOf(v->id))) {
      return absl::InvalidArgumentError(absl::StrCat(from, " lists ", v->name, "/", rr.replica,
                                                     " one by one and in its changed ranges too"));
    }
  }
  for (size_t i = 0; i < r.shard.size(); ++i) {
    const VariableChecksum& c = r.shard[i];
    const StepVariable* v = FindVariable(c.variable_id);
    if (v == nullptr || (i > 0 && c.variable_id <= r.shard[i - 1].variable_id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          from, ": its reported checksums must name variables of the step, by id, once each"));
    }
    const uint32_t index = IndexOf(v->id);
    if (!r.changed.Contains(index) || ReporterOf(*v, index) != static_cast<int32_t>(me) ||
        v->aggregation == Aggregation::kSum || v->aggregation == Aggregation::kMean) {
      return absl::InvalidArgumentError(
          absl::StrCat(from, " reports the checksum of ", v->name,
                       ", which is not a NONE or ONLY_FIRST_REPLICA variable it changed and "
                       "reports for"));
    }
  }
  if (r.detailed) {
    // The detail must be the summary's: each NONE/ONLY_FIRST_REPLICA
    // variable of the ranges listed with one value, summing to the digest.
    uint64_t digest = 0;
    size_t at = 0;
    absl::Status bad;
    r.changed.ForEach([&](uint32_t index) {
      const StepVariable& v = open_->variables[index];
      if (!bad.ok() || v.aggregation == Aggregation::kSum || v.aggregation == Aggregation::kMean) {
        return;
      }
      while (at < r.replicas.size() && r.replicas[at].variable_id < v.id) ++at;
      if (at == r.replicas.size() || r.replicas[at].variable_id != v.id) {
        bad = absl::InvalidArgumentError(
            absl::StrCat(from, ": the detailed report does not list ", v.name));
        return;
      }
      digest += DigestTerm(v.id, r.replicas[at].checksum);
    });
    REPVAR_RETURN_IF_ERROR(bad);
    if (digest != r.digest) {
      return absl::InvalidArgumentError(
          absl::StrCat(from, ": the detailed report's values do not sum to its digest"));
    }
  }
  return absl::OkStatus();
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
  std::sort(r.shard.begin(), r.shard.end(),
            [](const auto& a, const auto& b) { return a.variable_id < b.variable_id; });
  REPVAR_RETURN_IF_ERROR(CheckReport(r, me));
  Progress& p = progress_[me];
  if (p.report) {
    const bool same_summary = p.report->changed == r.changed && p.report->digest == r.digest &&
                              p.report->shard == r.shard;
    if (same_summary && p.report->detailed == r.detailed && p.report->replicas == r.replicas) {
      return absl::OkStatus();  // a retry
    }
    if (!same_summary || p.report->detailed) {
      return absl::AlreadyExistsError(absl::StrCat(
          r.task.ToString(), " already reported for ", StepName(open_->step, open_->epoch),
          " with different contents; a worker sends one report per step"));
    }
    if (!r.detailed) {
      return absl::AlreadyExistsError(absl::StrCat(
          r.task.ToString(), " already reported for ", StepName(open_->step, open_->epoch),
          " with other exceptions; a worker sends one report per step"));
    }
    // The same report in detail: it takes the summary's place.
  }
  if (open_state_ != StepState::kOpen) {
    return absl::FailedPreconditionError("the step's barrier already resolved");
  }
  const bool first = !p.report;
  p.report = std::move(r);
  if (first) {
    p.reported_at = now;
    StepEvent e = NewEvent(StepEvent::Kind::kReported, now);
    e.task = report.task;
    Emit(std::move(e));
  }
  for (const Progress& q : progress_) {
    if (!q.report || (detail_wanted_ && !q.report->detailed)) return absl::OkStatus();
  }
  ResolveBarrier(now);
  return absl::OkStatus();
}

void StepBarrier::ResolveBarrier(absl::Time now) {
  absl::StatusOr<std::optional<std::vector<ChangedVariable>>> changed = MergeReports();
  if (!changed.ok()) {
    Fail(changed.status(), now);
    return;
  }
  if (!*changed) {
    // A digest did not hold (or a checksum had no reporter): every worker
    // sends its report again, in detail.
    spdlog::warn("{}: the workers' digests disagree; asking for detailed reports",
                 StepName(open_->step, open_->epoch));
    detail_wanted_ = true;
    detail_request_ = StepPlan{};
    detail_request_.step = open_->step;
    detail_request_.epoch = open_->epoch;
    detail_request_.send_detail = true;
    return;
  }
  StepDecision decision = PlanCollectives(**changed);
  ReportDivergences(decision.divergences);
  StepPlan plan;
  plan.step = open_->step;
  plan.epoch = open_->epoch;
  plan.changed = std::move(decision.changed);
  changed_list_.clear();
  changed_list_.reserve(decision.expected.size());
  plan.changed.ForEach([&](uint32_t i) { changed_list_.push_back(i); });
  changed_position_.resize(open_->variables.size());
  for (size_t k = 0; k < changed_list_.size(); ++k) {
    changed_position_[changed_list_[k]] = static_cast<uint32_t>(k);
  }
  expected_ = std::move(decision.expected);
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

namespace {

bool Reduced(const StepVariable& v) {
  return v.aggregation == Aggregation::kSum || v.aggregation == Aggregation::kMean;
}

}  // namespace

// What the reports say together: what changed anywhere, each reporter's
// checksums, the replicas listed one by one (by variable index).
struct StepBarrier::Gathered {
  struct Entry {
    size_t participant;
    const ReplicaReport* report;
  };
  IndexRanges changed;
  std::vector<uint64_t> reported;
  std::vector<uint8_t> has_reported;
  std::map<uint32_t, std::vector<Entry>> entries;
};

absl::StatusOr<StepBarrier::Gathered> StepBarrier::GatherReports() const {
  const SharedVector<StepVariable>& vars = open_->variables;
  Gathered g;
  g.reported.assign(vars.size(), 0);
  g.has_reported.assign(vars.size(), 0);
  for (size_t w = 0; w < progress_.size(); ++w) {
    const WorkerReport& r = *progress_[w].report;
    g.changed = g.changed.Union(r.changed);
    for (const VariableChecksum& c : r.shard) {
      const uint32_t i = IndexOf(c.variable_id);
      g.reported[i] = c.checksum;
      g.has_reported[i] = 1;
    }
    for (const ReplicaReport& rr : r.replicas) {
      const uint32_t i = IndexOf(rr.variable_id);
      const StepVariable& v = vars[i];
      if (rr.first_nonfinite >= 0 && !v.allow_nonfinite && !Reduced(v)) {
        const TaskKey& t = open_->participants[w].task;
        return absl::InvalidArgumentError(
            absl::StrCat(StepName(open_->step, open_->epoch), " failed: ", v.name, "/", rr.replica,
                         " on ", t.ToString(), " has a non-finite value at element ",
                         rr.first_nonfinite, " (allow_nonfinite is off); nothing changed"));
      }
      g.entries[i].push_back(Gathered::Entry{w, &rr});
    }
  }
  IndexRanges listed;
  for (const auto& [i, e] : g.entries) listed.Append(i);
  g.changed = g.changed.Union(listed);
  return g;
}

bool StepBarrier::DigestsHold(const Gathered& g) const {
  // Each summary's digest against the reporters' checksums: computed once
  // per distinct set of changed variables.
  const SharedVector<StepVariable>& vars = open_->variables;
  std::map<std::vector<uint32_t>, std::optional<uint64_t>> expected;
  for (const Progress& p : progress_) {
    const WorkerReport& r = *p.report;
    if (r.detailed) continue;
    auto found = expected.find(r.changed.bounds());
    if (found == expected.end()) {
      uint64_t sum = 0;
      bool known = true;
      r.changed.ForEach([&](uint32_t i) {
        if (Reduced(vars[i])) return;
        known = known && g.has_reported[i] != 0;
        sum += DigestTerm(vars[i].id, g.reported[i]);
      });
      found = expected.emplace(r.changed.bounds(), known ? std::optional(sum) : std::nullopt).first;
    }
    const bool holds = found->second && *found->second == r.digest;
    if (!holds && !BugSeeded(SeededBug::kDigestsUnchecked)) return false;
  }
  return true;
}

std::vector<uint8_t> StepBarrier::Exceptional(const Gathered& g) const {
  // The NONE/ONLY_FIRST_REPLICA variables to merge replica by replica:
  // those listed, and those a holder changed while another did not.
  std::vector<uint8_t> exceptional(open_->variables.size(), 0);
  for (const auto& [i, e] : g.entries) exceptional[i] = 1;
  for (size_t w = 0; w < progress_.size(); ++w) {
    const WorkerReport& r = *progress_[w].report;
    if (r.changed == g.changed) continue;
    g.changed.Minus(r.changed).Intersect(held_.held[w]).ForEach([&](uint32_t i) {
      exceptional[i] = 1;
    });
  }
  return exceptional;
}

absl::StatusOr<std::optional<std::vector<ChangedVariable>>> StepBarrier::MergeReports() const {
  // The work follows what changed and how many workers there are, not the
  // number of variables times replicas: per-replica merging is left to the
  // variables some report names one replica at a time (docs/architecture.md).
  REPVAR_ASSIGN_OR_RETURN(const Gathered g, GatherReports());
  if (!DigestsHold(g)) return std::nullopt;
  const std::vector<uint8_t> exceptional = Exceptional(g);
  std::vector<ChangedVariable> out;
  g.changed.ForEach([&](uint32_t i) {
    const StepVariable& v = open_->variables[i];
    ChangedVariable c{&v, i, std::nullopt, {}};
    if (!Reduced(v) && !exceptional[i])
      c.agreed = g.reported[i];  // every holder's digest covers it
    if (Reduced(v) || !exceptional[i]) {
      out.push_back(std::move(c));
      return;
    }
    const uint64_t begin_checksum = BeginOf(v).checksum;
    c.checksums.assign(v.replica_participant.size(), begin_checksum);
    for (size_t k = 0; k < v.replica_participant.size(); ++k) {
      const int32_t p = v.replica_participant[k];
      if (p < 0) continue;
      const WorkerReport& r = *progress_[static_cast<size_t>(p)].report;
      if (!r.detailed && r.changed.Contains(i)) c.checksums[k] = g.reported[i];
    }
    if (auto e = g.entries.find(i); e != g.entries.end()) {
      for (const Gathered::Entry& x : e->second) {
        c.checksums[static_cast<size_t>(x.report->replica)] = x.report->checksum;
      }
    }
    const bool differs = std::any_of(c.checksums.begin(), c.checksums.end(),
                                     [&](uint64_t x) { return x != begin_checksum; });
    if (differs) out.push_back(std::move(c));
  });
  return out;
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
  if (!finish.error.empty()) {
    p.finish = finish;
    Fail(absl::UnavailableError(absl::StrCat(StepName(open_->step, open_->epoch),
                                             " failed: ", finish.task.ToString(),
                                             " could not aggregate: ", finish.error)),
         now);
    return absl::OkStatus();
  }
  const std::string from = absl::StrCat("finish from ", finish.task.ToString());
  if (finish.held != plan_->changed.Intersect(held_.held[*who])) {
    return absl::InvalidArgumentError(
        absl::StrCat(from, ": its ranges are not the plan's changed variables this worker holds"));
  }
  WorkerFinish f = finish;
  std::sort(f.shard.begin(), f.shard.end(),
            [](const auto& a, const auto& b) { return a.variable_id < b.variable_id; });
  for (size_t i = 0; i < f.shard.size(); ++i) {
    const StepVariable* v = FindVariable(f.shard[i].variable_id);
    const bool ordered = i == 0 || f.shard[i].variable_id > f.shard[i - 1].variable_id;
    if (v == nullptr || !ordered || !f.held.Contains(IndexOf(v->id)) ||
        ReporterOf(*v, IndexOf(v->id)) != static_cast<int32_t>(*who)) {
      return absl::InvalidArgumentError(absl::StrCat(
          from, ": a reported checksum of a variable it does not report for, or twice"));
    }
  }
  for (const PreparedVariable& pv : f.nonfinite) {
    const StepVariable* v = FindVariable(pv.variable_id);
    if (v == nullptr || !f.held.Contains(IndexOf(v->id))) {
      return absl::InvalidArgumentError(
          absl::StrCat(from, ": a non-finite value of a variable it does not hold changed"));
    }
  }
  p.finish = std::move(f);
  for (const Progress& q : progress_) {
    if (!q.finish) return absl::OkStatus();
  }
  ResolveFinish(now);
  return absl::OkStatus();
}

size_t StepBarrier::ChangedPosition(uint32_t index) const { return changed_position_[index]; }

bool StepBarrier::ResultsFinite(absl::Time now) {
  // In variable order: name the replica whose own value was non-finite when
  // a worker found one; else the sum itself overflowed.
  const std::string step = StepName(open_->step, open_->epoch);
  std::map<size_t, std::vector<std::pair<size_t, const PreparedVariable*>>> nonfinite;
  for (size_t w = 0; w < progress_.size(); ++w) {
    for (const PreparedVariable& pv : progress_[w].finish->nonfinite) {
      if (!FindVariable(pv.variable_id)->allow_nonfinite) {
        nonfinite[ChangedPosition(IndexOf(pv.variable_id))].emplace_back(w, &pv);
      }
    }
  }
  if (nonfinite.empty()) return true;
  const auto& found = nonfinite.begin()->second;
  const StepVariable& v = *FindVariable(found.front().second->variable_id);
  for (const auto& [w, pv] : found) {
    if (pv->nonfinite_replica < 0) continue;
    Fail(absl::InvalidArgumentError(absl::StrCat(
             step, " failed: ", v.name, "/", pv->nonfinite_replica, " on ",
             open_->participants[w].task.ToString(), " has a non-finite value at element ",
             pv->first_nonfinite, " (allow_nonfinite is off); nothing changed")),
         now);
    return false;
  }
  Fail(absl::InvalidArgumentError(
           absl::StrCat(step, " failed: the aggregated value of ", v.name,
                        " is non-finite at element ", found.front().second->first_nonfinite,
                        " (on ", open_->participants[found.front().first].task.ToString(),
                        "; every replica's own value was finite, so the sum overflowed)")),
       now);
  return false;
}

std::optional<std::vector<uint64_t>> StepBarrier::FinalChecksums(absl::Time now) {
  // The value each changed variable ends with: the plan's where it named
  // one, else its reporter's.
  const std::string step = StepName(open_->step, open_->epoch);
  std::vector<uint64_t> final_checksums = expected_;
  std::vector<uint8_t> known(expected_.size(), 0);
  for (size_t k = 0; k < expected_.size(); ++k) known[k] = expected_[k] != 0 ? 1 : 0;
  for (size_t w = 0; w < progress_.size(); ++w) {
    for (const VariableChecksum& c : progress_[w].finish->shard) {
      const size_t k = ChangedPosition(IndexOf(c.variable_id));
      if (known[k] != 0 && final_checksums[k] != c.checksum) {
        const StepVariable& v = *FindVariable(c.variable_id);
        Fail(absl::DataLossError(absl::StrCat(
                 step, " failed: ", open_->participants[w].task.ToString(),
                 " ended with a different value of ", v.name, " (checksum ", absl::Hex(c.checksum),
                 ", expected ", absl::Hex(final_checksums[k]), ")")),
             now);
        return std::nullopt;
      }
      final_checksums[k] = c.checksum;
      known[k] = 1;
    }
  }
  for (size_t k = 0; k < known.size(); ++k) {
    if (known[k] != 0) continue;
    const StepVariable& v = open_->variables[changed_list_[k]];
    const int32_t reporter = ReporterOf(v, changed_list_[k]);
    Fail(absl::InternalError(absl::StrCat(
             step, " failed: ",
             reporter >= 0 ? open_->participants[static_cast<size_t>(reporter)].task.ToString()
                           : std::string("nobody"),
             " did not report its value of ", v.name)),
         now);
    return std::nullopt;
  }
  return final_checksums;
}

bool StepBarrier::FinishDigestsHold(const std::vector<uint64_t>& final_checksums, absl::Time now) {
  // Every worker's digest over the values it holds: computed once per
  // distinct set of held variables. A worker whose digest differs ended
  // with other values than the reporters': name those outside the
  // majority of their set (the reporters, when theirs were the odd ones).
  std::map<std::vector<uint32_t>, uint64_t> expected;
  std::map<std::vector<uint32_t>, std::map<uint64_t, std::vector<size_t>>> by_digest;
  bool mismatch = false;
  for (size_t w = 0; w < progress_.size(); ++w) {
    const WorkerFinish& f = *progress_[w].finish;
    auto found = expected.find(f.held.bounds());
    if (found == expected.end()) {
      uint64_t sum = 0;
      f.held.ForEach([&](uint32_t i) {
        sum += DigestTerm(open_->variables[i].id, final_checksums[ChangedPosition(i)]);
      });
      found = expected.emplace(f.held.bounds(), sum).first;
    }
    mismatch = mismatch || found->second != f.digest;
    by_digest[f.held.bounds()][f.digest].push_back(w);
  }
  if (!mismatch) return true;
  std::vector<std::string> odd;
  for (const auto& [held, digests] : by_digest) {
    size_t majority = 0;
    for (const auto& [d, workers] : digests) majority = std::max(majority, workers.size());
    bool skipped = false;  // the first set of the majority's size
    for (const auto& [d, workers] : digests) {
      if (workers.size() == majority && !skipped) {
        skipped = true;
        continue;
      }
      for (size_t w : workers) odd.push_back(open_->participants[w].task.ToString());
    }
  }
  Fail(absl::DataLossError(absl::StrCat(
           StepName(open_->step, open_->epoch),
           " failed: ", odd.empty() ? std::string("the reporters") : absl::StrJoin(odd, ", "),
           " ended with values that differ from the other replicas' (the digests over the "
           "variables they hold do not match)")),
       now);
  return false;
}

void StepBarrier::ResolveFinish(absl::Time now) {
  if (!ResultsFinite(now)) return;
  std::optional<std::vector<uint64_t>> final_checksums = FinalChecksums(now);
  if (!final_checksums || !FinishDigestsHold(*final_checksums, now)) return;
  expected_ = *std::move(final_checksums);
  Commit(std::move(divergences_), now);
}

void StepBarrier::Commit(std::vector<Divergence> divergences, absl::Time now) {
  StepRecord record{open_->step, open_->epoch, open_, {}};
  StepResolution res;
  res.step = open_->step;
  res.epoch = open_->epoch;
  res.state = StepState::kCommitted;
  res.layout_id = open_->layout_id;
  for (size_t c = 0; c < changed_list_.size(); ++c) {
    const uint32_t index = changed_list_[c];
    const StepVariable& v = open_->variables[index];
    const uint64_t id = v.id;
    StepRecord::Variable rv;
    rv.id = id;
    rv.checksum = expected_[c];
    const VariableBegin& begin = BeginOf(v);
    rv.changed = rv.checksum != begin.checksum;
    rv.version = begin.version + (rv.changed ? 1 : 0);
    if (rv.changed) {
      res.changed_ranges.Append(index);
      res.changed_digest += DigestTerm(id, rv.checksum);
    }
    rv.index = index;
    if (auto out = held_.sitting_out.find(index); out != held_.sitting_out.end()) {
      rv.sitting_out = out->second;
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
  auto shared = std::make_shared<const StepResolution>(std::move(res));
  StepEvent e = NewEvent(StepEvent::Kind::kResolved, now);
  e.resolution = shared;
  Emit(std::move(e));
  recent_.push_back(std::move(shared));
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
  auto at = held_.index_of.find(id);
  return at == held_.index_of.end() ? nullptr : &open_->variables[at->second];
}

const StepPlan* StepBarrier::plan(uint64_t epoch, bool detailed) const {
  if (!open_ || open_->epoch != epoch) return nullptr;
  if (open_state_ == StepState::kAggregating) return &*plan_;
  if (open_state_ == StepState::kOpen && detail_wanted_ && !detailed) return &detail_request_;
  return nullptr;
}

uint32_t StepBarrier::IndexOf(uint64_t id) const { return held_.index_of.at(id); }

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

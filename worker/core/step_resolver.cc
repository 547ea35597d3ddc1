// SPDX-License-Identifier: Apache-2.0
#include "worker/core/step_resolver.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"
#include "common/tensor/element_math.h"
#include "spdlog/spdlog.h"

namespace repvar::worker {
namespace {

// Calls to the coordinator wait out the barrier or the aggregation, then this.
constexpr absl::Duration kLinkSlack = absl::Minutes(1);

int64_t NonFinite(const Tensor& t) { return FirstNonFinite(t); }

bool Reduced(const StepVariable& var) {
  return var.aggregation == Aggregation::kSum || var.aggregation == Aggregation::kMean;
}

}  // namespace

WorkerReport StepResolver::BuildReport(const LocalStep& s, bool detailed) const {
  std::vector<ReplicaReport> changed;
  for (const auto& [key, value] : s.written) {
    const StepVariable& var = *s.layout->Find(key.first);
    auto stored = store_->Get(key.first, key.second);
    if (stored.ok() && value->checksum == stored->checksum) continue;  // unchanged
    // SUM/MEAN values are scanned once reduced (a non-finite local value
    // makes the result non-finite), in the pass that applies the reduction.
    changed.push_back(ReplicaReport{key.first, key.second, value->checksum,
                                    Reduced(var) ? -1 : NonFinite(*value)});
  }
  WorkerReport report =
      SummarizeReport(s.layout->info.variables, s.layout->me, std::move(changed), detailed);
  report.step = s.header.step;
  report.epoch = s.header.epoch;
  report.task = TaskKey{me_.job, me_.task};
  report.incarnation = me_.incarnation;
  return report;
}

WorkerFinish StepResolver::BuildFinish(const LocalStep& s, const StepPlan& plan,
                                       PlanOutput& prepared) const {
  std::vector<PreparedVariable> values;
  absl::Status failed;
  plan.changed.ForEach([&](uint32_t index) {
    if (!failed.ok()) return;
    if (index >= s.layout->info.variables.size()) {
      failed = absl::InvalidArgumentError("plan names a variable past the layout");
      return;
    }
    const StepVariable& var = s.layout->info.variables[index];
    if (s.layout->LocalReplicas(var).empty()) return;
    auto value = FinalValue(s, var, prepared);
    if (!value.ok()) {
      failed = value.status();
      return;
    }
    prepared.values[var.id] = *value;
    PreparedVariable pv{var.id, (*value)->checksum, -1, -1};
    if (!var.allow_nonfinite) {
      auto scanned = prepared.reduced_nonfinite.find(var.id);
      pv.first_nonfinite =
          scanned != prepared.reduced_nonfinite.end() ? scanned->second : NonFinite(**value);
      if (pv.first_nonfinite >= 0 && scanned != prepared.reduced_nonfinite.end()) {
        // Which local replica brought it in, if one did.
        for (int32_t r : s.layout->LocalReplicas(var)) {
          auto w = s.written.find({var.id, r});
          if (w == s.written.end()) continue;
          if (int64_t bad = NonFinite(*w->second); bad >= 0) {
            pv.nonfinite_replica = r;
            pv.first_nonfinite = bad;
            break;
          }
        }
      }
    }
    values.push_back(pv);
  });
  WorkerFinish finish;
  if (failed.ok()) finish = SummarizeFinish(s.layout->info.variables, s.layout->me, values);
  finish.step = s.header.step;
  finish.epoch = s.header.epoch;
  finish.task = TaskKey{me_.job, me_.task};
  finish.incarnation = me_.incarnation;
  if (!failed.ok()) finish.error = failed.ToString();
  return finish;
}

StepResolution StepResolver::Ask(const LocalStep& s, const absl::Status& why, const StepPlan& plan,
                                 const PlanOutput& prepared) {
  // After a refusal or a lost call (the link waits for a coordinator that
  // is restarting). Only the coordinator decides: a step it says committed
  // is installed with what this worker has of it, as if the answer had not
  // been lost (two-phase commit); its committed value may live nowhere else.
  auto r = link_->WaitStep(s.header.epoch, s.header.barrier_timeout + kLinkSlack,
                           /*whole=*/s.layout->me < 0);
  if (!r.ok()) return LocalFailure(s.header, why);
  if (r->state == StepState::kCommitted) Install(s, plan, *r, prepared);
  return *std::move(r);
}

StepResolver::Done StepResolver::SuspendLocalReads(const LocalStep& s, Done done) {
  if (local_reads_ == nullptr || s.begin_versions.empty()) return done;
  if (!BugSeeded(SeededBug::kStepsNotSuspended)) local_reads_->Suspend();
  // `s` outlives the step's resolution (Resolve, ResolveAsync).
  return [local_reads = local_reads_, &s, done = std::move(done)](StepResolution r) mutable {
    local_reads->EndStep([&s] {
      std::vector<uint64_t> held;
      held.reserve(s.begin_versions.size());
      for (const auto& [id, version] : s.begin_versions) held.push_back(id);
      return held;
    });
    std::move(done)(std::move(r));
  };
}

void StepResolver::ResumeLocalReads(const LocalStep& s, const StepPlan& plan,
                                    const Targets& committed) const {
  if (local_reads_ == nullptr) return;
  std::vector<LocalReads::Committed> changed;
  changed.reserve(committed.size());
  for (const auto& [id, vc] : committed) {
    if (s.begin_versions.contains(id)) changed.push_back({id, vc.first, vc.second});
  }
  // Repaired here, to the value already committed: asked about.
  std::vector<uint64_t> repaired;
  plan.changed.ForEach([&](uint32_t index) {
    if (index >= s.layout->info.variables.size()) return;
    const uint64_t id = s.layout->info.variables[index].id;
    if (!committed.contains(id) && s.begin_versions.contains(id)) repaired.push_back(id);
  });
  local_reads_->Resume(changed, repaired);
}

StepResolution StepResolver::Resolve(const LocalStep& s) {
  StepResolution out;
  SuspendLocalReads(s, [&out](StepResolution r) { out = std::move(r); })(ResolveSuspended(s));
  return out;
}

StepResolution StepResolver::ResolveSuspended(const LocalStep& s) {
  if (s.layout->me < 0) {
    // No replica of this host takes part: nothing to report.
    return Ask(s, absl::UnavailableError("the coordinator did not say how the step ended"),
               StepPlan{}, PlanOutput{});
  }
  return AfterReport(s, link_->ReportStep(BuildReport(s, /*detailed=*/false),
                                          s.header.barrier_timeout + kLinkSlack));
}

void StepResolver::ResolveAsync(const LocalStep& s, Done done) {
  done = SuspendLocalReads(s, std::move(done));
  if (s.layout->me < 0) {
    blocking_.Schedule(
        [this, &s, done = std::move(done)]() mutable { std::move(done)(ResolveSuspended(s)); });
    return;
  }
  link_->ReportStepAsync(BuildReport(s, /*detailed=*/false), s.header.barrier_timeout + kLinkSlack,
                         [this, &s, done = std::move(done)](StepLink::ReportAnswer answer) mutable {
                           if (answer.ok() && std::holds_alternative<StepResolution>(*answer)) {
                             // Nothing to run: installed here, without waiting on anything.
                             std::move(done)(AfterReport(s, std::move(answer)));
                             return;
                           }
                           blocking_.Schedule([this, &s, answer = std::move(answer),
                                               done = std::move(done)]() mutable {
                             std::move(done)(AfterReport(s, std::move(answer)));
                           });
                         });
}

StepResolution StepResolver::AfterReport(const LocalStep& s, StepLink::ReportAnswer answer,
                                         bool detailed) {
  if (!answer.ok()) {
    spdlog::warn("{}: report refused: {}", StepName(s.header), answer.status().ToString());
    return Ask(s, answer.status(), StepPlan{}, PlanOutput{});
  }
  if (auto* res = std::get_if<StepResolution>(&*answer)) {
    if (res->state == StepState::kCommitted) Install(s, StepPlan{}, *res, PlanOutput{});
    return std::move(*res);
  }
  if (std::get<StepPlan>(*answer).send_detail) {
    // A digest did not hold at the barrier: the same report, in detail.
    if (detailed) {
      return Ask(s, absl::InternalError("the coordinator asked twice for a detailed report"),
                 StepPlan{}, PlanOutput{});
    }
    return AfterReport(
        s,
        link_->ReportStep(BuildReport(s, /*detailed=*/true), s.header.barrier_timeout + kLinkSlack),
        /*detailed=*/true);
  }
  const StepPlan& plan = std::get<StepPlan>(*answer);
  PlanOutput prepared;
  WorkerFinish finish;
  auto ran = runner_.Run(s, plan);
  if (ran.ok()) {
    prepared = *std::move(ran);
    finish = BuildFinish(s, plan, prepared);
  } else {
    finish.step = s.header.step;
    finish.epoch = s.header.epoch;
    finish.task = TaskKey{me_.job, me_.task};
    finish.incarnation = me_.incarnation;
    finish.error = ran.status().ToString();
  }
  auto res = link_->FinishStep(finish, plan.timeout + kLinkSlack);
  if (!res.ok()) return Ask(s, res.status(), plan, prepared);
  if (res->state == StepState::kCommitted) Install(s, plan, *res, prepared);
  return *std::move(res);
}

absl::StatusOr<std::shared_ptr<const Tensor>> StepResolver::FinalValue(
    const LocalStep& s, const StepVariable& var, const PlanOutput& prepared) const {
  if (auto p = prepared.values.find(var.id); p != prepared.values.end()) return p->second;
  std::vector<int32_t> local = s.layout->LocalReplicas(var);
  if (local.empty()) return absl::InternalError("no local replica");
  auto w = s.written.find({var.id, local.front()});
  if (w != s.written.end()) return w->second;
  REPVAR_ASSIGN_OR_RETURN(StoredReplica r, store_->Get(var.id, local.front()));
  return r.value;
}

bool StepResolver::ShortFormTargets(const LocalStep& s, const StepResolution& res,
                                    const PlanOutput& prepared, Targets& target,
                                    std::vector<CommittedVariable>& changed_here,
                                    bool& holds_all) const {
  // Each changed variable moved to version + 1 from where the step began,
  // and this worker's values are the ones every replica agreed on.
  if (res.layout_id != s.layout->info.layout_id ||
      res.changed_ranges.bounds().back() > s.layout->info.variables.size()) {
    spdlog::error("{}: the resolution names another layout; nothing installed", StepName(s.header));
    return false;
  }
  uint64_t digest = 0;
  holds_all = true;
  absl::Status missing;
  res.changed_ranges.ForEach([&](uint32_t index) {
    const StepVariable& var = s.layout->info.variables[index];
    auto begin = s.begin_versions.find(var.id);
    if (begin == s.begin_versions.end()) {
      holds_all = false;
      return;
    }
    auto value = FinalValue(s, var, prepared);
    if (!value.ok()) {
      missing = value.status();
      return;
    }
    int64_t version = begin->second + 1;
    if (BugSeeded(SeededBug::kInstallOverMovedReplicas)) {
      auto now = store_->Get(var.id, s.layout->LocalReplicas(var).front());
      if (now.ok()) version = now->version + 1;
    }
    target[var.id] = {version, (*value)->checksum};
    changed_here.push_back(CommittedVariable{var.id, var.name, version, (*value)->checksum});
    digest += DigestTerm(var.id, (*value)->checksum);
  });
  if (missing.ok() && (!holds_all || digest == res.changed_digest)) return true;
  // Cannot happen unless memory is corrupted: the coordinator checked every
  // worker's digest. Leave the replicas alone, loudly.
  spdlog::error("{}: the local values do not match the committed digest{}; not installed",
                StepName(s.header),
                missing.ok() ? "" : absl::StrCat(" (", missing.ToString(), ")"));
  return false;
}

void StepResolver::Install(const LocalStep& s, const StepPlan& plan, StepResolution& res,
                           const PlanOutput& prepared) const {
  Targets target;
  plan.changed.ForEach([&](uint32_t index) {
    // Repaired but unchanged: the replicas keep their version and value.
    if (index >= s.layout->info.variables.size()) return;
    const StepVariable& var = s.layout->info.variables[index];
    std::vector<int32_t> local = s.layout->LocalReplicas(var);
    if (local.empty()) return;
    auto stored = store_->Get(var.id, local.front());
    if (stored.ok()) target[var.id] = {stored->version, stored->checksum};
  });
  const Targets repaired = target;  // their versions and values stay
  std::vector<CommittedVariable> changed_here;
  bool holds_all = true;
  if (!res.changed.empty()) {
    // By id, with versions: an earlier run's step, answered from its record.
    for (const CommittedVariable& c : res.changed) {
      target[c.variable_id] = {c.version, c.checksum};
    }
  } else if (!res.changed_ranges.empty() &&
             !ShortFormTargets(s, res, prepared, target, changed_here, holds_all)) {
    return;
  }
  std::vector<ReplicaWrite> items;
  for (const auto& [id, vc] : target) {
    const StepVariable* var = s.layout->Find(id);
    if (var == nullptr) continue;
    std::vector<int32_t> local = s.layout->LocalReplicas(*var);
    if (local.empty()) continue;
    // Replicas that moved on since the step left OPEN (a resync after the
    // commit, a newer write) already hold the commit or what followed it.
    auto stored = store_->Get(id, local.front());
    auto begin = s.begin_versions.find(id);
    if (stored.ok() && !BugSeeded(SeededBug::kInstallOverMovedReplicas) &&
        (stored->version > vc.first ||
         (begin != s.begin_versions.end() && stored->version != begin->second))) {
      continue;
    }
    auto value = FinalValue(s, *var, prepared);
    if (!value.ok() || (*value)->checksum != vc.second) {
      // Cannot happen unless memory is corrupted: the coordinator checked
      // every worker's value. Leave the replicas alone, loudly.
      spdlog::error("{}: local value of {} does not match the committed checksum; not installed",
                    StepName(s.header), var->name);
      continue;
    }
    items.push_back(ReplicaWrite{id, var->name, vc.first, std::move(local), *value,
                                 /*fence=*/0, std::nullopt});
  }
  // Unfenced: installing a step's result cannot be refused.
  (void)store_->Apply(std::move(items));
  Targets committed;
  for (const auto& [id, vc] : target) {
    auto r = repaired.find(id);
    if (r == repaired.end() || r->second != vc) committed.emplace(id, vc);
  }
  ResumeLocalReads(s, plan, committed);
  // The trainers of this host get what it holds of the step, variable by
  // variable.
  if (!res.short_form) return;
  res.changed = std::move(changed_here);
  if (holds_all) return;
  // This host holds only some of what changed: its trainers get the whole
  // list, as every trainer of the step does (one call, only here).
  auto whole = link_->WaitStep(s.header.epoch, absl::Seconds(30), /*whole=*/true);
  if (whole.ok() && whole->state == StepState::kCommitted) res.changed = std::move(whole->changed);
}

}  // namespace repvar::worker

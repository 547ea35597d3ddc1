// SPDX-License-Identifier: Apache-2.0
#include "worker/local_steps.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_util.h"
#include "common/rpc/convert.h"
#include "common/tensor/element_math.h"
#include "common/tensor/step_math.h"
#include "spdlog/spdlog.h"

namespace repvar::worker {
namespace {

constexpr size_t kKeepDoneSteps = 4;
constexpr absl::Duration kLinkSlack = absl::Minutes(1);

std::string StepName(const v1::StepInfo& info) {
  return absl::StrCat("step ", info.step(), " (epoch ", info.epoch(), ")");
}

// "TPU:0" from "TPU:0" or "/job:j/replica:0/task:1/device:TPU:0".
std::string ShortDevice(const std::string& d) {
  auto pos = d.rfind("device:");
  return pos == std::string::npos ? d : d.substr(pos + 7);
}

int64_t NonFinite(const Tensor& t) { return IsFloating(t.spec.dtype) ? FirstNonFinite(t) : -1; }

}  // namespace

absl::StatusOr<std::shared_ptr<LocalSteps::Step>> LocalSteps::Find(int64_t step, uint64_t epoch) {
  if (epoch == 0) return absl::InvalidArgumentError("a step call needs the step's epoch");
  {
    absl::MutexLock lock(&mu_);
    auto it = steps_.find(epoch);
    if (it != steps_.end()) {
      if (it->second->info.step() != step) {
        return absl::InvalidArgumentError(absl::StrCat("epoch ", epoch, " belongs to step ",
                                                       it->second->info.step(), ", not ", step));
      }
      return it->second;
    }
  }
  std::shared_ptr<const Layout> known;
  {
    absl::MutexLock lock(&mu_);
    known = layout_;
  }
  REPVAR_ASSIGN_OR_RETURN(v1::StepInfo info,
                          link_->GetStep(epoch, known ? known->info.layout_id() : 0));
  if (info.layout_omitted() && (known == nullptr || known->info.layout_id() != info.layout_id())) {
    REPVAR_ASSIGN_OR_RETURN(info, link_->GetStep(epoch, 0));  // raced with another layout
  }
  if (info.step() != step) {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch ", epoch, " belongs to step ", info.step(), ", not ", step));
  }
  auto s = std::make_shared<Step>();
  if (info.layout_omitted()) {
    s->layout = known;
  } else {
    REPVAR_ASSIGN_OR_RETURN(s->layout, ParseLayout(info));
  }
  if (info.state() == v1::STEP_STATE_COMMITTED || info.state() == v1::STEP_STATE_FAILED) {
    s->phase = Phase::kDone;  // a late trainer: it gets the resolution
  }
  s->info = std::move(info);

  absl::MutexLock lock(&mu_);
  return AddLocked(epoch, std::move(s));
}

std::shared_ptr<LocalSteps::Step> LocalSteps::AddLocked(uint64_t epoch, std::shared_ptr<Step> s) {
  auto [it, fresh] = steps_.emplace(epoch, s);
  if (!fresh) return it->second;  // another trainer got there first
  layout_ = s->layout;
  // One step is open at a time: an older open one was aborted or failed.
  for (auto& [e, other] : steps_) {
    if (e < epoch && other->phase == Phase::kOpen) {
      DropLeasesLocked(e);
      other->written.clear();
      other->phase = Phase::kDone;
      other->resolution =
          LocalFailure(*other, absl::AbortedError(absl::StrCat("superseded by epoch ", epoch)));
    }
  }
  while (steps_.size() > kKeepDoneSteps && steps_.begin()->second->phase == Phase::kDone) {
    steps_.erase(steps_.begin());
  }
  cv_.SignalAll();
  return s;
}

void LocalSteps::Hint(int64_t step, uint64_t epoch, uint64_t layout_id,
                      absl::Duration barrier_timeout) {
  if (epoch == 0 || layout_id == 0) return;
  absl::MutexLock lock(&mu_);
  if (steps_.contains(epoch) || layout_ == nullptr || layout_->info.layout_id() != layout_id) {
    return;
  }
  if (!steps_.empty() && steps_.rbegin()->first > epoch) return;  // an old step: ask
  auto s = std::make_shared<Step>();
  s->info.set_step(step);
  s->info.set_epoch(epoch);
  s->info.set_state(v1::STEP_STATE_OPEN);
  s->info.set_barrier_timeout_ms(absl::ToInt64Milliseconds(barrier_timeout));
  s->info.set_layout_id(layout_id);
  s->layout = layout_;
  AddLocked(epoch, std::move(s));
}

absl::StatusOr<std::shared_ptr<const LocalSteps::Layout>> LocalSteps::ParseLayout(
    v1::StepInfo& info) const {
  auto layout = std::make_shared<Layout>();
  layout->info.set_layout_id(info.layout_id());
  layout->info.mutable_participants()->Swap(info.mutable_participants());
  layout->info.mutable_variables()->Swap(info.mutable_variables());
  const v1::StepInfo& l = layout->info;
  for (int i = 0; i < l.participants_size(); ++i) {
    const v1::StepParticipant& p = l.participants(i);
    if (p.job() == me_.job && p.task() == me_.task) {
      if (p.incarnation() != me_.incarnation) {
        return absl::AbortedError(absl::StrCat(StepName(info), " counts incarnation ",
                                               p.incarnation(), " of this worker, not ",
                                               me_.incarnation));
      }
      layout->me = i;
    }
  }
  for (int i = 0; i < l.variables_size(); ++i) {
    layout->vars[l.variables(i).id()] = i;
    REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(l.variables(i).spec()));
    layout->specs.push_back(std::move(spec));
  }
  return std::shared_ptr<const Layout>(std::move(layout));
}

std::vector<int32_t> LocalSteps::LocalReplicas(const Step& s, const v1::StepVariable& var) const {
  std::vector<int32_t> out;
  if (s.layout->me < 0) return out;
  for (int i = 0; i < var.replica_participant_size(); ++i) {
    if (var.replica_participant(i) == s.layout->me) out.push_back(i);
  }
  return out;
}

absl::Status LocalSteps::Write(int64_t step, uint64_t epoch, uint64_t variable_id, int32_t replica,
                               std::shared_ptr<const Tensor> value) {
  return WriteMany(step, epoch, {WriteItem{variable_id, replica, std::move(value)}});
}

absl::Status LocalSteps::CheckWrite(const Step& s, const WriteItem& item) const {
  auto v = s.layout->vars.find(item.variable_id);
  if (v == s.layout->vars.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("variable id ", item.variable_id, " is not in ", StepName(s.info),
                     " (variables created or initialized during a step join the next one)"));
  }
  const v1::StepVariable& var = s.layout->info.variables(v->second);
  if (item.replica < 0 || item.replica >= var.replica_participant_size()) {
    return absl::NotFoundError(absl::StrCat(var.name(), " has no replica ", item.replica));
  }
  if (var.replica_participant(item.replica) != s.layout->me || s.layout->me < 0) {
    if (store_->Get(item.variable_id, item.replica).ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(var.name(), "/", item.replica, " sits ", StepName(s.info),
                       " out (it was not up to date when the step began)"));
    }
    return absl::NotFoundError(
        absl::StrCat(var.name(), "/", item.replica, " is not held by this worker"));
  }
  const TensorSpec& spec = s.layout->specs[v->second];
  if (item.value == nullptr || !(item.value->spec == spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(var.name(), " is ", spec.ToString(), "; the value is ",
                     item.value == nullptr ? std::string("missing") : item.value->spec.ToString()));
  }
  return absl::OkStatus();
}

absl::Status LocalSteps::WriteMany(int64_t step, uint64_t epoch, std::vector<WriteItem> items) {
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<Step> s, Find(step, epoch));
  absl::MutexLock lock(&mu_);
  if (s->phase != Phase::kOpen) {
    return absl::FailedPreconditionError(absl::StrCat(
        StepName(s->info), " is no longer open on this worker (committed or aborted)"));
  }
  for (const WriteItem& item : items) REPVAR_RETURN_IF_ERROR(CheckWrite(*s, item));
  for (WriteItem& item : items) {
    s->written[{item.variable_id, item.replica}] = std::move(item.value);
  }
  return absl::OkStatus();
}

absl::StatusOr<LocalSteps::Lease> LocalSteps::Map(int64_t step, uint64_t epoch,
                                                  uint64_t variable_id, int32_t replica, bool write,
                                                  bool initialize) {
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<Step> s, Find(step, epoch));
  auto it = s->layout->vars.find(variable_id);
  if (it == s->layout->vars.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("variable id ", variable_id, " is not in ", StepName(s->info),
                     " (variables created or initialized during a step join the next one)"));
  }
  Lent lent{step, epoch, variable_id, replica, write, nullptr, nullptr};
  int64_t version = 0;
  if (!write) {
    REPVAR_ASSIGN_OR_RETURN(StoredReplica view, Read(epoch, variable_id, replica));
    version = view.version;
    if (view.value->bytes.shared_fd() >= 0) {
      lent.value = std::move(view.value);  // already shared: lent as it is, no copy
    } else {
      REPVAR_ASSIGN_OR_RETURN(Buffer buf, Buffer::AllocateShared(view.value->bytes.size()));
      auto copy = std::make_shared<Tensor>();
      copy->spec = view.value->spec;
      copy->bytes = std::move(buf);
      std::memcpy(copy->bytes.data(), view.value->bytes.data(), copy->bytes.size());
      copy->checksum = view.checksum;
      lent.value = std::move(copy);
    }
  } else {
    const TensorSpec& spec = s->layout->specs[it->second];
    REPVAR_ASSIGN_OR_RETURN(int64_t bytes, spec.ByteSize());
    REPVAR_ASSIGN_OR_RETURN(Buffer buf, Buffer::AllocateShared(static_cast<size_t>(bytes)));
    lent.writable = std::make_shared<Tensor>();
    lent.writable->spec = spec;
    lent.writable->bytes = std::move(buf);
    {
      // A write lease must name a replica this trainer may write in this step.
      absl::MutexLock lock(&mu_);
      if (s->phase != Phase::kOpen) {
        return absl::FailedPreconditionError(absl::StrCat(
            StepName(s->info), " is no longer open on this worker (committed or aborted)"));
      }
      REPVAR_RETURN_IF_ERROR(CheckWrite(*s, WriteItem{variable_id, replica, lent.writable}));
    }
    if (initialize) {
      REPVAR_ASSIGN_OR_RETURN(StoredReplica view, Read(epoch, variable_id, replica));
      std::memcpy(lent.writable->bytes.data(), view.value->bytes.data(),
                  lent.writable->bytes.size());
      lent.writable->checksum = view.checksum;
      version = view.version;
    }
  }
  const Tensor& t = write ? *lent.writable : *lent.value;
  absl::MutexLock lock(&mu_);
  Lease lease{next_lease_++, t.bytes.shared_fd(), t.bytes.size(), t.checksum, version};
  leases_[lease.id] = std::move(lent);
  return lease;
}

void LocalSteps::DropLeasesLocked(uint64_t epoch) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    it = it->second.epoch == epoch ? leases_.erase(it) : std::next(it);
  }
}

absl::StatusOr<uint64_t> LocalSteps::Unmap(uint64_t lease, bool publish,
                                           std::optional<uint64_t> checksum) {
  Lent lent;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(lease);
    if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("no lease ", lease));
    lent = std::move(it->second);
    leases_.erase(it);
  }
  if (!publish) return lent.write ? lent.writable->checksum : lent.value->checksum;
  if (!lent.write) return absl::InvalidArgumentError("only a write lease can be published");
  if (checksum) {
    lent.writable->checksum = *checksum;  // hashed by the trainer as it wrote
  } else {
    lent.writable->UpdateChecksum();  // the trainer wrote the bytes in place
  }
  const uint64_t sum = lent.writable->checksum;
  REPVAR_RETURN_IF_ERROR(
      Write(lent.step, lent.epoch, lent.variable_id, lent.replica, std::move(lent.writable)));
  return sum;
}

absl::StatusOr<StoredReplica> LocalSteps::Read(uint64_t epoch, uint64_t variable_id,
                                               int32_t replica) {
  REPVAR_ASSIGN_OR_RETURN(StoredReplica r, store_->Get(variable_id, replica));
  if (epoch == 0) return r;
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(epoch);
  if (it == steps_.end()) return r;  // nothing written in that step here
  const Step& s = *it->second;
  if (s.phase == Phase::kOpen) {
    auto w = s.written.find({variable_id, replica});
    if (w != s.written.end()) {
      r.value = w->second;
      r.checksum = w->second->checksum;
    }
  }
  return r;
}

absl::StatusOr<v1::StepResolution> LocalSteps::Commit(int64_t step, uint64_t epoch,
                                                      const std::vector<std::string>& devices,
                                                      absl::Duration timeout) {
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<Step> s, Find(step, epoch));
  std::vector<std::string> mine;
  for (const std::string& d : devices) {
    std::string shortname = ShortDevice(d);
    if (std::find(me_.accelerators.begin(), me_.accelerators.end(), shortname) ==
        me_.accelerators.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d, " is not an accelerator of ", me_.job, ":", me_.task));
    }
    mine.push_back(shortname);
  }
  if (devices.empty()) mine = me_.accelerators;
  bool run = false;
  {
    absl::MutexLock lock(&mu_);
    if (s->phase == Phase::kOpen) {
      s->committed.insert(mine.begin(), mine.end());
      if (s->committed.size() >= me_.accelerators.size()) {
        s->phase = Phase::kResolving;
        run = true;
      }
    }
  }
  if (run) {
    v1::StepResolution res = Resolve(*s);
    absl::MutexLock lock(&mu_);
    DropLeasesLocked(epoch);
    s->written.clear();
    s->resolution = std::move(res);
    s->phase = Phase::kDone;
    cv_.SignalAll();
    return *s->resolution;
  }
  {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + timeout;
    while (s->phase != Phase::kDone) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) {
        std::vector<std::string> waiting;
        for (const std::string& a : me_.accelerators) {
          if (!s->committed.contains(a)) waiting.push_back(a);
        }
        return absl::DeadlineExceededError(
            absl::StrCat(StepName(s->info), ": no resolution after ", absl::FormatDuration(timeout),
                         waiting.empty() ? "" : "; devices of this host not committed yet: ",
                         absl::StrJoin(waiting, ", ")));
      }
    }
    if (s->resolution) return *s->resolution;
  }
  // The step was already over when this worker first heard of it (a late
  // trainer): the coordinator has its resolution.
  auto r = link_->WaitStep(epoch, absl::Seconds(5));
  if (r.ok()) return *std::move(r);
  return LocalFailure(*s, absl::AbortedError("the step was discarded on this worker"));
}

void LocalSteps::Discard(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(epoch);
  if (it == steps_.end() || it->second->phase != Phase::kOpen) return;
  Step& s = *it->second;
  DropLeasesLocked(epoch);
  s.written.clear();
  s.phase = Phase::kDone;
  s.resolution = LocalFailure(s, absl::AbortedError("a trainer aborted the step"));
  cv_.SignalAll();
}

v1::StepResolution LocalSteps::LocalFailure(const Step& s, const absl::Status& status) const {
  v1::StepResolution r;
  r.set_step(s.info.step());
  r.set_epoch(s.info.epoch());
  r.set_state(v1::STEP_STATE_FAILED);
  r.set_code(static_cast<int32_t>(status.code()));
  r.set_message(std::string(status.message()));
  return r;
}

v1::StepResolution LocalSteps::Resolve(Step& s) {
  const absl::Duration barrier = absl::Milliseconds(s.info.barrier_timeout_ms());
  // Ask the coordinator for the resolution (after a refusal or a lost call).
  auto ask = [&](const absl::Status& why) -> v1::StepResolution {
    auto r = link_->WaitStep(s.info.epoch(), barrier + kLinkSlack);
    if (r.ok()) return *r;
    return LocalFailure(s, why);
  };
  if (s.layout->me < 0) {
    // No replica of this host takes part: nothing to report.
    return ask(absl::UnavailableError("the coordinator did not say how the step ended"));
  }
  v1::ReportStepRequest report;
  report.set_step(s.info.step());
  report.set_epoch(s.info.epoch());
  report.set_job(me_.job);
  report.set_task(me_.task);
  report.set_incarnation(me_.incarnation);
  for (const auto& [key, value] : s.written) {
    const v1::StepVariable& var = s.layout->info.variables(s.layout->vars.at(key.first));
    auto stored = store_->Get(key.first, key.second);
    if (stored.ok() && value->checksum == stored->checksum) continue;  // unchanged
    v1::ReplicaReport* rr = report.add_replicas();
    rr->set_variable_id(key.first);
    rr->set_replica(key.second);
    rr->set_checksum(value->checksum);
    const bool reduced =
        var.aggregation() == v1::AGGREGATION_SUM || var.aggregation() == v1::AGGREGATION_MEAN;
    // SUM/MEAN values are scanned once reduced (a non-finite local value
    // makes the result non-finite), in the pass that applies the reduction.
    rr->set_first_nonfinite(reduced ? -1 : NonFinite(*value));
  }
  auto plan = link_->ReportStep(report, barrier + kLinkSlack);
  if (!plan.ok()) {
    spdlog::warn("{}: report refused: {}", StepName(s.info), plan.status().ToString());
    return ask(plan.status());
  }
  std::map<uint64_t, std::shared_ptr<const Tensor>> prepared;
  v1::StepResolution res;
  if (plan->has_resolution()) {
    res = plan->resolution();
  } else {
    v1::FinishStepRequest finish;
    finish.set_step(s.info.step());
    finish.set_epoch(s.info.epoch());
    finish.set_job(me_.job);
    finish.set_task(me_.task);
    finish.set_incarnation(me_.incarnation);
    auto got = RunPlan(s, *plan);
    if (got.ok()) {
      prepared = *std::move(got);
      for (uint64_t id : plan->changed_ids()) {
        const v1::StepVariable& var = s.layout->info.variables(s.layout->vars.at(id));
        if (LocalReplicas(s, var).empty()) continue;
        auto value = FinalValue(s, var, prepared);
        if (!value.ok()) {
          finish.set_error(value.status().ToString());
          break;
        }
        prepared[id] = *value;
        v1::PreparedVariable* pv = finish.add_variables();
        pv->set_variable_id(id);
        pv->set_checksum((*value)->checksum);
        auto scanned = s.reduced_nonfinite.find(id);
        pv->set_first_nonfinite(scanned != s.reduced_nonfinite.end() ? scanned->second
                                                                     : NonFinite(**value));
        if (pv->first_nonfinite() >= 0 && scanned != s.reduced_nonfinite.end()) {
          // Which local replica brought it in, if one did.
          for (int32_t r : LocalReplicas(s, var)) {
            auto w = s.written.find({id, r});
            if (w == s.written.end()) continue;
            if (int64_t bad = NonFinite(*w->second); bad >= 0) {
              pv->set_nonfinite_replica(r);
              pv->set_first_nonfinite(bad);
              break;
            }
          }
        }
      }
    } else {
      finish.set_error(got.status().ToString());
    }
    if (!finish.error().empty()) finish.clear_variables();
    auto r = link_->FinishStep(finish, absl::Milliseconds(plan->timeout_ms()) + kLinkSlack);
    if (!r.ok()) return ask(r.status());
    res = *std::move(r);
  }
  if (res.state() == v1::STEP_STATE_COMMITTED) Install(s, *plan, res, prepared);
  return res;
}

absl::StatusOr<std::shared_ptr<const Tensor>> LocalSteps::FinalValue(
    Step& s, const v1::StepVariable& var,
    const std::map<uint64_t, std::shared_ptr<const Tensor>>& prepared) {
  if (auto p = prepared.find(var.id()); p != prepared.end()) return p->second;
  std::vector<int32_t> local = LocalReplicas(s, var);
  if (local.empty()) return absl::InternalError("no local replica");
  auto w = s.written.find({var.id(), local.front()});
  if (w != s.written.end()) return w->second;
  REPVAR_ASSIGN_OR_RETURN(StoredReplica r, store_->Get(var.id(), local.front()));
  return r.value;
}

absl::StatusOr<std::map<uint64_t, std::shared_ptr<const Tensor>>> LocalSteps::RunPlan(
    Step& s, const v1::StepPlan& plan) {
  std::map<uint64_t, std::shared_ptr<const Tensor>> prepared;
  // The step's begin value of a participating replica is its committed
  // value here (the coordinator lets only up-to-date replicas take part).
  auto begin_value = [&](const v1::StepVariable& var,
                         int32_t replica) -> absl::StatusOr<std::shared_ptr<const Tensor>> {
    REPVAR_ASSIGN_OR_RETURN(StoredReplica r, store_->Get(var.id(), replica));
    return r.value;
  };
  for (const v1::StepCollective& c : plan.collectives()) {
    CollectiveSpec spec{plan.group(), plan.rank(), plan.size(),
                        c.root(),     c.tag(),     absl::Milliseconds(plan.timeout_ms())};
    if (c.variable_ids().empty())
      return absl::InvalidArgumentError("a collective without variables");
    if (c.kind() == v1::StepCollective::ALLREDUCE) {
      // One fused buffer for all the collective's variables, in order.
      std::vector<const v1::StepVariable*> vars;
      std::vector<size_t> offsets;
      size_t total = 0;
      AccumType type = AccumType::kFloat32;
      for (uint64_t id : c.variable_ids()) {
        auto it = s.layout->vars.find(id);
        if (it == s.layout->vars.end())
          return absl::InvalidArgumentError("plan names an unknown variable");
        const v1::StepVariable* var = &s.layout->info.variables(it->second);
        const TensorSpec& ts = s.layout->specs[it->second];
        REPVAR_ASSIGN_OR_RETURN(int64_t n, ts.NumElements());
        type = AccumTypeFor(ts.dtype);
        vars.push_back(var);
        offsets.push_back(total);
        total += static_cast<size_t>(n) * AccumSize(type);
      }
      REPVAR_ASSIGN_OR_RETURN(Buffer acc, Buffer::Allocate(total));
      std::vector<std::shared_ptr<const Tensor>> begins(vars.size());
      for (size_t i = 0; i < vars.size(); ++i) {
        std::vector<int32_t> local = LocalReplicas(s, *vars[i]);
        size_t len = (i + 1 < vars.size() ? offsets[i + 1] : total) - offsets[i];
        std::span<std::byte> region = acc.span().subspan(offsets[i], len);
        bool filled = false;       // the first delta overwrites: no clearing pass
        for (int32_t r : local) {  // replica order
          REPVAR_ASSIGN_OR_RETURN(auto b, begin_value(*vars[i], r));
          begins[i] = b;
          auto w = s.written.find({vars[i]->id(), r});
          if (w == s.written.end()) continue;  // untouched: contributes zero
          REPVAR_RETURN_IF_ERROR(AddDelta(*b, *w->second, region, /*overwrite=*/!filled));
          filled = true;
        }
        if (!filled) std::memset(region.data(), 0, region.size());
      }
      REPVAR_RETURN_IF_ERROR(collectives_->Allreduce(spec, type, acc.span()));
      for (size_t i = 0; i < vars.size(); ++i) {
        if (begins[i] == nullptr) continue;  // no local replica
        size_t len = (i + 1 < vars.size() ? offsets[i + 1] : total) - offsets[i];
        int64_t divisor = vars[i]->aggregation() == v1::AGGREGATION_MEAN
                              ? vars[i]->replica_participant_size()
                              : 1;
        auto out = ApplyReduced(*begins[i], acc.span().subspan(offsets[i], len), divisor);
        if (!out.ok()) {
          return absl::Status(out.status().code(),
                              absl::StrCat(vars[i]->name(), ": ", out.status().message()));
        }
        s.reduced_nonfinite[vars[i]->id()] = out->first_nonfinite;
        prepared[vars[i]->id()] = std::make_shared<const Tensor>(std::move(out->value));
      }
    } else {
      auto it = s.layout->vars.find(c.variable_ids(0));
      if (it == s.layout->vars.end())
        return absl::InvalidArgumentError("plan names an unknown variable");
      const v1::StepVariable& var = s.layout->info.variables(it->second);
      const TensorSpec& ts = s.layout->specs[it->second];
      Tensor t;
      if (plan.rank() == c.root()) {
        std::shared_ptr<const Tensor> src;
        auto w = s.written.find({var.id(), c.source_replica()});
        if (w != s.written.end()) {
          src = w->second;
        } else {
          REPVAR_ASSIGN_OR_RETURN(src, begin_value(var, c.source_replica()));
        }
        REPVAR_ASSIGN_OR_RETURN(t, Tensor::FromBytes(src->spec, src->bytes.span()));
      } else {
        REPVAR_ASSIGN_OR_RETURN(t, Tensor::ForOverwrite(ts));  // the broadcast fills it
      }
      REPVAR_RETURN_IF_ERROR(collectives_->Broadcast(spec, t.bytes.span()));
      t.UpdateChecksum();
      if (t.checksum != c.checksum()) {
        return absl::DataLossError(
            absl::StrCat("the repair value of ", var.name(), " arrived with a bad checksum"));
      }
      if (!LocalReplicas(s, var).empty()) {
        prepared[var.id()] = std::make_shared<const Tensor>(std::move(t));
      }
    }
  }
  return prepared;
}

void LocalSteps::Install(Step& s, const v1::StepPlan& plan, const v1::StepResolution& res,
                         const std::map<uint64_t, std::shared_ptr<const Tensor>>& prepared) {
  std::map<uint64_t, std::pair<int64_t, uint64_t>> target;  // id -> (version, checksum)
  for (int i = 0; i < plan.changed_ids_size(); ++i) {
    // Repaired but unchanged: the replicas keep their version and value.
    const v1::StepVariable& var = s.layout->info.variables(s.layout->vars.at(plan.changed_ids(i)));
    std::vector<int32_t> local = LocalReplicas(s, var);
    if (local.empty()) continue;
    auto stored = store_->Get(var.id(), local.front());
    if (stored.ok()) target[var.id()] = {stored->version, stored->checksum};
  }
  for (const v1::CommittedVariable& c : res.changed()) {
    target[c.variable_id()] = {c.version(), c.checksum()};
  }
  std::vector<ReplicaWrite> items;
  for (const auto& [id, vc] : target) {
    auto it = s.layout->vars.find(id);
    if (it == s.layout->vars.end()) continue;
    const v1::StepVariable& var = s.layout->info.variables(it->second);
    std::vector<int32_t> local = LocalReplicas(s, var);
    if (local.empty()) continue;
    auto value = FinalValue(s, var, prepared);
    if (!value.ok() || (*value)->checksum != vc.second) {
      // Cannot happen unless memory is corrupted: the coordinator checked
      // every worker's value. Leave the replicas alone, loudly.
      spdlog::error("{}: local value of {} does not match the committed checksum; not installed",
                    StepName(s.info), var.name());
      continue;
    }
    items.push_back(ReplicaWrite{id, var.name(), vc.first, std::move(local), *value});
  }
  store_->Apply(std::move(items));
}

}  // namespace repvar::worker

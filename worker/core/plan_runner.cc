// SPDX-License-Identifier: Apache-2.0
#include "worker/core/plan_runner.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/tensor/step_math.h"

namespace repvar::worker {
namespace {

// One variable's reduction from this worker's replicas (begin: the
// committed value; written: the replicas' step-local values, in replica
// order).
class VariableReduction final : public FoldedReduction {
 public:
  VariableReduction(std::shared_ptr<const Tensor> begin,
                    std::vector<std::shared_ptr<const Tensor>> written, int64_t divisor,
                    Tensor result)
      : begin_(std::move(begin)),
        written_(std::move(written)),
        divisor_(divisor),
        result_(std::move(result)) {}

  AccumType type() const override { return AccumTypeFor(begin_->spec.dtype); }
  size_t elements() const override { return begin_->bytes.size() / item_size(); }
  size_t item_size() const override { return ItemSize(begin_->spec.dtype); }
  void Contribute(size_t lo, size_t hi, std::span<std::byte> acc) override {
    if (written_.empty()) {  // untouched here: contributes zero
      std::memset(acc.data(), 0, acc.size());
      return;
    }
    for (size_t k = 0; k < written_.size(); ++k) {  // the first overwrites: no clearing pass
      AddDeltaRange(begin_->spec.dtype, begin_->bytes.data(), written_[k]->bytes.data(),
                    static_cast<int64_t>(lo), static_cast<int64_t>(hi), acc.data(), k == 0);
    }
  }
  absl::Status Apply(size_t lo, size_t hi, std::span<const std::byte> sum) override {
    return ApplyRange(begin_->spec.dtype, begin_->bytes.data(), sum.data(), divisor_,
                      static_cast<int64_t>(lo), static_cast<int64_t>(hi), result_.bytes.data());
  }
  std::span<std::byte> result() override { return result_.bytes.span(); }
  Tensor TakeResult() { return std::move(result_); }

 private:
  const std::shared_ptr<const Tensor> begin_;
  const std::vector<std::shared_ptr<const Tensor>> written_;
  const int64_t divisor_;
  Tensor result_;
};

// S4: MEAN divides by the replicas taking part (an untouched one counts,
// contributing zero); a replica on a worker that sat the step out does not.
// Every participant computes the same divisor from the layout.
int64_t Divisor(const StepVariable& var) {
  if (var.aggregation != Aggregation::kMean) return 1;
  return std::count_if(var.replica_participant.begin(), var.replica_participant.end(),
                       [](int32_t p) { return p >= 0; });
}

// Whether every one of `participants` holds a replica of `var` (each can
// then apply the sums of its share of the elements).
bool EveryParticipantHolds(const StepVariable& var, size_t participants) {
  std::vector<bool> holds(participants, false);
  for (int32_t p : var.replica_participant) {
    if (p >= 0 && static_cast<size_t>(p) < participants) holds[static_cast<size_t>(p)] = true;
  }
  return std::all_of(holds.begin(), holds.end(), [](bool h) { return h; });
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Tensor>> PlanRunner::BeginValue(uint64_t id,
                                                                     int32_t replica) const {
  REPVAR_ASSIGN_OR_RETURN(StoredReplica r, store_->Get(id, replica));
  return r.value;
}

absl::StatusOr<PlanOutput> PlanRunner::Run(const LocalStep& s, const StepPlan& plan) const {
  PlanOutput out;
  const int32_t size = static_cast<int32_t>(s.layout->info.participants.size());
  for (const StepCollective& c : plan.collectives) {
    CollectiveSpec spec{plan.group, s.layout->me, size, c.root, c.tag, plan.timeout};
    if (c.variable_ids.empty()) return absl::InvalidArgumentError("a collective without variables");
    if (c.kind == StepCollective::Kind::kAllreduce) {
      REPVAR_RETURN_IF_ERROR(RunAllreduce(s, spec, c, out));
    } else {
      REPVAR_RETURN_IF_ERROR(RunBroadcast(s, spec, c, out));
    }
  }
  return out;
}

absl::Status PlanRunner::RunFolded(const LocalStep& s, const CollectiveSpec& spec,
                                   const StepVariable& var, PlanOutput& out) const {
  std::shared_ptr<const Tensor> begin;
  std::vector<std::shared_ptr<const Tensor>> written;
  for (int32_t r : s.layout->LocalReplicas(var)) {  // replica order
    REPVAR_ASSIGN_OR_RETURN(begin, BeginValue(var.id, r));
    auto w = s.written.find({var.id, r});
    if (w == s.written.end()) continue;
    if (!(w->second->spec == begin->spec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(var.name, ": local value is ", w->second->spec.ToString(),
                       "; the variable is ", begin->spec.ToString()));
    }
    written.push_back(w->second);
  }
  if (begin == nullptr) return absl::InvalidArgumentError("plan folds a variable not held here");
  REPVAR_ASSIGN_OR_RETURN(Tensor result, Tensor::ForOverwrite(begin->spec, Shared(begin->spec)));
  VariableReduction reduction(begin, std::move(written), Divisor(var), std::move(result));
  if (absl::Status done = collectives_->ReduceApply(spec, reduction); !done.ok()) {
    return absl::Status(done.code(), absl::StrCat(var.name, ": ", done.message()));
  }
  Reduced reduced = Sealed(reduction.TakeResult());
  out.reduced_nonfinite[var.id] = reduced.first_nonfinite;
  out.values[var.id] = std::make_shared<const Tensor>(std::move(reduced.value));
  return absl::OkStatus();
}

absl::Status PlanRunner::RunAllreduce(const LocalStep& s, const CollectiveSpec& spec,
                                      const StepCollective& c, PlanOutput& out) const {
  if (c.variable_ids.size() == 1) {
    const StepVariable* var = s.layout->Find(c.variable_ids.front());
    if (var == nullptr) return absl::InvalidArgumentError("plan names an unknown variable");
    if (EveryParticipantHolds(*var, s.layout->info.participants.size())) {
      return RunFolded(s, spec, *var, out);
    }
  }
  // One fused buffer for all the collective's variables, in order.
  std::vector<const StepVariable*> vars;
  std::vector<size_t> offsets;
  size_t total = 0;
  AccumType type = AccumType::kFloat32;
  for (uint64_t id : c.variable_ids) {
    const StepVariable* var = s.layout->Find(id);
    if (var == nullptr) return absl::InvalidArgumentError("plan names an unknown variable");
    REPVAR_ASSIGN_OR_RETURN(int64_t n, var->spec.NumElements());
    type = AccumTypeFor(var->spec.dtype);
    vars.push_back(var);
    offsets.push_back(total);
    total += static_cast<size_t>(n) * AccumSize(type);
  }
  auto region_of = [&](size_t i) {
    size_t len = (i + 1 < vars.size() ? offsets[i + 1] : total) - offsets[i];
    return std::pair<size_t, size_t>{offsets[i], len};
  };
  REPVAR_ASSIGN_OR_RETURN(Buffer acc, Buffer::Allocate(total));
  std::vector<std::shared_ptr<const Tensor>> begins(vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    auto [off, len] = region_of(i);
    std::span<std::byte> region = acc.span().subspan(off, len);
    bool filled = false;  // the first delta overwrites: no clearing pass
    for (int32_t r : s.layout->LocalReplicas(*vars[i])) {  // replica order
      REPVAR_ASSIGN_OR_RETURN(auto b, BeginValue(vars[i]->id, r));
      begins[i] = b;
      auto w = s.written.find({vars[i]->id, r});
      if (w == s.written.end()) continue;  // untouched: contributes zero
      REPVAR_RETURN_IF_ERROR(AddDelta(*b, *w->second, region, /*overwrite=*/!filled));
      filled = true;
    }
    if (!filled) std::memset(region.data(), 0, region.size());
  }
  REPVAR_RETURN_IF_ERROR(collectives_->Allreduce(spec, type, acc.span()));
  for (size_t i = 0; i < vars.size(); ++i) {
    if (begins[i] == nullptr) continue;  // no local replica
    auto [off, len] = region_of(i);
    auto reduced = ApplyReduced(*begins[i], acc.span().subspan(off, len), Divisor(*vars[i]),
                                Shared(begins[i]->spec));
    if (!reduced.ok()) {
      return absl::Status(reduced.status().code(),
                          absl::StrCat(vars[i]->name, ": ", reduced.status().message()));
    }
    out.reduced_nonfinite[vars[i]->id] = reduced->first_nonfinite;
    out.values[vars[i]->id] = std::make_shared<const Tensor>(std::move(reduced->value));
  }
  return absl::OkStatus();
}

absl::Status PlanRunner::RunBroadcast(const LocalStep& s, const CollectiveSpec& spec,
                                      const StepCollective& c, PlanOutput& out) const {
  const StepVariable* var = s.layout->Find(c.variable_ids.front());
  if (var == nullptr) return absl::InvalidArgumentError("plan names an unknown variable");
  std::shared_ptr<const Tensor> value;
  uint64_t checksum = 0;  // of the bytes this member holds, summed here
  if (spec.rank == c.root) {
    // The winning value is sent as it is and becomes this worker's value:
    // no copy. The root only reads its bytes (the span is mutable because
    // receivers write theirs).
    auto w = s.written.find({var->id, c.source_replica});
    if (w != s.written.end()) {
      value = w->second;
    } else {
      REPVAR_ASSIGN_OR_RETURN(value, BeginValue(var->id, c.source_replica));
    }
    checksum = Checksum(value->bytes.span());
    std::span<std::byte> bytes(const_cast<std::byte*>(value->bytes.data()), value->bytes.size());
    REPVAR_RETURN_IF_ERROR(collectives_->Broadcast(spec, bytes, nullptr, nullptr));
  } else {
    // The broadcast fills it.
    REPVAR_ASSIGN_OR_RETURN(Tensor t, Tensor::ForOverwrite(var->spec, Shared(var->spec)));
    ChecksumStream received;
    REPVAR_RETURN_IF_ERROR(collectives_->Broadcast(spec, t.bytes.span(), &received, nullptr));
    t.checksum = checksum = received.Digest();
    value = std::make_shared<const Tensor>(std::move(t));
  }
  if (checksum != c.checksum) {
    return absl::DataLossError(
        absl::StrCat("the repair value of ", var->name, " arrived with a bad checksum"));
  }
  if (!s.layout->LocalReplicas(*var).empty()) out.values[var->id] = std::move(value);
  return absl::OkStatus();
}

}  // namespace repvar::worker

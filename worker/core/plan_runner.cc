// SPDX-License-Identifier: Apache-2.0
#include "worker/core/plan_runner.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/tensor/step_math.h"

namespace repvar::worker {
namespace {

// The reduction of a collective's variables, of one dtype, from this
// worker's replicas: their elements one after the other, as the fused
// accumulator buffer lays them out.
class FusedReduction final : public FoldedReduction {
 public:
  struct Part {
    std::shared_ptr<const Tensor> begin;  // the committed value
    // The replicas' step-local values, in replica order (none: contributes zero).
    std::vector<std::shared_ptr<const Tensor>> written;
    int64_t divisor = 1;
    std::string name;   // the variable's, for errors
    size_t offset = 0;  // first element
    size_t elements = 0;
  };
  // `result`: room for every part's elements, one after the other.
  FusedReduction(DType dtype, std::vector<Part> parts, std::span<std::byte> result)
      : dtype_(dtype), parts_(std::move(parts)), result_(result) {}

  AccumType type() const override { return AccumTypeFor(dtype_); }
  size_t elements() const override {
    return parts_.empty() ? 0 : parts_.back().offset + parts_.back().elements;
  }
  size_t item_size() const override { return ItemSize(dtype_); }
  void Contribute(size_t lo, size_t hi, std::span<std::byte> acc) override {
    const size_t acc_item = AccumSize(type());
    Each(lo, hi, [&](const Part& p, size_t from, size_t to) {
      std::byte* dst = acc.data() + (p.offset + from - lo) * acc_item;
      if (p.written.empty()) {  // untouched here: contributes zero
        std::memset(dst, 0, (to - from) * acc_item);
        return absl::OkStatus();
      }
      for (size_t k = 0; k < p.written.size(); ++k) {  // the first overwrites
        AddDeltaRange(dtype_, p.begin->bytes.data(), p.written[k]->bytes.data(),
                      static_cast<int64_t>(from), static_cast<int64_t>(to), dst, k == 0);
      }
      return absl::OkStatus();
    }).IgnoreError();
  }
  absl::Status Apply(size_t lo, size_t hi, std::span<const std::byte> sum) override {
    const size_t acc_item = AccumSize(type());
    return Each(lo, hi, [&](const Part& p, size_t from, size_t to) -> absl::Status {
      absl::Status s =
          ApplyRange(dtype_, p.begin->bytes.data(), sum.data() + (p.offset + from - lo) * acc_item,
                     p.divisor, static_cast<int64_t>(from), static_cast<int64_t>(to),
                     result_.data() + p.offset * item_size());
      if (s.ok()) return s;
      return absl::Status(s.code(), absl::StrCat(p.name, ": ", s.message()));
    });
  }
  std::span<std::byte> result() override { return result_; }

 private:
  // Calls fn(part, from, to) for the elements [from, to) of each part
  // (counted from the part's start) inside [lo, hi); stops at an error.
  template <typename F>
  absl::Status Each(size_t lo, size_t hi, F fn) const {
    auto p = std::upper_bound(parts_.begin(), parts_.end(), lo,
                              [](size_t at, const Part& x) { return at < x.offset; });
    if (p != parts_.begin()) --p;
    for (; p != parts_.end() && p->offset < hi; ++p) {
      const size_t from = std::max(lo, p->offset), to = std::min(hi, p->offset + p->elements);
      if (from >= to) continue;
      REPVAR_RETURN_IF_ERROR(fn(*p, from - p->offset, to - p->offset));
    }
    return absl::OkStatus();
  }

  const DType dtype_;
  const std::vector<Part> parts_;
  const std::span<std::byte> result_;
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
    if (c.variables.empty()) return absl::InvalidArgumentError("a collective without variables");
    if (c.variables.bounds().back() > s.layout->info.variables.size()) {
      return absl::InvalidArgumentError("plan names a variable index past the layout");
    }
    if (c.kind == StepCollective::Kind::kAllreduce) {
      REPVAR_RETURN_IF_ERROR(RunAllreduce(s, spec, c, out));
    } else {
      REPVAR_RETURN_IF_ERROR(RunBroadcast(s, spec, c, out));
    }
  }
  return out;
}

absl::StatusOr<PlanRunner::LocalValues> PlanRunner::LocalValuesOf(const LocalStep& s,
                                                                  const StepVariable& var) const {
  LocalValues v;
  for (int32_t r : s.layout->LocalReplicas(var)) {  // replica order
    REPVAR_ASSIGN_OR_RETURN(v.begin, BeginValue(var.id, r));
    auto w = s.written.find({var.id, r});
    if (w == s.written.end()) continue;  // untouched: contributes zero
    if (!(w->second->spec == v.begin->spec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(var.name, ": local value is ", w->second->spec.ToString(),
                       "; the variable is ", v.begin->spec.ToString()));
    }
    v.written.push_back(w->second);
  }
  return v;
}

absl::Status PlanRunner::RunFolded(const LocalStep& s, const CollectiveSpec& spec,
                                   const std::vector<const StepVariable*>& vars,
                                   PlanOutput& out) const {
  std::vector<FusedReduction::Part> parts;
  size_t total = 0;
  for (const StepVariable* var : vars) {
    REPVAR_ASSIGN_OR_RETURN(LocalValues local, LocalValuesOf(s, *var));
    if (local.begin == nullptr) {
      return absl::InvalidArgumentError("plan folds a variable not held here");
    }
    // The parts are laid out by the layout's dtype: a held value of another
    // spec would be read past its end.
    if (!(local.begin->spec == var->spec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(var->name, ": the value held here is ", local.begin->spec.ToString(),
                       "; the step's layout says ", var->spec.ToString()));
    }
    FusedReduction::Part p;
    p.begin = std::move(local.begin);
    p.written = std::move(local.written);
    p.divisor = Divisor(*var);
    p.name = var->name;
    p.offset = total;
    p.elements = p.begin->bytes.size() / ItemSize(p.begin->spec.dtype);
    total += p.elements;
    parts.push_back(std::move(p));
  }
  const DType dtype = parts.front().begin->spec.dtype;
  // One variable's result is its value; several share a buffer, copied out
  // into each value after.
  std::optional<Tensor> single;
  Buffer shared;
  std::span<std::byte> result;
  if (parts.size() == 1) {
    REPVAR_ASSIGN_OR_RETURN(
        single, Tensor::ForOverwrite(parts[0].begin->spec, Shared(parts[0].begin->spec)));
    result = single->bytes.span();
  } else {
    REPVAR_ASSIGN_OR_RETURN(shared, Buffer::Allocate(total * ItemSize(dtype)));
    result = shared.span();
  }
  FusedReduction reduction(dtype, parts, result);
  REPVAR_RETURN_IF_ERROR(collectives_->ReduceApply(spec, reduction));
  for (size_t i = 0; i < parts.size(); ++i) {
    Reduced reduced;
    if (single) {
      reduced = Sealed(*std::exchange(single, std::nullopt));
    } else {
      const FusedReduction::Part& p = parts[i];
      REPVAR_ASSIGN_OR_RETURN(Tensor value,
                              Tensor::ForOverwrite(p.begin->spec, Shared(p.begin->spec)));
      reduced = SealedCopy(std::move(value), result.data() + p.offset * ItemSize(dtype));
    }
    out.reduced_nonfinite[vars[i]->id] = reduced.first_nonfinite;
    out.values[vars[i]->id] = std::make_shared<const Tensor>(std::move(reduced.value));
  }
  return absl::OkStatus();
}

absl::Status PlanRunner::RunAllreduce(const LocalStep& s, const CollectiveSpec& spec,
                                      const StepCollective& c, PlanOutput& out) const {
  std::vector<const StepVariable*> vars;
  vars.reserve(c.variables.count());
  c.variables.ForEach([&](uint32_t i) { vars.push_back(&s.layout->info.variables[i]); });
  // Folded into the ring (ReduceApply) when the variables have one dtype
  // and every participant holds each of them: every member then takes the
  // same way, from the same plan and layout.
  const bool fold = std::all_of(vars.begin(), vars.end(), [&](const StepVariable* var) {
    return var->spec.dtype == vars.front()->spec.dtype &&
           EveryParticipantHolds(*var, s.layout->info.participants.size());
  });
  if (fold) return RunFolded(s, spec, vars, out);
  // Else one fused buffer for all the collective's variables, in order.
  std::vector<size_t> offsets;
  size_t total = 0;
  AccumType type = AccumType::kFloat32;
  for (const StepVariable* var : vars) {
    REPVAR_ASSIGN_OR_RETURN(int64_t n, var->spec.NumElements());
    type = AccumTypeFor(var->spec.dtype);
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
    REPVAR_ASSIGN_OR_RETURN(LocalValues local, LocalValuesOf(s, *vars[i]));
    begins[i] = local.begin;
    for (size_t k = 0; k < local.written.size(); ++k) {  // the first overwrites: no clearing pass
      REPVAR_RETURN_IF_ERROR(AddDelta(*local.begin, *local.written[k], region, k == 0));
    }
    if (local.written.empty()) std::memset(region.data(), 0, region.size());
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
  const StepVariable* var = &s.layout->info.variables[c.variables.bounds().front()];
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

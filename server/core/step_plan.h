// SPDX-License-Identifier: Apache-2.0
// The pure decisions of a step's barrier (docs/architecture.md, "A step"):
// from the variables the reports changed, which replica each NONE or
// ONLY_FIRST_REPLICA variable takes its value from, and the collectives
// the workers run, in their fixed order. No lock, no I/O.
#ifndef REPVAR_SERVER_CORE_STEP_PLAN_H_
#define REPVAR_SERVER_CORE_STEP_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/model/step.h"

namespace repvar::server {

// A variable some replica changed in the step, as the reports left it.
struct ChangedVariable {
  const StepVariable* variable = nullptr;
  uint32_t index = 0;  // in the layout
  // NONE/ONLY_FIRST_REPLICA: the checksum every replica taking part holds,
  // when the digests showed they agree; else `checksums`.
  std::optional<uint64_t> agreed;
  // Per replica: its reported checksum, or the begin value's where it
  // reported none (NONE/ONLY_FIRST_REPLICA without `agreed` only).
  std::vector<uint64_t> checksums;
};

// The replicas taking part in the step (on a participant), in order.
std::vector<int32_t> Voters(const StepVariable& v);

// The replica whose value every replica takes (S4): for NONE the first
// replica holding the checksum most replicas hold (a tie goes to the lower
// replica, the primary first); for ONLY_FIRST_REPLICA the first voter.
// `voters` is not empty.
int32_t PickSource(Aggregation aggregation, const std::vector<int32_t>& voters,
                   const std::vector<uint64_t>& checksums);

// What the barrier decided: the changed variables (layout indices) with the
// checksum each ends with, in order (0 for SUM and MEAN: the reduction
// decides it), the collectives (fused reductions by accumulator type, then
// repairs by variable), and the NONE variables whose replicas disagreed.
// `changed` is in layout order.
struct StepDecision {
  IndexRanges changed;
  std::vector<uint64_t> expected;
  std::vector<StepCollective> collectives;
  std::vector<Divergence> divergences;
};
StepDecision PlanCollectives(const std::vector<ChangedVariable>& changed);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_STEP_PLAN_H_

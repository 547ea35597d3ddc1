// SPDX-License-Identifier: Apache-2.0
// A core test's synchronous views of the coordinator's step calls: the
// StepInfo a begun step describes, and a step's plan or resolution as they
// are now (the callbacks of Coordinator::WhenStepPlanned / WhenStepResolved
// answer at once when they are ready; DEADLINE_EXCEEDED when not yet).
#ifndef REPVAR_TESTS_TESTING_STEP_WAITS_H_
#define REPVAR_TESTS_TESTING_STEP_WAITS_H_

#include <memory>
#include <optional>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/core/coordinator.h"

namespace repvar::testing {

// The step as begun, with its state now.
inline absl::StatusOr<StepInfo> InfoOf(const absl::StatusOr<server::SharedStep>& s) {
  if (!s.ok()) return s.status();
  StepInfo info = *s->info;
  info.state = s->state;
  return info;
}

inline absl::StatusOr<StepInfo> BeginStep(server::Coordinator& core, int64_t step,
                                          absl::Duration barrier_timeout) {
  return InfoOf(core.BeginStep(step, barrier_timeout));
}

// The resolution of `epoch` if it resolved (or was refused) by now.
inline absl::StatusOr<StepResolution> ResolutionNow(server::Coordinator& core, uint64_t epoch) {
  auto got = std::make_shared<std::optional<absl::StatusOr<StepResolution>>>();
  core.WhenStepResolved(epoch, [got](absl::StatusOr<server::StepCoordinator::SharedResolution> r) {
    if (r.ok()) {
      got->emplace(**r);
    } else {
      got->emplace(r.status());
    }
  });
  if (!got->has_value()) {
    return absl::DeadlineExceededError(absl::StrCat("the step of epoch ", epoch, " is open"));
  }
  return **got;
}

// The ids of the variables at `indices` of a step's layout.
inline std::vector<uint64_t> IdsOf(const SharedVector<StepVariable>& variables,
                                   const IndexRanges& indices) {
  std::vector<uint64_t> ids;
  indices.ForEach([&](uint32_t i) { ids.push_back(variables[i].id); });
  return ids;
}

// The plan of `epoch`, or its resolution, if its barrier resolved by now.
// `detailed`: as the waiter of a detailed report.
inline absl::StatusOr<std::variant<StepPlan, StepResolution>> PlanNow(server::Coordinator& core,
                                                                      uint64_t epoch,
                                                                      bool detailed = false) {
  using Answer = absl::StatusOr<std::variant<StepPlan, StepResolution>>;
  auto got = std::make_shared<std::optional<Answer>>();
  core.WhenStepPlanned(
      epoch, detailed,
      [got](absl::StatusOr<std::variant<StepPlan, server::StepCoordinator::SharedResolution>> r) {
        if (!r.ok()) {
          got->emplace(r.status());
        } else if (const StepPlan* p = std::get_if<StepPlan>(&*r)) {
          got->emplace(*p);
        } else {
          got->emplace(*std::get<server::StepCoordinator::SharedResolution>(*r));
        }
      });
  if (!got->has_value()) {
    return absl::DeadlineExceededError(absl::StrCat("the barrier of epoch ", epoch, " is open"));
  }
  return **got;
}

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_STEP_WAITS_H_

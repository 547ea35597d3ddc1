// SPDX-License-Identifier: Apache-2.0
#include "server/core/worker_state.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"

namespace repvar::server {

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kUnknown:
      return "UNKNOWN";
    case WorkerState::kLive:
      return "LIVE";
    case WorkerState::kDead:
      return "DEAD";
  }
  return "?";
}

const char* WorkerEventName(WorkerEvent event) {
  switch (event) {
    case WorkerEvent::kRegistered:
      return "registered";
    case WorkerEvent::kDeclaredDead:
      return "declared dead";
  }
  return "?";
}

std::optional<WorkerState> NextWorkerState(WorkerState from, WorkerEvent event) {
  switch (event) {
    case WorkerEvent::kRegistered:
      if (from != WorkerState::kLive) return WorkerState::kLive;
      return std::nullopt;
    case WorkerEvent::kDeclaredDead:
      if (from == WorkerState::kLive) return WorkerState::kDead;
      return std::nullopt;
  }
  return std::nullopt;
}

void TransitionWorker(WorkerState& state, WorkerEvent event, const std::string& task) {
  std::optional<WorkerState> next = NextWorkerState(state, event);
  REPVAR_CHECK_MSG(next.has_value(),
                   absl::StrCat("illegal worker transition: ", task, " is ", WorkerStateName(state),
                                " and cannot be ", WorkerEventName(event)));
  state = *next;
}

}  // namespace repvar::server

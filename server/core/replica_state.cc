// SPDX-License-Identifier: Apache-2.0
#include "server/core/replica_state.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/model/variable.h"

namespace repvar::server {
namespace {

using S = ReplicaState;
using E = ReplicaEvent;

}  // namespace

const char* ReplicaEventName(ReplicaEvent event) {
  switch (event) {
    case E::kAcked:
      return "acked";
    case E::kMissed:
      return "missed";
    case E::kLost:
      return "lost";
    case E::kReturned:
      return "returned";
    case E::kReturnedUninitialized:
      return "returned uninitialized";
  }
  return "unknown";
}

std::optional<ReplicaState> NextReplicaState(ReplicaState from, ReplicaEvent event) {
  const bool on_live_worker = from != S::kUnavailable;
  switch (event) {
    case E::kAcked:
      if (on_live_worker) return S::kUpToDate;
      return std::nullopt;  // a dead worker's acknowledgement is never recorded
    case E::kMissed:
      return on_live_worker ? S::kStale : S::kUnavailable;
    case E::kLost:
      if (on_live_worker) return S::kUnavailable;
      return std::nullopt;  // declared dead twice
    case E::kReturned:
      if (!on_live_worker) return S::kStale;
      return std::nullopt;  // it never left
    case E::kReturnedUninitialized:
      if (!on_live_worker) return S::kUninitialized;
      return std::nullopt;
  }
  return std::nullopt;
}

bool TransitionReplica(ReplicaState& state, ReplicaEvent event, const std::string& variable,
                       int32_t index) {
  std::optional<ReplicaState> next = NextReplicaState(state, event);
  REPVAR_CHECK_MSG(
      next.has_value(),
      absl::StrCat("illegal replica transition: ", ReplicaName(variable, index), " is ",
                   ReplicaStateName(state), " and cannot be ", ReplicaEventName(event)));
  const bool moved = *next != state;
  state = *next;
  return moved;
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// A worker task (job, task) as the coordinator records it, and the only
// legal ways that changes. ClusterState::Apply moves every worker through
// TransitionWorker(); nothing else writes a worker's state.
//
//   UNKNOWN --registered(inc)--> LIVE(inc) --declared dead--> DEAD(inc)
//                                   ^                             |
//                                   '-----registered(inc')--------'
//
// A registration of a LIVE task: the same incarnation again is idempotent
// (nothing to record), an older one is refused (ABORTED), a newer one
// supersedes the live one at once (T1: declared dead, then registered, in
// one record). Heartbeats are liveness, not state: they change nothing
// that must survive a restart.
//
// An event outside the table is a bug in the code that built the record:
// it crashes, naming the task, its state and the event.
#ifndef REPVAR_SERVER_CORE_WORKER_STATE_H_
#define REPVAR_SERVER_CORE_WORKER_STATE_H_

#include <optional>
#include <string>

namespace repvar::server {

enum class WorkerState { kUnknown, kLive, kDead };
enum class WorkerEvent { kRegistered, kDeclaredDead };

const char* WorkerStateName(WorkerState state);
const char* WorkerEventName(WorkerEvent event);

// The state after `event` in `from`; nullopt when the event cannot happen
// there.
std::optional<WorkerState> NextWorkerState(WorkerState from, WorkerEvent event);

// Moves `state` through `event`. Crashes, naming `task` ("job:task"), when
// the transition is not in the table.
void TransitionWorker(WorkerState& state, WorkerEvent event, const std::string& task);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_WORKER_STATE_H_

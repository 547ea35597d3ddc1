// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_CORE_WORKER_AGENT_H_
#define REPVAR_WORKER_CORE_WORKER_AGENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/topology.h"
#include "worker/core/coordinator_link.h"
#include "worker/core/local_reads.h"

namespace repvar::worker {

// Keeps this worker registered and heartbeating. Driven by Tick(now), which
// returns when to call it next; main() runs the loop, tests call it directly.
//
//   UNREGISTERED --Register OK--> REGISTERED --Heartbeat NOT_FOUND--> UNREGISTERED
//     ^  |   |                      |  ^    |
//     '--'   | Register ABORTED     '--'    | Heartbeat ABORTED
//  failed:   v                    OK or     v
//  backoff  FENCED <--------------------- (a newer incarnation of this task
//                              UNAVAILABLE  registered: this process must
//                                           stop; main() exits)
//
// Not thread-safe: one thread drives it.
class WorkerAgent {
 public:
  enum class State { kUnregistered, kRegistered, kFenced };
  // `local_reads` (optional): told of every heartbeat's lease and
  // confirmations, and of the registration being lost.
  WorkerAgent(WorkerRegistration reg, CoordinatorLink* link, LocalReads* local_reads = nullptr)
      : reg_(std::move(reg)), link_(link), local_reads_(local_reads) {}

  absl::Time Tick(absl::Time now);
  State state() const { return state_; }
  const WorkerRegistration& registration() const { return reg_; }

 private:
  const WorkerRegistration reg_;
  CoordinatorLink* const link_;
  LocalReads* const local_reads_;
  State state_ = State::kUnregistered;
  absl::Duration interval_ = absl::Seconds(1);
  absl::Duration backoff_ = absl::Milliseconds(50);
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_WORKER_AGENT_H_

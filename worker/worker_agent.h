// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_WORKER_AGENT_H_
#define REPVAR_WORKER_WORKER_AGENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace repvar::worker {

struct Registration {
  std::string job;
  int32_t task = 0;
  std::string address;
  uint64_t incarnation = 0;
  std::vector<std::string> devices;
};

// What the agent needs from the coordinator (the test seam).
class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  // Returns the heartbeat interval the coordinator asks for.
  virtual absl::StatusOr<absl::Duration> Register(const Registration& reg) = 0;
  virtual absl::Status Heartbeat(const std::string& job, int32_t task, uint64_t incarnation) = 0;
};

// Keeps this worker registered and heartbeating. Driven by Tick(now), which
// returns when to call it next; main() runs the loop, tests call it directly.
//
//   UNREGISTERED --Register OK--> REGISTERED --Heartbeat NOT_FOUND/ABORTED--> UNREGISTERED
//        ^  |                         |  ^
//        '--' Register failed:        '--' Heartbeat OK or UNAVAILABLE
//             retry with backoff           (transient: keep trying)
//
// Not thread-safe: one thread drives it.
class WorkerAgent {
 public:
  enum class State { kUnregistered, kRegistered };
  WorkerAgent(Registration reg, CoordinatorLink* link) : reg_(std::move(reg)), link_(link) {}

  absl::Time Tick(absl::Time now);
  State state() const { return state_; }
  const Registration& registration() const { return reg_; }

 private:
  const Registration reg_;
  CoordinatorLink* const link_;
  State state_ = State::kUnregistered;
  absl::Duration interval_ = absl::Seconds(1);
  absl::Duration backoff_ = absl::Milliseconds(50);
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_WORKER_AGENT_H_

// SPDX-License-Identifier: Apache-2.0
// What the worker core needs from the coordinator: the test seams between
// the core and the network (worker/rpc/grpc_coordinator_link.h is the real
// one). Every call blocks until the coordinator answers or its timeout,
// except the one that says it does not (ReportStepAsync).
#ifndef REPVAR_WORKER_CORE_COORDINATOR_LINK_H_
#define REPVAR_WORKER_CORE_COORDINATOR_LINK_H_

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/replica_write.h"
#include "common/model/step.h"
#include "common/model/task.h"
#include "common/model/topology.h"

namespace repvar::worker {

// A heartbeat's answer: the read lease from when it was sent (zero: none),
// and per held value asked about whether it is committed.
struct HeartbeatAnswer {
  absl::Duration read_lease;
  std::vector<bool> confirmed;
};

// Membership: what WorkerAgent calls.
class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  // Returns the heartbeat interval the coordinator asks for.
  virtual absl::StatusOr<absl::Duration> Register(const WorkerRegistration& reg) = 0;
  // Errors: NOT_FOUND (declared dead: register again), ABORTED (stale
  // incarnation), UNAVAILABLE.
  // `read_lease`: this worker serves local reads; `held`: values to confirm.
  virtual absl::StatusOr<HeartbeatAnswer> Heartbeat(const TaskKey& task, uint64_t incarnation,
                                                    bool read_lease,
                                                    const std::vector<HeldValue>& held) = 0;
};

// Steps: what the step table and the step resolver call.
class StepLink {
 public:
  virtual ~StepLink() = default;
  // The step of `epoch`; without its layout (layout_omitted) when it is
  // `known_layout`. Errors: NOT_FOUND (unknown epoch), UNAVAILABLE.
  virtual absl::StatusOr<StepInfo> GetStep(uint64_t epoch, uint64_t known_layout) = 0;
  // Sends this worker's one report; answers when the barrier resolves: the
  // plan to run, or the resolution when there is nothing to run.
  virtual absl::StatusOr<std::variant<StepPlan, StepResolution>> ReportStep(
      const WorkerReport& report, absl::Duration timeout) = 0;
  // The same without a waiting thread: `done` gets what ReportStep would
  // return, exactly once, on whatever thread receives the answer (or the
  // caller's). It must not block. By default, ReportStep then `done`, on
  // the caller's thread.
  using ReportAnswer = absl::StatusOr<std::variant<StepPlan, StepResolution>>;
  virtual void ReportStepAsync(const WorkerReport& report, absl::Duration timeout,
                               absl::AnyInvocable<void(ReportAnswer) &&> done) {
    std::move(done)(ReportStep(report, timeout));
  }
  // After the plan: this worker's values; answers with the resolution.
  virtual absl::StatusOr<StepResolution> FinishStep(const WorkerFinish& finish,
                                                    absl::Duration timeout) = 0;
  // DEADLINE_EXCEEDED when not resolved within `timeout`. `whole`: with the
  // per-variable list (a worker holding no replica in the step, for its
  // trainers); else the short form (StepResolution::short_form).
  virtual absl::StatusOr<StepResolution> WaitStep(uint64_t epoch, absl::Duration timeout,
                                                  bool whole) = 0;
};

// The data plane's rendezvous: where workers meet to build a gloo context
// (the coordinator's store).
class RendezvousClient {
 public:
  virtual ~RendezvousClient() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for the key. Errors: DEADLINE_EXCEEDED, UNAVAILABLE.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_COORDINATOR_LINK_H_

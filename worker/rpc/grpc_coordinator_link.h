// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_RPC_GRPC_COORDINATOR_LINK_H_
#define REPVAR_WORKER_RPC_GRPC_COORDINATOR_LINK_H_

#include <memory>
#include <string>

#include "common/rpc/security.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "worker/core/coordinator_link.h"
#include "worker/rpc/step_stream_client.h"

namespace repvar::worker {

// The worker core's links to the coordinator (membership, steps, the data
// plane's rendezvous) over one gRPC channel. Every call has a deadline.
// GetStep, ReportStep and FinishStep -- a worker's calls of every step --
// go as messages on one long-lived StepStream (StepStreamClient); the rest
// are unary calls. Thread-safe.
class GrpcCoordinatorLink final : public CoordinatorLink, public StepLink, public RendezvousClient {
 public:
  GrpcCoordinatorLink(const std::string& address, const ChannelSecurity& security);

  absl::StatusOr<absl::Duration> Register(const WorkerRegistration& reg) override;
  absl::StatusOr<HeartbeatAnswer> Heartbeat(const TaskKey& task, uint64_t incarnation,
                                            bool read_lease,
                                            const std::vector<HeldValue>& held) override;

  absl::StatusOr<StepInfo> GetStep(uint64_t epoch, uint64_t known_layout) override;
  absl::StatusOr<std::variant<StepPlan, StepResolution>> ReportStep(
      const WorkerReport& report, absl::Duration timeout) override;
  // The answer is handled on the gRPC thread that reads it.
  void ReportStepAsync(const WorkerReport& report, absl::Duration timeout,
                       absl::AnyInvocable<void(ReportAnswer) &&> done) override;
  absl::StatusOr<StepResolution> FinishStep(const WorkerFinish& finish,
                                            absl::Duration timeout) override;
  absl::StatusOr<StepResolution> WaitStep(uint64_t epoch, absl::Duration timeout,
                                          bool whole) override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  std::unique_ptr<v1::CoordinatorWorkers::Stub> stub_;
  StepStreamClient steps_;  // after stub_, which it uses
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_RPC_GRPC_COORDINATOR_LINK_H_

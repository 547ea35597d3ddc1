// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_WORKER_SERVICE_H_
#define REPVAR_WORKER_WORKER_SERVICE_H_

#include <cstdint>

#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "worker/data_plane.h"
#include "worker/local_steps.h"
#include "worker/replica_store.h"
#include "worker/worker_agent.h"

namespace repvar::worker {

// gRPC adapter over ReplicaStore. Writes carrying another incarnation are
// refused (ABORTED): they were meant for an earlier process. Thread-safe.
class WorkerService final : public v1::Worker::Service {
 public:
  // `data_plane` may be null: writes asking for a collective are then refused.
  // `steps` serves the trainers' in-step calls.
  WorkerService(uint64_t incarnation, ReplicaStore* store, GlooDataPlane* data_plane,
                LocalSteps* steps)
      : incarnation_(incarnation), store_(store), data_plane_(data_plane), steps_(steps) {}

  grpc::Status WriteReplicas(grpc::ServerContext*, grpc::ServerReader<v1::WriteReplicasRequest>*,
                             v1::WriteReplicasResponse*) override;
  grpc::Status WriteSmallReplicas(grpc::ServerContext*, const v1::WriteSmallReplicasRequest*,
                                  v1::WriteReplicasResponse*) override;
  grpc::Status ReadReplica(grpc::ServerContext*, const v1::ReadReplicaRequest*,
                           grpc::ServerWriter<v1::ReadVariableChunk>*) override;
  grpc::Status DropVariable(grpc::ServerContext*, const v1::DropVariableRequest*,
                            v1::DropVariableResponse*) override;
  grpc::Status GetReplicaStatus(grpc::ServerContext*, const v1::GetReplicaStatusRequest*,
                                v1::GetReplicaStatusResponse*) override;
  grpc::Status StepWrite(grpc::ServerContext*, grpc::ServerReader<v1::StepWriteRequest>*,
                         v1::StepWriteResponse*) override;
  grpc::Status StepWriteSmall(grpc::ServerContext*, const v1::StepWriteSmallRequest*,
                              v1::StepWriteResponse*) override;
  grpc::Status CommitStep(grpc::ServerContext*, const v1::CommitStepRequest*,
                          v1::StepResolution*) override;
  grpc::Status DiscardStep(grpc::ServerContext*, const v1::DiscardStepRequest*,
                           v1::DiscardStepResponse*) override;
  grpc::Status StepMap(grpc::ServerContext*, const v1::StepMapRequest*,
                       v1::StepMapResponse*) override;
  grpc::Status StepUnmap(grpc::ServerContext*, const v1::StepUnmapRequest*,
                         v1::StepUnmapResponse*) override;

 private:
  grpc::Status Apply(absl::StatusOr<std::vector<ReplicaWrite>> items,
                     v1::WriteReplicasResponse* resp);

  const uint64_t incarnation_;
  ReplicaStore* const store_;
  GlooDataPlane* const data_plane_;
  LocalSteps* const steps_;
};

// CoordinatorLink and the data plane's RendezvousClient over a gRPC stub.
class GrpcCoordinatorLink final : public CoordinatorLink, public RendezvousClient, public StepLink {
 public:
  explicit GrpcCoordinatorLink(const std::string& address);
  absl::StatusOr<absl::Duration> Register(const Registration& reg) override;
  absl::Status Heartbeat(const std::string& job, int32_t task, uint64_t incarnation) override;
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<v1::StepInfo> GetStep(uint64_t epoch, uint64_t known_layout) override;
  absl::StatusOr<v1::StepPlan> ReportStep(const v1::ReportStepRequest& req,
                                          absl::Duration timeout) override;
  absl::StatusOr<v1::StepResolution> FinishStep(const v1::FinishStepRequest& req,
                                                absl::Duration timeout) override;
  absl::StatusOr<v1::StepResolution> WaitStep(uint64_t epoch, absl::Duration timeout) override;

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_WORKER_SERVICE_H_

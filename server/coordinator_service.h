// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_COORDINATOR_SERVICE_H_
#define REPVAR_SERVER_COORDINATOR_SERVICE_H_

#include <atomic>

#include "repvar/v1/coordinator.grpc.pb.h"
#include "server/coordinator.h"

namespace repvar::server {

// ReportStep and FinishStep, the long polls every worker makes every step,
// use the callback API: no thread waits for a barrier. The other methods use
// the synchronous API.
using CoordinatorServiceBase = v1::Coordinator::WithCallbackMethod_ReportStep<
    v1::Coordinator::WithCallbackMethod_FinishStep<v1::Coordinator::Service>>;

// The gRPC face of Coordinator: proto -> domain -> core -> proto. No logic
// beyond conversion and chunk-stream framing. Synchronous methods that block
// on the core (a broadcast) are carried by gRPC's thread pool; the step long
// polls are answered by whoever resolves the step. Thread-safe.
class CoordinatorService final : public CoordinatorServiceBase {
 public:
  explicit CoordinatorService(Coordinator* core) : core_(core) {}

  // Ends open WatchTopology streams and step long polls promptly.
  void Shutdown() {
    shutting_down_ = true;
    core_->ShutdownStepWaiters();
  }

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override;
  grpc::Status GetTopology(grpc::ServerContext*, const v1::GetTopologyRequest*,
                           v1::Topology*) override;
  grpc::Status WatchTopology(grpc::ServerContext*, const v1::WatchTopologyRequest*,
                             grpc::ServerWriter<v1::Topology>*) override;
  grpc::Status WaitForTopology(grpc::ServerContext*, const v1::WaitForTopologyRequest*,
                               v1::Topology*) override;
  grpc::Status CreateVariables(grpc::ServerContext*, const v1::CreateVariablesRequest*,
                               v1::CreateVariablesResponse*) override;
  grpc::Status GetVariable(grpc::ServerContext*, const v1::GetVariableRequest*,
                           v1::VariableInfo*) override;
  grpc::Status ListVariables(grpc::ServerContext*, const v1::ListVariablesRequest*,
                             v1::ListVariablesResponse*) override;
  grpc::Status DeleteVariable(grpc::ServerContext*, const v1::DeleteVariableRequest*,
                              v1::DeleteVariableResponse*) override;
  grpc::Status InitializeVariables(grpc::ServerContext*, const v1::InitializeVariablesRequest*,
                                   v1::InitializeVariablesResponse*) override;
  grpc::Status IsInitialized(grpc::ServerContext*, const v1::IsInitializedRequest*,
                             v1::IsInitializedResponse*) override;
  grpc::Status AssignVariable(grpc::ServerContext*, grpc::ServerReader<v1::AssignVariableRequest>*,
                              v1::AssignVariableResponse*) override;
  grpc::Status AssignVariables(grpc::ServerContext*, const v1::AssignVariablesRequest*,
                               v1::AssignVariablesResponse*) override;
  grpc::Status ReadVariable(grpc::ServerContext*, const v1::ReadVariableRequest*,
                            grpc::ServerWriter<v1::ReadVariableResponse>*) override;
  grpc::Status ReadVariables(grpc::ServerContext*, const v1::ReadVariablesRequest*,
                             v1::ReadVariablesResponse*) override;
  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest*,
                        v1::StoreSetResponse*) override;
  grpc::Status StoreGet(grpc::ServerContext*, const v1::StoreGetRequest*,
                        v1::StoreGetResponse*) override;

  // Replicated steps (coordinator_step_service.cc).
  grpc::Status BeginStep(grpc::ServerContext*, const v1::BeginStepRequest*, v1::StepInfo*) override;
  grpc::Status GetStep(grpc::ServerContext*, const v1::GetStepRequest*, v1::StepInfo*) override;
  grpc::Status AbortStep(grpc::ServerContext*, const v1::AbortStepRequest*,
                         v1::AbortStepResponse*) override;
  grpc::ServerUnaryReactor* ReportStep(grpc::CallbackServerContext*, const v1::ReportStepRequest*,
                                       v1::StepPlan*) override;
  grpc::ServerUnaryReactor* FinishStep(grpc::CallbackServerContext*, const v1::FinishStepRequest*,
                                       v1::StepResolution*) override;
  grpc::Status WaitStep(grpc::ServerContext*, const v1::WaitStepRequest*,
                        v1::StepResolution*) override;
  grpc::Status GetSteps(grpc::ServerContext*, const v1::GetStepsRequest*,
                        v1::StepsStatus*) override;
  grpc::Status WatchSteps(grpc::ServerContext*, const v1::WatchStepsRequest*,
                          grpc::ServerWriter<v1::StepEvent>*) override;

 private:
  // Long-polls the resolution of `epoch` until `deadline`.
  grpc::Status AwaitResolution(grpc::ServerContext* ctx, uint64_t epoch, absl::Time deadline,
                               v1::StepResolution* resp);

  // The step description as a message, built once per step and copied into
  // each BeginStep/GetStep answer (32 trainers and 32 workers ask per step);
  // without its layout when the caller already holds `known_layout`.
  void StepInfoAnswer(const Coordinator::SharedStep& step, uint64_t known_layout,
                      v1::StepInfo* resp);

  Coordinator* const core_;
  std::atomic<bool> shutting_down_{false};
  absl::Mutex info_mu_;
  std::shared_ptr<const StepInfo> info_source_ ABSL_GUARDED_BY(info_mu_);
  v1::StepInfo info_proto_ ABSL_GUARDED_BY(info_mu_);
};

// Conversions shared with tests.
absl::StatusOr<VariableDef> VariableDefFromProto(const v1::VariableSpec& proto);
void VariableViewToProto(const VariableView& view, v1::VariableInfo* proto);
void TopologyToProto(const TopologySnapshot& topo, v1::Topology* proto);
void StepInfoToProto(const StepInfo& info, v1::StepInfo* proto);
void StepResolutionToProto(const StepResolution& r, v1::StepResolution* proto);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_COORDINATOR_SERVICE_H_

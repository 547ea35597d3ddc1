// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_WORKERS_SERVICE_H_
#define REPVAR_SERVER_RPC_WORKERS_SERVICE_H_

#include <atomic>
#include <functional>

#include "absl/synchronization/mutex.h"
#include "common/base/thread_pool.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "server/core/coordinator.h"
#include "server/rpc/step_info_cache.h"

namespace repvar::server {

// StepStream (each worker's step calls as messages on one stream), and
// ReportStep and FinishStep, the long polls of a worker that calls them one
// by one, use the callback API: no thread waits for a barrier; they are
// answered by whoever resolves the step. Heartbeat and RegisterWorker do
// too, so that membership never waits for a thread of the synchronous pool
// (bounded: --max_rpc_threads), which long-lived streams may hold; a
// registration's verification and resync (seconds) run on a thread of
// their own. The other methods use the synchronous API.
using WorkersServiceBase = v1::CoordinatorWorkers::WithCallbackMethod_RegisterWorker<
    v1::CoordinatorWorkers::WithCallbackMethod_Heartbeat<
        v1::CoordinatorWorkers::WithCallbackMethod_ReportStep<
            v1::CoordinatorWorkers::WithCallbackMethod_FinishStep<
                v1::CoordinatorWorkers::WithCallbackMethod_StepStream<
                    v1::CoordinatorWorkers::Service>>>>>;

// The gRPC face of the coordinator for workers (repvar.v1.CoordinatorWorkers):
// proto -> model -> core -> proto, and long polls. Thread-safe.
class WorkersService final : public WorkersServiceBase {
 public:
  WorkersService(Coordinator* core, StepInfoCache* steps) : core_(core), steps_(steps) {}
  ~WorkersService() override;  // serves the registrations waiting, then returns

  // Ends step long polls promptly (they answer UNAVAILABLE).
  void Shutdown();

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext*,
                                           const v1::RegisterWorkerRequest*,
                                           v1::RegisterWorkerResponse*) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext*, const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse*) override;
  grpc::Status GetStep(grpc::ServerContext*, const v1::GetStepRequest*, v1::StepInfo*) override;
  grpc::ServerUnaryReactor* ReportStep(grpc::CallbackServerContext*, const v1::ReportStepRequest*,
                                       v1::StepPlan*) override;
  grpc::ServerUnaryReactor* FinishStep(grpc::CallbackServerContext*, const v1::FinishStepRequest*,
                                       v1::StepResolution*) override;
  grpc::Status WaitStep(grpc::ServerContext*, const v1::WaitStepRequest*,
                        v1::StepResolution*) override;
  grpc::ServerBidiReactor<v1::StepStreamRequest, v1::StepStreamResponse>* StepStream(
      grpc::CallbackServerContext*) override;
  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest*,
                        v1::StoreSetResponse*) override;
  grpc::Status StoreGet(grpc::ServerContext*, const v1::StoreGetRequest*,
                        v1::StoreGetResponse*) override;

 private:
  class StepStreamReactor;

  // The step calls, whichever way they come (unary or on StepStream): each
  // fills `out` and calls `done` once with the call's status, at once or
  // (a report, a finish) when the barrier resolves, on whichever thread
  // resolves it; `out` must live until then.
  using Done = std::function<void(grpc::Status)>;
  void ServeGetStep(const v1::GetStepRequest& req, v1::StepInfo* out, const Done& done);
  void ServeReport(const grpc::ServerContextBase& ctx, const v1::ReportStepRequest& req,
                   v1::StepPlan* out, Done done);
  void ServeFinish(const grpc::ServerContextBase& ctx, const v1::FinishStepRequest& req,
                   v1::StepResolution* out, Done done);

  Coordinator* const core_;
  StepInfoCache* const steps_;
  std::atomic<bool> shutting_down_{false};
  // Registrations being served: each verifies and resyncs its worker
  // (seconds), a few at a time; the rest wait their turn.
  static constexpr int kRegistrationThreads = 8;
  ThreadPool registrations_{1, kRegistrationThreads};
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_WORKERS_SERVICE_H_

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_TRAINERS_SERVICE_H_
#define REPVAR_SERVER_RPC_TRAINERS_SERVICE_H_

#include <atomic>

#include "common/base/memory_budget.h"
#include "common/base/thread_pool.h"
#include "common/rpc/arena_allocator.h"
#include "common/rpc/chunk_frame.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "server/core/coordinator.h"
#include "server/core/scalar_board.h"
#include "server/rpc/step_info_cache.h"

namespace repvar::server {

// The gRPC face of the coordinator for trainers
// (repvar.v1.CoordinatorTrainers): proto -> model -> core -> proto, chunk
// stream framing and long polls; no logic beyond that. Synchronous methods
// that block on the core (a broadcast) are carried by gRPC's thread pool.
// BeginStep uses the callback API: every trainer calls it at once each step,
// and all but the first find the step open and are answered on the callback
// thread; the one that opens it (a record, a sync) or has to wait (writes in
// flight, a checkpoint's hold) runs on a thread of `begins_`.
// ReadVariables (every small read, and batched reads) too: what the
// coordinator holds is answered on the callback thread, with its messages
// on an arena per call; a batch with a value only a replica holds is read
// on a thread of `replica_reads_`, which waits for the worker. Thread-safe.
using TrainersServiceBase = v1::CoordinatorTrainers::WithCallbackMethod_ReadVariables<
    v1::CoordinatorTrainers::WithCallbackMethod_BeginStep<v1::CoordinatorTrainers::Service>>;

class TrainersService final : public TrainersServiceBase {
 public:
  // A tensor being received takes memory from its connection's share of
  // the coordinator's budget: `per_connection_bytes` (0: half the budget).
  // Published scalars go on `scalars`.
  TrainersService(Coordinator* core, StepInfoCache* steps, ScalarBoard* scalars,
                  uint64_t per_connection_bytes = 0)
      : core_(core),
        steps_(steps),
        scalars_(scalars),
        connections_(core->budget(), per_connection_bytes > 0 ? per_connection_bytes
                                                              : core->budget()->capacity() / 2) {
    SetMessageAllocatorFor_ReadVariables(&read_messages_);
    // AssignVariable takes chunks from gRPC's slices straight into the value
    // (ReadFrame), and ReadVariable answers in chunk frames: the value's
    // bytes are copied once coming in, and not at all going out.
    MarkMethodStreamed(MethodIndex(v1::CoordinatorTrainers::service_full_name(), "AssignVariable"),
                       FrameReadingHandler(this, &TrainersService::AssignVariableFrames));
    MarkMethodStreamed(MethodIndex(v1::CoordinatorTrainers::service_full_name(), "ReadVariable"),
                       FrameStreamingHandler(this, &TrainersService::ReadVariableFrames));
  }

  // Ends open WatchTopology and WatchSteps streams promptly.
  void Shutdown() { shutting_down_ = true; }

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
  grpc::Status InitializeVariables(grpc::ServerContext*, const v1::InitializeVariablesRequest*,
                                   v1::InitializeVariablesResponse*) override;
  grpc::Status IsInitialized(grpc::ServerContext*, const v1::IsInitializedRequest*,
                             v1::IsInitializedResponse*) override;
  grpc::Status AssignVariables(grpc::ServerContext*, const v1::AssignVariablesRequest*,
                               v1::AssignVariablesResponse*) override;
  // AssignVariable and ReadVariable (see the constructor).
  grpc::Status AssignVariableFrames(grpc::ServerContext*, FrameReader*,
                                    v1::AssignVariableResponse*);
  grpc::Status ReadVariableFrames(grpc::ServerContext*, const v1::ReadVariableRequest&,
                                  FrameWriter<v1::ReadVariableRequest>*);
  grpc::ServerUnaryReactor* ReadVariables(grpc::CallbackServerContext*,
                                          const v1::ReadVariablesRequest*,
                                          v1::ReadVariablesResponse*) override;

  // Replicated steps (trainers_steps.cc).
  grpc::ServerUnaryReactor* BeginStep(grpc::CallbackServerContext*, const v1::BeginStepRequest*,
                                      v1::StepInfo*) override;
  grpc::Status AbortStep(grpc::ServerContext*, const v1::AbortStepRequest*,
                         v1::AbortStepResponse*) override;
  grpc::Status GetSteps(grpc::ServerContext*, const v1::GetStepsRequest*,
                        v1::StepsStatus*) override;
  grpc::Status WatchSteps(grpc::ServerContext*, const v1::WatchStepsRequest*,
                          grpc::ServerWriter<v1::StepEvent>*) override;

  grpc::Status PublishScalars(grpc::ServerContext*, const v1::PublishScalarsRequest*,
                              v1::PublishScalarsResponse*) override;

 private:
  Coordinator* const core_;
  StepInfoCache* const steps_;
  ScalarBoard* const scalars_;
  ConnectionBudgets connections_;
  std::atomic<bool> shutting_down_{false};
  ArenaMessageAllocator<v1::ReadVariablesRequest, v1::ReadVariablesResponse> read_messages_;
  // Calls that wait, on threads of their own: BeginStep calls that open a
  // step or wait, and batched reads of values only replicas hold (one more
  // thread whenever all are waiting, as a synchronous method's would be).
  // Last: destroyed first, while what they use is still there.
  ThreadPool begins_{kBeginThreads};
  ThreadPool replica_reads_{1, kMaxReplicaReadThreads};
  static constexpr int kBeginThreads = 4;
  static constexpr int kMaxReplicaReadThreads = 16;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_TRAINERS_SERVICE_H_

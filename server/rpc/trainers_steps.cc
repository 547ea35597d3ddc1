// SPDX-License-Identifier: Apache-2.0
// The step RPCs of TrainersService: conversions and the event stream over the
// core's BeginStep / AbortStep / GetSteps / WaitStepEvents.
#include <string>
#include <utility>

#include "common/base/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/to_proto.h"
#include "server/rpc/trainers_service.h"

namespace repvar::server {
namespace {

// The event stream wakes this often to notice a cancelled call or a shutdown.
constexpr absl::Duration kPollSlice = absl::Milliseconds(500);

}  // namespace

grpc::ServerUnaryReactor* TrainersService::BeginStep(grpc::CallbackServerContext* ctx,
                                                     const v1::BeginStepRequest* req,
                                                     v1::StepInfo* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto answer = [this, reactor, req, resp](const absl::StatusOr<SharedStep>& step) {
    if (!step.ok()) {
      reactor->Finish(ToGrpcStatus(step.status()));
      return;
    }
    steps_->Answer(*step, req->known_layout(), req->shared_lists(), resp);
    reactor->Finish(grpc::Status::OK);
  };
  const absl::Duration barrier = absl::Milliseconds(req->barrier_timeout_ms());
  std::string request_id = RequestIdOf(*ctx);
  {
    const ScopedRequestId scoped(request_id);
    if (auto joined = core_->JoinOpenStep(req->step(), barrier)) {
      answer(*joined);  // the step is open already (or the call is refused)
      return reactor;
    }
  }
  begins_.Schedule([this, answer, request_id = std::move(request_id), step = req->step(), barrier] {
    const ScopedRequestId scoped(request_id);
    answer(core_->BeginStep(step, barrier));
  });
  return reactor;
}

grpc::Status TrainersService::AbortStep(grpc::ServerContext* ctx, const v1::AbortStepRequest* req,
                                        v1::AbortStepResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  return ToGrpcStatus(core_->AbortStep(req->epoch(), req->reason()));
}

grpc::Status TrainersService::GetSteps(grpc::ServerContext* ctx, const v1::GetStepsRequest*,
                                       v1::StepsStatus* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  StepsStatusToProto(core_->GetSteps(), resp);
  return grpc::Status::OK;
}

grpc::Status TrainersService::WatchSteps(grpc::ServerContext* ctx, const v1::WatchStepsRequest* req,
                                         grpc::ServerWriter<v1::StepEvent>* writer) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  // Negative: from now on (what happened before is not replayed).
  int64_t after = req->after_seq() < 0 ? core_->LatestStepEventSeq() : req->after_seq();
  while (!ctx->IsCancelled() && !shutting_down_) {
    for (const StepEvent& e : core_->WaitStepEvents(after, absl::Now() + kPollSlice)) {
      v1::StepEvent proto;
      StepEventToProto(e, &proto);
      if (!writer->Write(proto)) return grpc::Status::OK;
      after = e.seq;
    }
  }
  return grpc::Status::OK;
}

}  // namespace repvar::server

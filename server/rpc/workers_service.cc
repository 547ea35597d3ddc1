// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/workers_service.h"

#include <algorithm>

#include "common/base/logging.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/security.h"
#include "common/rpc/to_proto.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

// Long polls wake this often to notice a cancelled call or a shutdown.
constexpr absl::Duration kPollSlice = absl::Milliseconds(500);

// The call's deadline, capped at `cap` from now.
absl::Time PollDeadline(grpc::ServerContext* ctx, absl::Duration cap) {
  return std::min(absl::Now() + cap, absl::FromChrono(ctx->deadline()));
}

}  // namespace

void WorkersService::Shutdown() {
  shutting_down_ = true;
  core_->ShutdownStepWaiters();
}

WorkersService::~WorkersService() {
  absl::MutexLock lock(&registrations_mu_);
  for (Registration& r : registrations_) r.thread.join();
}

grpc::ServerUnaryReactor* WorkersService::RegisterWorker(grpc::CallbackServerContext* ctx,
                                                         const v1::RegisterWorkerRequest* req,
                                                         v1::RegisterWorkerResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (grpc::Status s = CheckCallerIsTask(*ctx, TaskKey{req->job(), req->task()}); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  auto serve = [this, req, resp]() -> grpc::Status {
    auto version = core_->RegisterWorker(RegistrationFromProto(*req));
    if (!version.ok()) return ToGrpcStatus(version.status());
    resp->set_topology_version(*version);
    resp->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(core_->registry().membership_options().heartbeat_timeout / 4));
    spdlog::info("worker {}:{} registered at {} (incarnation {}, {} devices)", req->job(),
                 req->task(), req->address(), req->incarnation(), req->devices_size());
    return grpc::Status::OK;
  };
  absl::MutexLock lock(&registrations_mu_);
  for (auto it = registrations_.begin(); it != registrations_.end();) {
    if (!it->done) {
      ++it;
      continue;
    }
    it->thread.join();
    it = registrations_.erase(it);
  }
  Registration& r = registrations_.emplace_back();
  // A returning worker is verified and resynced before it is answered:
  // seconds, so not on a callback thread.
  r.thread = std::thread([reactor, serve, &done = r.done] {
    reactor->Finish(serve());
    done = true;
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkersService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                    const v1::HeartbeatRequest* req,
                                                    v1::HeartbeatResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  // Answered at once, on the callback thread: a lock and a map update.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const TaskKey task{req->job(), req->task()};
  if (grpc::Status s = CheckCallerIsTask(*ctx, task); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  auto version = core_->Heartbeat(task, req->incarnation());
  if (version.ok()) resp->set_topology_version(*version);
  reactor->Finish(version.ok() ? grpc::Status::OK : ToGrpcStatus(version.status()));
  return reactor;
}

grpc::Status WorkersService::GetStep(grpc::ServerContext* ctx, const v1::GetStepRequest* req,
                                     v1::StepInfo* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto step = core_->GetStepShared(req->epoch());
  if (!step.ok()) return ToGrpcStatus(step.status());
  steps_->Answer(*step, req->known_layout(), resp);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* WorkersService::ReportStep(grpc::CallbackServerContext* ctx,
                                                     const v1::ReportStepRequest* req,
                                                     v1::StepPlan* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  WorkerReport report = ReportFromProto(*req);
  if (grpc::Status s = CheckCallerIsTask(*ctx, report.task); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  if (absl::Status s = core_->ReportStep(report); !s.ok()) {
    spdlog::debug("ReportStep from {} refused: {}", report.task.ToString(), s.ToString());
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  // Answered when the barrier resolves (the coordinator's ticker fails it at
  // its timeout), from the thread that resolves it.
  core_->WhenStepPlanned(
      req->epoch(), [reactor, resp, step = req->step(), epoch = req->epoch()](
                        absl::StatusOr<std::variant<StepPlan, StepResolution>> got) {
        if (!got.ok()) {
          reactor->Finish(ToGrpcStatus(got.status()));
          return;
        }
        if (auto* plan = std::get_if<StepPlan>(&*got)) {
          PlanToProto(*plan, resp);
        } else {
          resp->set_step(step);
          resp->set_epoch(epoch);
          StepResolutionToProto(std::get<StepResolution>(*got), resp->mutable_resolution());
        }
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* WorkersService::FinishStep(grpc::CallbackServerContext* ctx,
                                                     const v1::FinishStepRequest* req,
                                                     v1::StepResolution* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (grpc::Status s = CheckCallerIsTask(*ctx, TaskKey{req->job(), req->task()}); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  if (absl::Status s = core_->FinishStep(FinishFromProto(*req)); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  core_->WhenStepResolved(req->epoch(), [reactor, resp](absl::StatusOr<StepResolution> r) {
    if (!r.ok()) {
      reactor->Finish(ToGrpcStatus(r.status()));
      return;
    }
    StepResolutionToProto(*r, resp);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::Status WorkersService::WaitStep(grpc::ServerContext* ctx, const v1::WaitStepRequest* req,
                                      v1::StepResolution* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  const absl::Time deadline =
      PollDeadline(ctx, absl::Milliseconds(std::max<int64_t>(0, req->timeout_ms())));
  while (!ctx->IsCancelled() && !shutting_down_) {
    auto r = core_->WaitStepResolution(req->epoch(), std::min(absl::Now() + kPollSlice, deadline));
    if (r.ok()) {
      StepResolutionToProto(*r, resp);
      return grpc::Status::OK;
    }
    if (r.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= deadline) {
      return ToGrpcStatus(r.status());
    }
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "the call or the server ended");
}

grpc::Status WorkersService::StoreSet(grpc::ServerContext* ctx, const v1::StoreSetRequest* req,
                                      v1::StoreSetResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  return ToGrpcStatus(core_->store().Set(req->key(), req->value()));
}

grpc::Status WorkersService::StoreGet(grpc::ServerContext* ctx, const v1::StoreGetRequest* req,
                                      v1::StoreGetResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto value = core_->store().Get(
      req->key(), PollDeadline(ctx, absl::Milliseconds(std::max<int64_t>(0, req->timeout_ms()))));
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*std::move(value));
  return grpc::Status::OK;
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/workers_service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <string>

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

WorkersService::~WorkersService() = default;

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
  // A returning worker is verified and resynced before it is answered:
  // seconds, so not on a callback thread.
  registrations_.Schedule([reactor, serve] { reactor->Finish(serve()); });
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
  std::vector<HeldValue> held;
  held.reserve(static_cast<size_t>(req->held_size()));
  for (const v1::HeldValue& h : req->held()) {
    held.push_back(HeldValue{h.variable_id(), h.replica(), h.version(), h.checksum()});
  }
  auto grant = core_->Heartbeat(task, req->incarnation(), req->read_lease(), held);
  if (grant.ok()) {
    resp->set_topology_version(grant->topology_version);
    resp->set_read_lease_ms(absl::ToInt64Milliseconds(grant->read_lease));
    for (bool c : grant->confirmed) resp->add_confirmed(c);
  }
  reactor->Finish(grant.ok() ? grpc::Status::OK : ToGrpcStatus(grant.status()));
  return reactor;
}

void WorkersService::ServeGetStep(const v1::GetStepRequest& req, v1::StepInfo* out,
                                  const Done& done) {
  auto step = core_->GetStep(req.epoch());
  if (!step.ok()) return done(ToGrpcStatus(step.status()));
  steps_->Answer(*step, req.known_layout(), req.shared_lists(), out);
  done(grpc::Status::OK);
}

void WorkersService::ServeReport(const grpc::ServerContextBase& ctx,
                                 const v1::ReportStepRequest& req, v1::StepPlan* out, Done done) {
  if (grpc::Status s = CheckCallerIsTask(ctx, TaskKey{req.job(), req.task()}); !s.ok()) {
    return done(s);
  }
  absl::StatusOr<WorkerReport> parsed = ReportFromProto(req);
  if (!parsed.ok()) return done(ToGrpcStatus(parsed.status()));
  const WorkerReport& report = *parsed;
  if (absl::Status s = core_->ReportStep(report); !s.ok()) {
    spdlog::debug("ReportStep from {} refused: {}", report.task.ToString(), s.ToString());
    return done(ToGrpcStatus(s));
  }
  // Answered when the barrier resolves (the coordinator's ticker fails it at
  // its timeout), from the thread that resolves it.
  core_->WhenStepPlanned(
      req.epoch(), req.detailed(),
      [out, done = std::move(done), step = req.step(), epoch = req.epoch()](
          absl::StatusOr<std::variant<StepPlan, StepCoordinator::SharedResolution>> got) {
        if (!got.ok()) return done(ToGrpcStatus(got.status()));
        if (auto* plan = std::get_if<StepPlan>(&*got)) {
          PlanToProto(*plan, out);
        } else {
          out->set_step(step);
          out->set_epoch(epoch);
          StepResolutionToProto(*std::get<StepCoordinator::SharedResolution>(*got),
                                out->mutable_resolution(), /*short_form=*/true);
        }
        done(grpc::Status::OK);
      });
}

void WorkersService::ServeFinish(const grpc::ServerContextBase& ctx,
                                 const v1::FinishStepRequest& req, v1::StepResolution* out,
                                 Done done) {
  if (grpc::Status s = CheckCallerIsTask(ctx, TaskKey{req.job(), req.task()}); !s.ok()) {
    return done(s);
  }
  absl::StatusOr<WorkerFinish> finish = FinishFromProto(req);
  if (!finish.ok()) return done(ToGrpcStatus(finish.status()));
  if (absl::Status s = core_->FinishStep(*finish); !s.ok()) return done(ToGrpcStatus(s));
  core_->WhenStepResolved(req.epoch(), [out, done = std::move(done)](
                                           absl::StatusOr<StepCoordinator::SharedResolution> r) {
    if (!r.ok()) return done(ToGrpcStatus(r.status()));
    StepResolutionToProto(**r, out, /*short_form=*/true);
    done(grpc::Status::OK);
  });
}

grpc::Status WorkersService::GetStep(grpc::ServerContext* ctx, const v1::GetStepRequest* req,
                                     v1::StepInfo* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  grpc::Status status;
  ServeGetStep(*req, resp, [&status](grpc::Status s) { status = std::move(s); });
  return status;
}

grpc::ServerUnaryReactor* WorkersService::ReportStep(grpc::CallbackServerContext* ctx,
                                                     const v1::ReportStepRequest* req,
                                                     v1::StepPlan* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  ServeReport(*ctx, *req, resp, [reactor](grpc::Status s) { reactor->Finish(std::move(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* WorkersService::FinishStep(grpc::CallbackServerContext* ctx,
                                                     const v1::FinishStepRequest* req,
                                                     v1::StepResolution* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  ServeFinish(*ctx, *req, resp, [reactor](grpc::Status s) { reactor->Finish(std::move(s)); });
  return reactor;
}

// One worker's StepStream. Requests are read one at a time and handed to
// the Serve* methods; answers are written in the order they become ready,
// one write in flight at a time (all the callback API allows).
//
//   open ---(a read fails: the worker ended the stream, or it was cancelled)--> draining
//   draining ---(every answer written, or the stream broke)--> Finish() --> OnDone: deleted
//
// A report's answer may come after the stream ended, from the thread that
// resolves the barrier: answers reach the reactor through its `Outbox`
// (shared with every answer still owed), which holds the stream's state
// and whose pointer to the reactor OnDone clears.
class WorkersService::StepStreamReactor final
    : public grpc::ServerBidiReactor<v1::StepStreamRequest, v1::StepStreamResponse> {
 public:
  StepStreamReactor(WorkersService* service, grpc::CallbackServerContext* ctx)
      : service_(service),
        ctx_(ctx),
        request_id_(RequestIdOf(*ctx)),
        outbox_(std::make_shared<Outbox>()) {
    {
      absl::MutexLock lock(&outbox_->mu);
      outbox_->reactor = this;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish = false;
      {
        absl::MutexLock lock(&outbox_->mu);
        outbox_->reads_done = true;
        finish = outbox_->ShouldFinishLocked();
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    Serve(request_);
    StartRead(&request_);  // the next call; request_ is free again
  }

  void OnWriteDone(bool ok) override {
    v1::StepStreamResponse* next = nullptr;
    bool finish = false;
    {
      Outbox& o = *outbox_;
      absl::MutexLock lock(&o.mu);
      o.sending.pop_front();
      if (!ok) {
        o.broken = true;  // the stream is going away: nothing more is sent
        o.sending.clear();
      }
      if (o.sending.empty()) {
        o.writing = false;
        finish = o.ShouldFinishLocked();
      } else {
        next = &o.sending.front();  // a deque keeps it where it is
      }
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(grpc::Status::OK);
  }

  // The worker went away or the server is shutting down: answers still
  // owed are not waited for.
  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&outbox_->mu);
      outbox_->broken = true;
      finish = outbox_->ShouldFinishLocked();
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&outbox_->mu);
      outbox_->reactor = nullptr;  // answers still to come are dropped
    }
    delete this;
  }

 private:
  struct Outbox {
    // Whether to end the call now (then the caller calls Finish() once the
    // lock is released, and touches the reactor no more): the worker
    // stopped sending and nothing is left to send -- every answer owed was
    // written, or the stream broke. True once.
    bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (finished || !reads_done || writing || (owed > 0 && !broken)) return false;
      finished = true;
      return true;
    }

    absl::Mutex mu;
    StepStreamReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;        // null once done
    std::deque<v1::StepStreamResponse> sending ABSL_GUARDED_BY(mu);  // front: in flight
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool reads_done ABSL_GUARDED_BY(mu) = false;
    bool broken ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    int64_t owed ABSL_GUARDED_BY(mu) = 0;  // calls read whose answers were not queued yet
  };

  // Hands the call to its Serve* method; its answer is queued when done.
  void Serve(const v1::StepStreamRequest& req) {
    const ScopedRequestId scoped(request_id_);  // the stream's, as a unary call's
    {
      absl::MutexLock lock(&outbox_->mu);
      ++outbox_->owed;
    }
    auto answer = std::make_shared<v1::StepStreamResponse>();
    answer->set_tag(req.tag());
    Done done = [outbox = outbox_, answer](grpc::Status s) {
      if (!s.ok()) {
        answer->clear_answer();
        answer->set_code(s.error_code());
        answer->set_message(s.error_message());
      }
      Post(*outbox, std::move(*answer));
    };
    switch (req.call_case()) {
      case v1::StepStreamRequest::kGetStep:
        return service_->ServeGetStep(req.get_step(), answer->mutable_step(), done);
      case v1::StepStreamRequest::kReport:
        return service_->ServeReport(*ctx_, req.report(), answer->mutable_plan(), std::move(done));
      case v1::StepStreamRequest::kFinish:
        return service_->ServeFinish(*ctx_, req.finish(), answer->mutable_resolution(),
                                     std::move(done));
      case v1::StepStreamRequest::CALL_NOT_SET:
        break;
    }
    done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a StepStream message without a call"));
  }

  // Queues `answer` on the stream (if it is still there) and starts its
  // write unless one is in flight. Called on any thread.
  static void Post(Outbox& o, v1::StepStreamResponse answer) {
    v1::StepStreamResponse* first = nullptr;
    StepStreamReactor* r = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&o.mu);
      r = o.reactor;
      if (r == nullptr) return;  // the stream ended before this answer
      --o.owed;
      if (o.broken) {
        finish = o.ShouldFinishLocked();
      } else {
        o.sending.push_back(std::move(answer));
        if (!o.writing) {
          o.writing = true;
          first = &o.sending.front();
        }
      }
    }
    // `r` cannot be deleted meanwhile: only once Finish() is called, which
    // nobody else does now (`finished` is set, or a write is in flight).
    if (first != nullptr) r->StartWrite(first);
    if (finish) r->Finish(grpc::Status::OK);
  }

  WorkersService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const std::string request_id_;  // what the lines logged while serving carry
  const std::shared_ptr<Outbox> outbox_;
  v1::StepStreamRequest request_;  // the read in flight
};

grpc::ServerBidiReactor<v1::StepStreamRequest, v1::StepStreamResponse>* WorkersService::StepStream(
    grpc::CallbackServerContext* ctx) {
  return new StepStreamReactor(this, ctx);
}

grpc::Status WorkersService::WaitStep(grpc::ServerContext* ctx, const v1::WaitStepRequest* req,
                                      v1::StepResolution* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  const absl::Time deadline =
      PollDeadline(ctx, absl::Milliseconds(std::max<int64_t>(0, req->timeout_ms())));
  // The core answers once, maybe after this call has ended: the answer's
  // slot is shared with the callback.
  struct Slot {
    absl::Mutex mu;
    bool answered ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<StepCoordinator::SharedResolution> answer ABSL_GUARDED_BY(mu);
  };
  auto slot = std::make_shared<Slot>();
  core_->WhenStepResolved(req->epoch(),
                          [slot](absl::StatusOr<StepCoordinator::SharedResolution> r) {
                            absl::MutexLock lock(&slot->mu);
                            slot->answer = std::move(r);
                            slot->answered = true;
                          });
  absl::MutexLock lock(&slot->mu);
  // In slices: a cancelled call or a shutdown ends the wait.
  while (!slot->answered && !ctx->IsCancelled() && !shutting_down_ && absl::Now() < deadline) {
    slot->mu.AwaitWithDeadline(absl::Condition(&slot->answered),
                               std::min(absl::Now() + kPollSlice, deadline));
  }
  if (!slot->answered) {
    if (absl::Now() >= deadline) {
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("the step of epoch ", req->epoch(), " has not resolved yet"));
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "the call or the server ended");
  }
  if (!slot->answer.ok()) return ToGrpcStatus(slot->answer.status());
  StepResolutionToProto(**slot->answer, resp, /*short_form=*/!req->whole());
  return grpc::Status::OK;
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

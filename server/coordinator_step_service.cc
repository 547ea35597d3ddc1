// SPDX-License-Identifier: Apache-2.0
// The step RPCs of CoordinatorService: conversions and long polls over the
// core's BeginStep / ReportStep / FinishStep / Wait* calls.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/convert.h"
#include "common/rpc/grpc_status.h"
#include "server/coordinator_service.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

// Long polls wake this often to notice a cancelled call or a shutdown.
constexpr absl::Duration kPollSlice = absl::Milliseconds(500);

int64_t UnixMillis(absl::Time t) { return absl::ToUnixMillis(t); }

WorkerReport ReportFromProto(const v1::ReportStepRequest& req) {
  WorkerReport r;
  r.step = req.step();
  r.epoch = req.epoch();
  r.task = TaskKey{req.job(), req.task()};
  r.incarnation = req.incarnation();
  for (const v1::ReplicaReport& rr : req.replicas()) {
    r.replicas.push_back(
        ReplicaReport{rr.variable_id(), rr.replica(), rr.checksum(), rr.first_nonfinite()});
  }
  return r;
}

WorkerFinish FinishFromProto(const v1::FinishStepRequest& req) {
  WorkerFinish f;
  f.step = req.step();
  f.epoch = req.epoch();
  f.task = TaskKey{req.job(), req.task()};
  f.incarnation = req.incarnation();
  f.error = req.error();
  for (const v1::PreparedVariable& p : req.variables()) {
    f.variables.push_back(PreparedVariable{p.variable_id(), p.checksum(), p.first_nonfinite(),
                                           p.has_nonfinite_replica() ? p.nonfinite_replica() : -1});
  }
  return f;
}

void PlanToProto(const StepPlan& plan, const TaskKey& me, v1::StepPlan* proto) {
  proto->set_step(plan.step);
  proto->set_epoch(plan.epoch);
  proto->set_group(plan.group);
  for (size_t i = 0; i < plan.members.size(); ++i) {
    if (plan.members[i] == me) proto->set_rank(static_cast<int32_t>(i));
  }
  proto->set_size(static_cast<int32_t>(plan.members.size()));
  proto->set_timeout_ms(absl::ToInt64Milliseconds(plan.timeout));
  for (const StepCollective& c : plan.collectives) {
    v1::StepCollective* pc = proto->add_collectives();
    pc->set_kind(c.kind == StepCollective::Kind::kAllreduce ? v1::StepCollective::ALLREDUCE
                                                            : v1::StepCollective::BROADCAST);
    pc->set_tag(c.tag);
    for (uint64_t id : c.variable_ids) pc->add_variable_ids(id);
    pc->set_root(c.root);
    pc->set_source_replica(c.source_replica);
    pc->set_checksum(c.checksum);
    for (int32_t t : c.targets) pc->add_targets(t);
  }
  for (uint64_t id : plan.changed_ids) proto->add_changed_ids(id);
  for (uint64_t c : plan.changed_checksums) proto->add_changed_checksums(c);
}

v1::StepEvent EventToProto(const StepEvent& e) {
  v1::StepEvent p;
  p.set_seq(e.seq);
  p.set_kind(static_cast<v1::StepEvent::Kind>(e.kind));
  p.set_step(e.step);
  p.set_epoch(e.epoch);
  p.set_job(e.task.job);
  p.set_task(e.task.task);
  for (const std::string& m : e.missing) p.add_missing(m);
  if (e.resolution) StepResolutionToProto(*e.resolution, p.mutable_resolution());
  p.set_at_unix_ms(UnixMillis(e.at));
  return p;
}

// How long a long poll may wait: the call's deadline, capped.
absl::Time PollDeadline(grpc::ServerContext* ctx, absl::Duration cap) {
  absl::Time deadline = absl::Now() + cap;
  return std::min(deadline, absl::FromChrono(ctx->deadline()));
}

}  // namespace

void StepInfoToProto(const StepInfo& info, v1::StepInfo* proto) {
  proto->set_step(info.step);
  proto->set_epoch(info.epoch);
  proto->set_state(static_cast<v1::StepState>(info.state));
  proto->set_barrier_timeout_ms(absl::ToInt64Milliseconds(info.barrier_timeout));
  proto->set_begun_unix_ms(UnixMillis(info.begun));
  proto->set_layout_id(info.layout_id);
  for (const StepParticipant& p : info.participants) {
    v1::StepParticipant* pp = proto->add_participants();
    pp->set_job(p.task.job);
    pp->set_task(p.task.task);
    pp->set_incarnation(p.incarnation);
    pp->set_address(p.address);
  }
  for (const StepVariable& v : info.variables) {
    v1::StepVariable* pv = proto->add_variables();
    pv->set_id(v.id);
    pv->set_name(v.name);
    pv->set_aggregation(static_cast<v1::Aggregation>(v.aggregation));
    SpecToProto(v.spec, pv->mutable_spec());
    for (int32_t p : v.replica_participant) pv->add_replica_participant(p);
    pv->set_allow_nonfinite(v.allow_nonfinite);
  }
}

void StepResolutionToProto(const StepResolution& r, v1::StepResolution* proto) {
  proto->set_step(r.step);
  proto->set_epoch(r.epoch);
  proto->set_state(static_cast<v1::StepState>(r.state));
  proto->set_code(static_cast<int32_t>(r.status.code()));
  proto->set_message(std::string(r.status.message()));
  for (const auto& [task, latency] : r.latencies) {
    v1::WorkerStepLatency* l = proto->add_latencies();
    l->set_job(task.job);
    l->set_task(task.task);
    l->set_report_ms(absl::ToInt64Milliseconds(latency));
  }
  for (const Divergence& d : r.divergences) {
    v1::Divergence* pd = proto->add_divergences();
    pd->set_variable_id(d.variable_id);
    pd->set_name(d.name);
    for (uint64_t c : d.replica_checksums) pd->add_replica_checksums(c);
    pd->set_chosen_checksum(d.chosen_checksum);
    for (int32_t i : d.repaired) pd->add_repaired(i);
  }
  for (const CommittedVariable& c : r.changed) {
    v1::CommittedVariable* pc = proto->add_changed();
    pc->set_variable_id(c.variable_id);
    pc->set_name(c.name);
    pc->set_version(c.version);
    pc->set_checksum(c.checksum);
  }
}

void CoordinatorService::StepInfoAnswer(const Coordinator::SharedStep& step, uint64_t known_layout,
                                        v1::StepInfo* resp) {
  const StepInfo& info = *step.info;
  if (known_layout != 0 && known_layout == info.layout_id) {
    // The caller holds the layout: the step's header only.
    resp->set_step(info.step);
    resp->set_epoch(info.epoch);
    resp->set_barrier_timeout_ms(absl::ToInt64Milliseconds(info.barrier_timeout));
    resp->set_begun_unix_ms(UnixMillis(info.begun));
    resp->set_layout_id(info.layout_id);
    resp->set_layout_omitted(true);
  } else {
    absl::MutexLock lock(&info_mu_);
    if (info_source_ != step.info) {
      info_proto_.Clear();
      StepInfoToProto(info, &info_proto_);
      info_source_ = step.info;
    }
    *resp = info_proto_;
  }
  resp->set_state(static_cast<v1::StepState>(step.state));
}

grpc::Status CoordinatorService::BeginStep(grpc::ServerContext*, const v1::BeginStepRequest* req,
                                           v1::StepInfo* resp) {
  auto step = core_->BeginStepShared(req->step(), absl::Milliseconds(req->barrier_timeout_ms()));
  if (!step.ok()) return ToGrpcStatus(step.status());
  StepInfoAnswer(*step, req->known_layout(), resp);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetStep(grpc::ServerContext*, const v1::GetStepRequest* req,
                                         v1::StepInfo* resp) {
  auto step = core_->GetStepShared(req->epoch());
  if (!step.ok()) return ToGrpcStatus(step.status());
  StepInfoAnswer(*step, req->known_layout(), resp);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::AbortStep(grpc::ServerContext*, const v1::AbortStepRequest* req,
                                           v1::AbortStepResponse*) {
  return ToGrpcStatus(core_->AbortStep(req->epoch(), req->reason()));
}

grpc::ServerUnaryReactor* CoordinatorService::ReportStep(grpc::CallbackServerContext* ctx,
                                                         const v1::ReportStepRequest* req,
                                                         v1::StepPlan* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  WorkerReport report = ReportFromProto(*req);
  if (absl::Status s = core_->ReportStep(report); !s.ok()) {
    spdlog::debug("ReportStep from {} refused: {}", report.task.ToString(), s.ToString());
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  // Answered when the barrier resolves (the coordinator's ticker fails it at
  // its timeout), from the thread that resolves it.
  core_->WhenStepPlanned(
      req->epoch(), [reactor, resp, task = report.task, step = req->step(), epoch = req->epoch()](
                        absl::StatusOr<std::variant<StepPlan, StepResolution>> got) {
        if (!got.ok()) {
          reactor->Finish(ToGrpcStatus(got.status()));
          return;
        }
        if (auto* plan = std::get_if<StepPlan>(&*got)) {
          PlanToProto(*plan, task, resp);
        } else {
          resp->set_step(step);
          resp->set_epoch(epoch);
          StepResolutionToProto(std::get<StepResolution>(*got), resp->mutable_resolution());
        }
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::FinishStep(grpc::CallbackServerContext* ctx,
                                                         const v1::FinishStepRequest* req,
                                                         v1::StepResolution* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
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

grpc::Status CoordinatorService::AwaitResolution(grpc::ServerContext* ctx, uint64_t epoch,
                                                 absl::Time deadline, v1::StepResolution* resp) {
  while (!ctx->IsCancelled() && !shutting_down_) {
    auto r = core_->WaitStepResolution(epoch, std::min(kPollSlice, deadline - absl::Now()));
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

grpc::Status CoordinatorService::WaitStep(grpc::ServerContext* ctx, const v1::WaitStepRequest* req,
                                          v1::StepResolution* resp) {
  return AwaitResolution(
      ctx, req->epoch(),
      PollDeadline(ctx, absl::Milliseconds(std::max<int64_t>(0, req->timeout_ms()))), resp);
}

grpc::Status CoordinatorService::GetSteps(grpc::ServerContext*, const v1::GetStepsRequest*,
                                          v1::StepsStatus* resp) {
  Coordinator::StepsStatus st = core_->GetSteps();
  if (st.open) StepInfoToProto(*st.open, resp->mutable_open());
  for (const ParticipantProgress& p : st.progress) {
    v1::ParticipantProgress* pp = resp->add_progress();
    pp->set_job(p.task.job);
    pp->set_task(p.task.task);
    pp->set_reported(p.reported);
    pp->set_finished(p.finished);
    pp->set_report_ms(absl::ToInt64Milliseconds(p.report_latency));
    pp->set_last_activity(p.last_activity);
  }
  for (const StepResolution& r : st.recent) StepResolutionToProto(r, resp->add_recent());
  resp->set_last_committed_step(st.last_committed_step);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchSteps(grpc::ServerContext* ctx,
                                            const v1::WatchStepsRequest* req,
                                            grpc::ServerWriter<v1::StepEvent>* writer) {
  int64_t after = req->after_seq();
  while (!ctx->IsCancelled() && !shutting_down_) {
    for (const StepEvent& e : core_->WaitStepEvents(after, kPollSlice)) {
      if (!writer->Write(EventToProto(e))) return grpc::Status::OK;
      after = e.seq;
    }
  }
  return grpc::Status::OK;
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "worker/rpc/grpc_coordinator_link.h"

#include <grpcpp/grpcpp.h>

#include "common/base/status_util.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/to_proto.h"

namespace repvar::worker {
namespace {

// One unary call to the coordinator with a deadline `timeout` from now.
template <typename Resp, typename Req, typename Method>
absl::StatusOr<Resp> Unary(v1::CoordinatorWorkers::Stub* stub, Method method, const Req& req,
                           absl::Duration timeout, bool wait_for_ready = false) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ctx.set_wait_for_ready(wait_for_ready);
  Resp resp;
  REPVAR_RETURN_IF_ERROR(FromGrpcStatus((stub->*method)(&ctx, req, &resp)));
  return resp;
}

}  // namespace

GrpcCoordinatorLink::GrpcCoordinatorLink(const std::string& address,
                                         const ChannelSecurity& security)
    : stub_(v1::CoordinatorWorkers::NewStub(OpenChannel(address, security))), steps_(stub_.get()) {}

absl::StatusOr<absl::Duration> GrpcCoordinatorLink::Register(const WorkerRegistration& reg) {
  v1::RegisterWorkerRequest req;
  req.set_job(reg.job);
  req.set_task(reg.task);
  req.set_address(reg.address);
  req.set_incarnation(reg.incarnation);
  for (const auto& d : reg.devices) req.add_devices(d);
  // Registration may resync this worker's replicas before it answers.
  REPVAR_ASSIGN_OR_RETURN(auto resp, Unary<v1::RegisterWorkerResponse>(
                                         stub_.get(), &v1::CoordinatorWorkers::Stub::RegisterWorker,
                                         req, absl::Minutes(5)));
  return absl::Milliseconds(resp.heartbeat_interval_ms());
}

absl::StatusOr<HeartbeatAnswer> GrpcCoordinatorLink::Heartbeat(const TaskKey& task,
                                                               uint64_t incarnation,
                                                               bool read_lease,
                                                               const std::vector<HeldValue>& held) {
  v1::HeartbeatRequest req;
  req.set_job(task.job);
  req.set_task(task.task);
  req.set_incarnation(incarnation);
  req.set_read_lease(read_lease);
  for (const HeldValue& h : held) {
    v1::HeldValue* p = req.add_held();
    p->set_variable_id(h.variable_id);
    p->set_replica(h.replica);
    p->set_version(h.version);
    p->set_checksum(h.checksum);
  }
  REPVAR_ASSIGN_OR_RETURN(
      auto resp, Unary<v1::HeartbeatResponse>(stub_.get(), &v1::CoordinatorWorkers::Stub::Heartbeat,
                                              req, absl::Seconds(5)));
  HeartbeatAnswer answer;
  answer.read_lease = absl::Milliseconds(resp.read_lease_ms());
  answer.confirmed.assign(resp.confirmed().begin(), resp.confirmed().end());
  return answer;
}

absl::StatusOr<StepInfo> GrpcCoordinatorLink::GetStep(uint64_t epoch, uint64_t known_layout) {
  v1::StepStreamRequest req;
  req.mutable_get_step()->set_epoch(epoch);
  req.mutable_get_step()->set_known_layout(known_layout);
  req.mutable_get_step()->set_shared_lists(true);
  REPVAR_ASSIGN_OR_RETURN(auto resp, steps_.Call(std::move(req), absl::Seconds(30)));
  return StepInfoFromProto(resp.step());
}

absl::StatusOr<std::variant<StepPlan, StepResolution>> GrpcCoordinatorLink::ReportStep(
    const WorkerReport& report, absl::Duration timeout) {
  v1::StepStreamRequest req;
  ReportToProto(report, req.mutable_report());
  REPVAR_ASSIGN_OR_RETURN(auto resp, steps_.Call(std::move(req), timeout));
  return PlanFromProto(resp.plan());
}

void GrpcCoordinatorLink::ReportStepAsync(const WorkerReport& report, absl::Duration timeout,
                                          absl::AnyInvocable<void(ReportAnswer) &&> done) {
  v1::StepStreamRequest req;
  ReportToProto(report, req.mutable_report());
  steps_.CallAsync(std::move(req), timeout,
                   [done = std::move(done)](StepStreamClient::Answer answer) mutable {
                     if (!answer.ok()) {
                       std::move(done)(answer.status());
                       return;
                     }
                     ReportAnswer plan = PlanFromProto(answer->plan());
                     std::move(done)(std::move(plan));
                   });
}

absl::StatusOr<StepResolution> GrpcCoordinatorLink::FinishStep(const WorkerFinish& finish,
                                                               absl::Duration timeout) {
  v1::StepStreamRequest req;
  FinishToProto(finish, req.mutable_finish());
  REPVAR_ASSIGN_OR_RETURN(auto resp, steps_.Call(std::move(req), timeout));
  return ResolutionFromProto(resp.resolution());
}

absl::StatusOr<StepResolution> GrpcCoordinatorLink::WaitStep(uint64_t epoch, absl::Duration timeout,
                                                             bool whole) {
  v1::WaitStepRequest req;
  req.set_epoch(epoch);
  req.set_whole(whole);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  // A coordinator being restarted is waited for: how the step ended is
  // its answer alone (a restarted one knows its last committed step).
  REPVAR_ASSIGN_OR_RETURN(
      auto resp, Unary<v1::StepResolution>(stub_.get(), &v1::CoordinatorWorkers::Stub::WaitStep,
                                           req, timeout + absl::Seconds(5),
                                           /*wait_for_ready=*/true));
  return ResolutionFromProto(resp);
}

absl::Status GrpcCoordinatorLink::Set(const std::string& key, const std::string& value) {
  v1::StoreSetRequest req;
  req.set_key(key);
  req.set_value(value);
  return Unary<v1::StoreSetResponse>(stub_.get(), &v1::CoordinatorWorkers::Stub::StoreSet, req,
                                     absl::Seconds(30))
      .status();
}

absl::StatusOr<std::string> GrpcCoordinatorLink::Get(const std::string& key,
                                                     absl::Duration timeout) {
  v1::StoreGetRequest req;
  req.set_key(key);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  REPVAR_ASSIGN_OR_RETURN(
      auto resp, Unary<v1::StoreGetResponse>(stub_.get(), &v1::CoordinatorWorkers::Stub::StoreGet,
                                             req, timeout + absl::Seconds(5)));
  return std::move(*resp.mutable_value());
}

}  // namespace repvar::worker

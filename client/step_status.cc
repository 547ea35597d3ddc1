// SPDX-License-Identifier: Apache-2.0
// What a trainer or an operator learns about steps without taking part:
// the last committed step, the event stream, the progress of the open step.
#include "client/step_status.h"

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/convert.h"
#include "common/base/status_util.h"
#include "common/rpc/from_proto.h"
#include "repvar/step.h"

namespace repvar {
namespace client_internal {

absl::Status StreamStepEvents(ClientAccess::Impl& c, grpc::ClientContext& ctx, int64_t after_seq,
                              const std::function<bool(const StepEventInfo&)>& fn) {
  v1::WatchStepsRequest req;
  req.set_after_seq(after_seq);
  auto reader = c.stub()->WatchSteps(&ctx, req);
  v1::StepEvent e;
  while (reader->Read(&e)) {
    if (!fn(StepEventFromProto(e))) {
      ctx.TryCancel();
      break;
    }
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (absl::IsDeadlineExceeded(s) || absl::IsCancelled(s)) return absl::OkStatus();
  return s;
}

StepEventWatch::StepEventWatch(ClientAccess::Impl& c, int64_t after_seq,
                               std::function<bool(const StepEventInfo&)> fn)
    : fn_(std::move(fn)) {
  req_.set_after_seq(after_seq);
  c.stub()->async()->WatchSteps(&ctx_, &req_, this);
  StartRead(&event_);
  StartCall();
}

void StepEventWatch::Stop() {
  ctx_.TryCancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
}

void StepEventWatch::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended: OnDone follows
  if (!fn_(StepEventFromProto(event_))) {
    ctx_.TryCancel();
    return;
  }
  StartRead(&event_);
}

void StepEventWatch::OnDone(const grpc::Status&) {
  absl::MutexLock lock(&mu_);
  done_ = true;
}

namespace {

absl::StatusOr<StepsStatus> GetSteps(Client& client) {
  ClientAccess::Impl& c = ClientAccess::Of(client);
  v1::StepsStatus st;
  REPVAR_RETURN_IF_ERROR(c.Retry([&] {
    grpc::ClientContext ctx;
    c.SetDeadline(&ctx);
    return FromGrpcStatus(c.stub()->GetSteps(&ctx, v1::GetStepsRequest(), &st));
  }));
  return StepsStatusFromProto(st);
}

}  // namespace
}  // namespace client_internal

absl::StatusOr<StepsSummary> GetStepsSummary(Client& client) {
  REPVAR_ASSIGN_OR_RETURN(StepsStatus st, client_internal::GetSteps(client));
  return client_internal::StepsSummaryOf(st);
}

absl::StatusOr<int64_t> LastCommittedStep(Client& client) {
  REPVAR_ASSIGN_OR_RETURN(StepsStatus st, client_internal::GetSteps(client));
  return st.last_committed_step;
}

absl::StatusOr<std::vector<std::string>> DescribeSteps(Client& client) {
  REPVAR_ASSIGN_OR_RETURN(StepsStatus st, client_internal::GetSteps(client));
  return client_internal::StepsLines(st);
}

absl::Status WatchSteps(Client& client, int64_t after_seq, absl::Duration timeout,
                        const std::function<bool(const StepEventInfo&)>& fn) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return client_internal::StreamStepEvents(ClientAccess::Of(client), ctx, after_seq, fn);
}

}  // namespace repvar

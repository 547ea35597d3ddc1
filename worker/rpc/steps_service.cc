// SPDX-License-Identifier: Apache-2.0
#include "worker/rpc/steps_service.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_util.h"
#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/to_proto.h"
#include "worker/core/write_sessions.h"
#include "worker/rpc/streams.h"

namespace repvar::worker {

grpc::Status StepsService::StepReadFrames(grpc::ServerContext* ctx, const v1::StepReadRequest& req,
                                          FrameWriter<v1::StepReadRequest>* writer) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto r = steps_->Read(req.epoch(), req.variable_id(), req.replica());
  if (!r.ok()) return ToGrpcStatus(r.status());
  return SendReplica(ctx, *r, req.chunk_bytes(), writer);
}

grpc::Status StepsService::StepReadSmall(grpc::ServerContext* ctx,
                                         const v1::StepReadSmallRequest* req,
                                         v1::StepReadSmallResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  if (static_cast<uint64_t>(req->reads_size()) > kMaxSmallReads) {
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "StepReadSmall: ", req->reads_size(), " reads; at most ", kMaxSmallReads, " a call")));
  }
  auto too_large = [](const v1::StepReadRequest& read, uint64_t size, absl::string_view past) {
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "StepReadSmall: variable id ", read.variable_id(), " replica ", read.replica(), " (", size,
        " bytes) takes the answer past ", past, "; read it with StepRead")));
  };
  uint64_t total = 0;
  resp->mutable_values()->Reserve(req->reads_size());
  for (const v1::StepReadRequest& read : req->reads()) {
    auto r = steps_->Read(read.epoch(), read.variable_id(), read.replica());
    if (!r.ok()) return ToGrpcStatus(r.status());
    const uint64_t size = r->value->bytes.size();
    if (size > kMaxSmallReadBytes) return too_large(read, size, "1 MiB a value");
    v1::StepReadValue* v = resp->add_values();
    v->set_version(r->version);
    TensorToProto(*r->value, v->mutable_value());
    total += v->ByteSizeLong() + kFieldFramingBytes;
    if (total > kMaxSmallReadAnswerBytes) return too_large(read, size, "3 MiB in all");
  }
  return grpc::Status::OK;
}

std::shared_ptr<MemoryBudget> StepsService::Share(const grpc::ServerContext* ctx) {
  return budget_ == nullptr ? nullptr : connections_.For(ctx->peer());
}

grpc::Status StepsService::StepWriteFrames(grpc::ServerContext* ctx, FrameReader* reader,
                                           v1::StepWriteResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  const std::shared_ptr<MemoryBudget> share = Share(ctx);
  StepWriteSession session(steps_, share.get());
  if (absl::Status s = Drain<v1::StepWriteRequest>(session, reader); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(session.Finish());
}

grpc::Status StepsService::StepWriteSmall(grpc::ServerContext* ctx,
                                          const v1::StepWriteSmallRequest* req,
                                          v1::StepWriteResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  const std::shared_ptr<MemoryBudget> share = Share(ctx);
  StepWriteSession session(steps_, share.get());
  for (const v1::StepWriteHeader& h : req->writes()) {
    if (!WholeInline(h.tensor(), h.inline_data())) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("StepWriteSmall: variable id ", h.variable_id(), " replica ", h.replica(),
                       " fails its size or checksum (whole tensors travel inline)")));
    }
    if (absl::Status s = OnHeader(session, h); !s.ok()) return ToGrpcStatus(s);
  }
  return ToGrpcStatus(session.Finish());
}

grpc::ServerUnaryReactor* StepsService::CommitStep(grpc::CallbackServerContext* ctx,
                                                   const v1::CommitStepRequest* req,
                                                   v1::StepResolution* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  steps_->Hint(req->step(), req->epoch(), req->layout_id(),
               absl::Milliseconds(req->barrier_timeout_ms()));
  std::vector<std::string> devices(req->devices().begin(), req->devices().end());
  absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (req->timeout_ms() > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Milliseconds(req->timeout_ms()));
  }
  steps_->CommitAsync(req->step(), req->epoch(), std::move(devices), deadline,
                      [reactor, resp](absl::StatusOr<StepResolution> r) {
                        if (!r.ok()) {
                          reactor->Finish(ToGrpcStatus(r.status()));
                          return;
                        }
                        StepResolutionToProto(*r, resp);
                        reactor->Finish(grpc::Status::OK);
                      });
  return reactor;
}

grpc::Status StepsService::DiscardStep(grpc::ServerContext* ctx, const v1::DiscardStepRequest* req,
                                       v1::DiscardStepResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  steps_->Discard(req->epoch());
  return grpc::Status::OK;
}

grpc::Status StepsService::MapLocalReads(grpc::ServerContext* ctx, const v1::MapLocalReadsRequest*,
                                         v1::MapLocalReadsResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  if (local_reads_fd_ < 0) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this worker keeps no local read table (--local_read_bytes=0)");
  }
  resp->set_pid(static_cast<int32_t>(getpid()));
  resp->set_fd(local_reads_fd_);
  resp->set_byte_size(local_reads_bytes_);
  return grpc::Status::OK;
}

grpc::Status StepsService::StepMap(grpc::ServerContext* ctx, const v1::StepMapRequest* req,
                                   v1::StepMapResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  steps_->Hint(req->step(), req->epoch(), req->layout_id(),
               absl::Milliseconds(req->barrier_timeout_ms()));
  auto lease = steps_->Map(req->step(), req->epoch(), req->variable_id(), req->replica(),
                           req->write(), req->initialize());
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  resp->set_lease(lease->id);
  resp->set_pid(static_cast<int32_t>(getpid()));
  resp->set_fd(lease->fd);
  resp->set_byte_size(lease->byte_size);
  resp->set_checksum(lease->checksum);
  resp->set_version(lease->version);
  return grpc::Status::OK;
}

grpc::Status StepsService::StepUnmap(grpc::ServerContext* ctx, const v1::StepUnmapRequest* req,
                                     v1::StepUnmapResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto checksum =
      steps_->Unmap(req->lease(), req->publish(),
                    req->has_checksum() ? std::optional<uint64_t>(req->checksum()) : std::nullopt,
                    req->hash_later());
  if (!checksum.ok()) return ToGrpcStatus(checksum.status());
  resp->set_checksum(*checksum);
  return grpc::Status::OK;
}

}  // namespace repvar::worker

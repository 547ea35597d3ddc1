// SPDX-License-Identifier: Apache-2.0
#include "worker/rpc/replicas_service.h"

#include <grpcpp/grpcpp.h>

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
namespace {

grpc::Status Answer(absl::StatusOr<uint64_t> checksum, v1::WriteReplicasResponse* resp) {
  if (!checksum.ok()) return ToGrpcStatus(checksum.status());
  if (*checksum != 0) resp->set_checksum(*checksum);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ReplicasService::WriteReplicasFrames(grpc::ServerContext* ctx, FrameReader* reader,
                                                  v1::WriteReplicasResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  ReplicaWriteSession session(incarnation_, store_, data_plane_, budget_, &root_broadcasts_);
  if (absl::Status s = Drain<v1::WriteReplicasRequest>(session, reader); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return Answer(session.Finish(), resp);
}

grpc::ServerUnaryReactor* ReplicasService::WriteSmallReplicas(
    grpc::CallbackServerContext* ctx, const v1::WriteSmallReplicasRequest* req,
    v1::WriteReplicasResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish([&]() -> grpc::Status {
    absl::StatusOr<SmallReplicaWrites> writes = SmallWritesFromProto(*req);
    if (!writes.ok()) return ToGrpcStatus(writes.status());
    return Answer(ApplySmallWrites(incarnation_, *std::move(writes), store_, budget_), resp);
  }());
  return reactor;
}

grpc::Status ReplicasService::ReadReplicaFrames(grpc::ServerContext* ctx,
                                                const v1::ReadReplicaRequest& req,
                                                FrameWriter<v1::ReadReplicaRequest>* writer) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  // A step's new value may be a moment from installed: wait for it, but give
  // up early enough that "not yet" reaches the caller before its deadline
  // does (at most a second, at most half the time left), and never longer
  // than 10 s (a lost step must not hold a thread long).
  const absl::Time now = absl::Now();
  const absl::Duration left = absl::FromChrono(ctx->deadline()) - now;
  const absl::Duration margin = std::min(left / 2, absl::Seconds(1));
  const absl::Time deadline = now + std::min(left - margin, absl::Seconds(10));
  auto r = store_->WaitFor(req.variable_id(), req.replica(), req.min_version(), deadline);
  if (!r.ok()) return ToGrpcStatus(r.status());
  return SendReplica(ctx, *r, req.chunk_bytes(), writer);
}

grpc::Status ReplicasService::DropVariable(grpc::ServerContext* ctx,
                                           const v1::DropVariableRequest* req,
                                           v1::DropVariableResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  if (req->incarnation() != incarnation_) {
    return ToGrpcStatus(absl::AbortedError("drop meant for another incarnation"));
  }
  store_->Drop(req->variable_id());
  return grpc::Status::OK;
}

grpc::Status ReplicasService::GetReplicaStatus(grpc::ServerContext* ctx,
                                               const v1::GetReplicaStatusRequest* req,
                                               v1::GetReplicaStatusResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  if (req->fence_floor() != 0 && req->incarnation() != incarnation_) {
    return ToGrpcStatus(absl::AbortedError(absl::StrCat(
        "fence meant for incarnation ", req->incarnation(), "; this worker is ", incarnation_)));
  }
  resp->set_incarnation(incarnation_);
  for (const StoredReplica& r : store_->FenceAndList(req->fence_floor())) {
    v1::LocalReplica* p = resp->add_replicas();
    p->set_variable_id(r.variable_id);
    p->set_name(r.name);
    p->set_replica(r.replica);
    p->set_version(r.version);
    p->set_checksum(r.checksum);
    p->set_byte_size(r.value->bytes.size());
  }
  return grpc::Status::OK;
}

}  // namespace repvar::worker

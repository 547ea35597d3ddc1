// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/admin_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_util.h"
#include "common/model/names.h"
#include "common/rpc/chunks.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/to_proto.h"
#include "server/rpc/cluster_status.h"
#include "spdlog/spdlog.h"

namespace repvar::server {

grpc::Status AdminService::DeleteVariable(grpc::ServerContext* ctx,
                                          const v1::DeleteVariableRequest* req,
                                          v1::DeleteVariableResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  if (absl::Status s = ValidateRequestId(req->request_id()); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(
      core_->DeleteVariable(RequestKey{req->request_id(), Digest(*req)}, req->name()));
}

grpc::Status AdminService::GetClusterStatus(grpc::ServerContext* ctx,
                                            const v1::GetClusterStatusRequest* req,
                                            v1::ClusterStatus* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  if (req->max_variables() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "max_variables must be >= 0");
  }
  ClusterStatusToProto(core_, scalars_, static_cast<size_t>(req->max_variables()), resp);
  return grpc::Status::OK;
}

grpc::Status AdminService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                                 v1::DrainResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  core_->SetDraining(!req->resume());
  if (on_drain_) on_drain_(core_->draining());
  spdlog::warn("{}", core_->draining() ? "draining: new changes are refused until resumed"
                                       : "resumed: serving changes again");
  const StepsStatus steps = core_->GetSteps();
  resp->set_draining(core_->draining());
  resp->set_open_step(steps.open ? steps.open->step : 0);
  return grpc::Status::OK;
}

grpc::Status AdminService::SaveCheckpoint(grpc::ServerContext* ctx,
                                          const v1::SaveCheckpointRequest* req,
                                          grpc::ServerWriter<v1::SaveCheckpointResponse>* writer) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto chunk_bytes = RequestedChunkBytes(req->chunk_bytes());
  if (!chunk_bytes.ok()) return ToGrpcStatus(chunk_bytes.status());
  // An open step is waited for at most this long (or the call's deadline).
  constexpr absl::Duration kMaxWaitForStep = absl::Minutes(10);
  const absl::Time wait_until =
      std::min(absl::FromChrono(ctx->deadline()), absl::Now() + kMaxWaitForStep);
  auto cut = core_->TakeCut(wait_until);
  if (!cut.ok()) {
    return ToGrpcStatus(absl::Status(cut.status().code(),
                                     absl::StrCat("no consistent cut: ", cut.status().message())));
  }
  // Until the return nothing writes: the manifest and the bytes are one cut.
  v1::SaveCheckpointResponse head;
  v1::CheckpointManifest* manifest = head.mutable_manifest();
  manifest->set_last_committed_step(cut->last_committed_step);
  for (const VariableView& v : cut->variables) VariableViewToProto(v, manifest->add_variables());
  for (const std::string& name : cut->uninitialized) manifest->add_uninitialized(name);
  if (!writer->Write(head)) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  for (const VariableView& v : cut->variables) {
    auto read = core_->ReadInCut(v);
    if (!read.ok()) return ToGrpcStatus(read.status());
    const bool sent = SendChunks<v1::SaveCheckpointResponse>(
        read->value->bytes.span(), *chunk_bytes,
        [&](const v1::SaveCheckpointResponse& m) {
          return !ctx->IsCancelled() && writer->Write(m);
        },
        [](v1::SaveCheckpointResponse& m) { return m.mutable_chunk(); });
    if (!sent) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  }
  return grpc::Status::OK;
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/grpc_worker_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/rpc/channel.h"
#include "common/rpc/chunks.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/replica_stream.h"
#include "common/rpc/to_proto.h"

namespace repvar::server {
namespace {
constexpr size_t kMaxInlineBytes = 64 << 10;  // see WriteReplicasHeader.inline_data
constexpr uint64_t kMaxUnaryBytes = 8 << 20;  // one WriteSmallReplicas message at most
}  // namespace

v1::WorkerReplicas::Stub* GrpcWorkerClient::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = v1::WorkerReplicas::NewStub(OpenChannel(address));
  return stub.get();
}

namespace {

// The header of one write; sets inline_data when the bytes ride in it.
// Returns whether chunks must follow.
bool FillHeader(const WorkerTarget& target, const ReplicaWrite& w, v1::WriteReplicasHeader* h) {
  h->set_incarnation(target.incarnation);
  h->set_variable_id(w.variable_id);
  h->set_name(w.name);
  h->set_version(w.version);
  h->mutable_replicas()->Assign(w.replicas.begin(), w.replicas.end());
  HeaderToProto(*w.value, h->mutable_tensor());
  if (w.collective) {
    CollectiveToProto(*w.collective, h->mutable_collective());
    if (w.collective->rank != w.collective->root) return false;  // bytes come over gloo
  }
  if (w.value->bytes.size() <= kMaxInlineBytes) {
    h->set_inline_data(reinterpret_cast<const char*>(w.value->bytes.data()), w.value->bytes.size());
    return false;
  }
  return true;
}

absl::Status Named(const WorkerTarget& target, absl::Status s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("worker ", target.task.ToString(), " at ",
                                             target.address, ": ", s.message()));
}

}  // namespace

absl::Status GrpcWorkerClient::WriteReplicas(const WorkerTarget& target,
                                             std::span<const ReplicaWrite> writes) {
  uint64_t bytes = 0;
  bool all_small = true;
  for (const ReplicaWrite& w : writes) {
    bytes += w.value->bytes.size();
    all_small &= !w.collective && w.value->bytes.size() <= kMaxInlineBytes;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(
      absl::Now() + options_.base_deadline +
      absl::Seconds(static_cast<double>(bytes) / options_.min_bytes_per_second)));
  v1::WriteReplicasResponse resp;
  if (all_small && bytes <= kMaxUnaryBytes) {
    // One message, one unary call: far cheaper than a stream for small writes.
    v1::WriteSmallReplicasRequest req;
    for (const ReplicaWrite& w : writes) FillHeader(target, w, req.add_writes());
    return Named(target,
                 FromGrpcStatus(StubFor(target.address)->WriteSmallReplicas(&ctx, req, &resp)));
  }
  auto stream = StubFor(target.address)->WriteReplicas(&ctx, &resp);
  bool ok = true;
  for (const ReplicaWrite& w : writes) {
    v1::WriteReplicasRequest header;
    bool chunks = FillHeader(target, w, header.mutable_header());
    ok = stream->Write(header);
    if (!chunks) continue;
    ForEachChunk(w.value->bytes.span(), options_.chunk_bytes,
                 [&](uint64_t off, std::span<const std::byte> piece) {
                   if (!ok) return;
                   v1::WriteReplicasRequest m;
                   ChunkToProto(off, piece, m.mutable_chunk());
                   ok = stream->Write(m);
                 });
    if (!ok) break;
  }
  stream->WritesDone();
  return Named(target, FromGrpcStatus(stream->Finish()));
}

absl::StatusOr<WorkerClient::ReplicaValue> GrpcWorkerClient::ReadReplica(const WorkerTarget& target,
                                                                         uint64_t variable_id,
                                                                         int32_t replica) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.base_deadline));
  v1::ReadReplicaRequest req;
  req.set_variable_id(variable_id);
  req.set_replica(replica);
  req.set_chunk_bytes(static_cast<int64_t>(options_.chunk_bytes));
  auto reader = StubFor(target.address)->ReadReplica(&ctx, req);
  REPVAR_ASSIGN_OR_RETURN(ReceivedReplica got, ReceiveReplica(ctx, *reader));
  return ReplicaValue{got.version, std::make_shared<const Tensor>(std::move(got.value))};
}

absl::Status GrpcWorkerClient::DropVariable(const WorkerTarget& target, uint64_t variable_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.base_deadline));
  v1::DropVariableRequest req;
  req.set_incarnation(target.incarnation);
  req.set_variable_id(variable_id);
  v1::DropVariableResponse resp;
  return FromGrpcStatus(StubFor(target.address)->DropVariable(&ctx, req, &resp));
}

}  // namespace repvar::server

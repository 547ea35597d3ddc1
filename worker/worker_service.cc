// SPDX-License-Identifier: Apache-2.0
#include "worker/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/proto_convert.h"

namespace repvar::worker {
grpc::Status WorkerService::WriteReplicas(grpc::ServerContext*,
                                          grpc::ServerReader<v1::WriteReplicasRequest>* reader,
                                          v1::WriteReplicasResponse* resp) {
  // A stream carries one or more (header, chunks...) groups; all are applied
  // together at the end, or none.
  std::vector<ReplicaWriteItem> items;
  std::optional<ChunkAssembler> assembler;
  ReplicaWriteItem current;
  auto finish_current = [&]() -> absl::Status {
    if (!assembler) return absl::OkStatus();
    auto t = assembler->Finish();
    assembler.reset();
    if (!t.ok()) return t.status();
    current.value = std::make_shared<const Tensor>(*std::move(t));
    items.push_back(std::move(current));
    current = ReplicaWriteItem();
    return absl::OkStatus();
  };
  v1::WriteReplicasRequest msg;
  while (reader->Read(&msg)) {
    if (msg.has_header()) {
      absl::Status s = finish_current();
      if (!s.ok()) return ToGrpcStatus(s);
      const v1::WriteReplicasHeader& h = msg.header();
      if (h.incarnation() != incarnation_) {
        return ToGrpcStatus(absl::AbortedError(absl::StrCat(
            "write meant for incarnation ", h.incarnation(), "; this worker is ", incarnation_)));
      }
      auto spec = SpecFromProto(h.tensor().spec());
      if (!spec.ok()) return ToGrpcStatus(spec.status());
      auto a =
          ChunkAssembler::Start(*spec, h.tensor().byte_size(), h.tensor().checksum(), UINT64_MAX);
      if (!a.ok()) return ToGrpcStatus(a.status());
      assembler.emplace(*std::move(a));
      current.variable_id = h.variable_id();
      current.name = h.name();
      current.version = h.version();
      current.replicas.assign(h.replicas().begin(), h.replicas().end());
    } else if (msg.has_chunk()) {
      if (!assembler) {
        return ToGrpcStatus(absl::InvalidArgumentError("chunk before any header"));
      }
      absl::Status s = AddChunk(*assembler, msg.chunk());
      if (!s.ok()) return ToGrpcStatus(s);
    }
  }
  absl::Status s = finish_current();
  if (!s.ok()) return ToGrpcStatus(s);
  if (!items.empty()) resp->set_checksum(items.back().value->checksum);
  store_->Apply(std::move(items));
  return grpc::Status::OK;
}

grpc::Status WorkerService::ReadReplica(grpc::ServerContext* ctx, const v1::ReadReplicaRequest* req,
                                        grpc::ServerWriter<v1::ReadVariableChunk>* writer) {
  auto r = store_->Get(req->variable_id(), req->replica());
  if (!r.ok()) return ToGrpcStatus(r.status());
  v1::ReadVariableChunk head;
  HeaderToProto(*r->value, head.mutable_header());
  head.set_version(r->version);
  if (!writer->Write(head)) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  bool ok = true;
  ForEachChunk(r->value->bytes.span(), static_cast<size_t>(req->chunk_bytes()),
               [&](uint64_t off, std::span<const std::byte> piece) {
                 if (!ok || ctx->IsCancelled()) {
                   ok = false;
                   return;
                 }
                 v1::ReadVariableChunk m;
                 ChunkToProto(off, piece, m.mutable_chunk());
                 ok = writer->Write(m);
               });
  if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  return grpc::Status::OK;
}

grpc::Status WorkerService::DropVariable(grpc::ServerContext*, const v1::DropVariableRequest* req,
                                         v1::DropVariableResponse*) {
  if (req->incarnation() != incarnation_) {
    return ToGrpcStatus(absl::AbortedError("drop meant for another incarnation"));
  }
  store_->Drop(req->variable_id());
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetReplicaStatus(grpc::ServerContext*,
                                             const v1::GetReplicaStatusRequest*,
                                             v1::GetReplicaStatusResponse* resp) {
  resp->set_incarnation(incarnation_);
  for (const StoredReplica& r : store_->List()) {
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

GrpcCoordinatorLink::GrpcCoordinatorLink(const std::string& address)
    : stub_(v1::Coordinator::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

absl::StatusOr<absl::Duration> GrpcCoordinatorLink::Register(const Registration& reg) {
  grpc::ClientContext ctx;
  // Registration may resync this worker's replicas before it answers.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
  v1::RegisterWorkerRequest req;
  req.set_job(reg.job);
  req.set_task(reg.task);
  req.set_address(reg.address);
  req.set_incarnation(reg.incarnation);
  for (const auto& d : reg.devices) req.add_devices(d);
  v1::RegisterWorkerResponse resp;
  absl::Status s = FromGrpcStatus(stub_->RegisterWorker(&ctx, req, &resp));
  if (!s.ok()) return s;
  return absl::Milliseconds(resp.heartbeat_interval_ms());
}

absl::Status GrpcCoordinatorLink::Heartbeat(const std::string& job, int32_t task,
                                            uint64_t incarnation) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HeartbeatRequest req;
  req.set_job(job);
  req.set_task(task);
  req.set_incarnation(incarnation);
  v1::HeartbeatResponse resp;
  return FromGrpcStatus(stub_->Heartbeat(&ctx, req, &resp));
}

}  // namespace repvar::worker

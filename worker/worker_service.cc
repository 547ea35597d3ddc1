// SPDX-License-Identifier: Apache-2.0
#include "worker/worker_service.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/rpc/convert.h"
#include "common/rpc/grpc_status.h"

namespace repvar::worker {
namespace {

// Rebuilds the writes of one WriteReplicas exchange: a sequence of headers,
// each followed by its chunks, or carrying its bytes inline, or naming a
// collective. Nothing is applied until Finish() has every tensor verified.
// A header with a collective is delivered by the data plane: the root got
// the bytes here and sends them on, the other members receive them from the
// root.
class WriteSession {
 public:
  WriteSession(uint64_t incarnation, GlooDataPlane* data_plane)
      : incarnation_(incarnation), data_plane_(data_plane) {}

  absl::Status OnHeader(const v1::WriteReplicasHeader& h) {
    REPVAR_RETURN_IF_ERROR(FinishCurrent());
    if (h.incarnation() != incarnation_) {
      return absl::AbortedError(absl::StrCat("write meant for incarnation ", h.incarnation(),
                                             "; this worker is ", incarnation_));
    }
    REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(h.tensor().spec()));
    if (!h.has_collective() || h.collective().rank() == h.collective().root()) {
      // A small tensor may come whole in the header.
      REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, StartAssembly(h.tensor(), h.inline_data()));
      assembler_.emplace(std::move(a));
    } else if (static_cast<uint64_t>(*spec.ByteSize()) != h.tensor().byte_size()) {
      // The bytes come from the root over the data plane; no buffer yet.
      return absl::InvalidArgumentError("tensor header size does not match its spec");
    }
    header_ = h;
    return absl::OkStatus();
  }

  absl::Status OnChunk(const v1::TensorChunk& chunk) {
    if (!assembler_) return absl::InvalidArgumentError("chunk without a header that expects one");
    return AddChunk(*assembler_, chunk);
  }

  absl::StatusOr<std::vector<ReplicaWrite>> Finish() {
    REPVAR_RETURN_IF_ERROR(FinishCurrent());
    return std::move(items_);
  }

 private:
  absl::Status FinishCurrent() {
    if (!header_) return absl::OkStatus();
    absl::StatusOr<Tensor> t;
    if (header_->has_collective()) {
      const v1::Collective& c = header_->collective();
      CollectiveSpec params{c.group(), c.rank(), c.size(),
                            c.root(),  c.tag(),  absl::Milliseconds(c.timeout_ms())};
      if (data_plane_ == nullptr) {
        return absl::FailedPreconditionError("this worker has no data plane");
      }
      if (c.rank() == c.root()) {
        t = assembler_->Finish();
      } else {
        REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(header_->tensor().spec()));
        t = Tensor::ForOverwrite(spec);  // the broadcast fills it
      }
      if (!t.ok()) return t.status();
      REPVAR_RETURN_IF_ERROR(data_plane_->Broadcast(params, t->bytes.span()));
      t->UpdateChecksum();
      if (t->checksum != header_->tensor().checksum()) {
        return absl::DataLossError(
            absl::StrCat("data plane delivered ", header_->name(), " with a bad checksum"));
      }
    } else {
      t = assembler_->Finish();
      if (!t.ok()) return t.status();
    }
    ReplicaWrite item;
    item.variable_id = header_->variable_id();
    item.name = header_->name();
    item.version = header_->version();
    item.replicas.assign(header_->replicas().begin(), header_->replicas().end());
    item.value = std::make_shared<const Tensor>(*std::move(t));
    items_.push_back(std::move(item));
    assembler_.reset();
    header_.reset();
    return absl::OkStatus();
  }

  const uint64_t incarnation_;
  GlooDataPlane* const data_plane_;
  std::vector<ReplicaWrite> items_;
  std::optional<ChunkAssembler> assembler_;
  std::optional<v1::WriteReplicasHeader> header_;
};

}  // namespace

grpc::Status WorkerService::WriteReplicas(grpc::ServerContext*,
                                          grpc::ServerReader<v1::WriteReplicasRequest>* reader,
                                          v1::WriteReplicasResponse* resp) {
  WriteSession session(incarnation_, data_plane_);
  v1::WriteReplicasRequest msg;
  while (reader->Read(&msg)) {
    absl::Status s = msg.has_header()  ? session.OnHeader(msg.header())
                     : msg.has_chunk() ? session.OnChunk(msg.chunk())
                                       : absl::OkStatus();
    if (!s.ok()) return ToGrpcStatus(s);
  }
  return Apply(session.Finish(), resp);
}

grpc::Status WorkerService::WriteSmallReplicas(grpc::ServerContext*,
                                               const v1::WriteSmallReplicasRequest* req,
                                               v1::WriteReplicasResponse* resp) {
  WriteSession session(incarnation_, data_plane_);
  for (const v1::WriteReplicasHeader& h : req->writes()) {
    if (h.has_collective() || h.inline_data().size() != h.tensor().byte_size()) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          "WriteSmallReplicas carries whole tensors inline and no collectives"));
    }
    absl::Status s = session.OnHeader(h);
    if (!s.ok()) return ToGrpcStatus(s);
  }
  return Apply(session.Finish(), resp);
}

grpc::Status WorkerService::Apply(absl::StatusOr<std::vector<ReplicaWrite>> items,
                                  v1::WriteReplicasResponse* resp) {
  if (!items.ok()) return ToGrpcStatus(items.status());
  if (!items->empty()) resp->set_checksum(items->back().value->checksum);
  store_->Apply(*std::move(items));
  return grpc::Status::OK;
}

grpc::Status WorkerService::ReadReplica(grpc::ServerContext* ctx, const v1::ReadReplicaRequest* req,
                                        grpc::ServerWriter<v1::ReadVariableChunk>* writer) {
  auto r = req->epoch() == 0 ? store_->Get(req->variable_id(), req->replica())
                             : steps_->Read(req->epoch(), req->variable_id(), req->replica());
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

namespace {

// One trainer write inside a step: header then chunks, or inline.
// A trainer's stream of in-step writes: each tensor as a header then chunks
// (or inline). Nothing is written until the stream ends with every tensor
// verified; then all of them are applied together, or none.
class StepWriteSession {
 public:
  explicit StepWriteSession(LocalSteps* steps) : steps_(steps) {}

  absl::Status OnHeader(const v1::StepWriteHeader& h) {
    REPVAR_RETURN_IF_ERROR(FinishCurrent());
    if (first_ && (h.step() != first_->step() || h.epoch() != first_->epoch())) {
      return absl::InvalidArgumentError("one StepWrite stream writes one step");
    }
    if (!first_) {
      first_ = h;
      steps_->Hint(h.step(), h.epoch(), h.layout_id(), absl::Milliseconds(h.barrier_timeout_ms()));
    }
    REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, StartAssembly(h.tensor(), h.inline_data()));
    assembler_.emplace(std::move(a));
    header_ = h;
    return absl::OkStatus();
  }
  absl::Status OnChunk(const v1::TensorChunk& chunk) {
    if (!assembler_) return absl::InvalidArgumentError("chunk before a header");
    return AddChunk(*assembler_, chunk);
  }
  // Applies every write of the stream.
  absl::Status Finish() {
    REPVAR_RETURN_IF_ERROR(FinishCurrent());
    if (!first_) return absl::OkStatus();
    return steps_->WriteMany(first_->step(), first_->epoch(), std::move(items_));
  }

 private:
  absl::Status FinishCurrent() {
    if (!header_) return absl::OkStatus();
    REPVAR_ASSIGN_OR_RETURN(Tensor t, assembler_->Finish());
    items_.push_back(
        {header_->variable_id(), header_->replica(), std::make_shared<const Tensor>(std::move(t))});
    header_.reset();
    assembler_.reset();
    return absl::OkStatus();
  }

  LocalSteps* const steps_;
  std::optional<v1::StepWriteHeader> first_;
  std::vector<LocalSteps::WriteItem> items_;
  std::optional<ChunkAssembler> assembler_;
  std::optional<v1::StepWriteHeader> header_;
};

}  // namespace

grpc::Status WorkerService::StepWrite(grpc::ServerContext*,
                                      grpc::ServerReader<v1::StepWriteRequest>* reader,
                                      v1::StepWriteResponse*) {
  StepWriteSession session(steps_);
  v1::StepWriteRequest msg;
  while (reader->Read(&msg)) {
    absl::Status s = msg.has_header()  ? session.OnHeader(msg.header())
                     : msg.has_chunk() ? session.OnChunk(msg.chunk())
                                       : absl::OkStatus();
    if (!s.ok()) return ToGrpcStatus(s);
  }
  return ToGrpcStatus(session.Finish());
}

grpc::Status WorkerService::StepWriteSmall(grpc::ServerContext*,
                                           const v1::StepWriteSmallRequest* req,
                                           v1::StepWriteResponse*) {
  // Whole tensors inline: one copy each into a resident tensor, checked
  // against the header's checksum; applied together.
  if (req->writes().empty()) return grpc::Status::OK;
  const v1::StepWriteHeader& first = req->writes(0);
  steps_->Hint(first.step(), first.epoch(), first.layout_id(),
               absl::Milliseconds(first.barrier_timeout_ms()));
  std::vector<LocalSteps::WriteItem> items;
  items.reserve(req->writes_size());
  for (const v1::StepWriteHeader& h : req->writes()) {
    if (h.step() != first.step() || h.epoch() != first.epoch()) {
      return ToGrpcStatus(absl::InvalidArgumentError("StepWriteSmall writes one step"));
    }
    auto spec = SpecFromProto(h.tensor().spec());
    if (!spec.ok()) return ToGrpcStatus(spec.status());
    auto t = Tensor::FromBytes(*spec, BytesOf(h.inline_data()));
    if (!t.ok()) return ToGrpcStatus(t.status());
    if (t->checksum != h.tensor().checksum() || h.tensor().byte_size() != t->bytes.size()) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("StepWriteSmall: variable id ", h.variable_id(), " replica ", h.replica(),
                       " fails its size or checksum")));
    }
    items.push_back({h.variable_id(), h.replica(), std::make_shared<const Tensor>(*std::move(t))});
  }
  return ToGrpcStatus(steps_->WriteMany(first.step(), first.epoch(), std::move(items)));
}

grpc::Status WorkerService::CommitStep(grpc::ServerContext* ctx, const v1::CommitStepRequest* req,
                                       v1::StepResolution* resp) {
  steps_->Hint(req->step(), req->epoch(), req->layout_id(),
               absl::Milliseconds(req->barrier_timeout_ms()));
  std::vector<std::string> devices(req->devices().begin(), req->devices().end());
  absl::Duration timeout = req->timeout_ms() > 0 ? absl::Milliseconds(req->timeout_ms())
                                                 : absl::FromChrono(ctx->deadline()) - absl::Now();
  auto r = steps_->Commit(req->step(), req->epoch(), devices, timeout);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status WorkerService::DiscardStep(grpc::ServerContext*, const v1::DiscardStepRequest* req,
                                        v1::DiscardStepResponse*) {
  steps_->Discard(req->epoch());
  return grpc::Status::OK;
}

grpc::Status WorkerService::StepMap(grpc::ServerContext*, const v1::StepMapRequest* req,
                                    v1::StepMapResponse* resp) {
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

grpc::Status WorkerService::StepUnmap(grpc::ServerContext*, const v1::StepUnmapRequest* req,
                                      v1::StepUnmapResponse* resp) {
  auto checksum =
      steps_->Unmap(req->lease(), req->publish(),
                    req->has_checksum() ? std::optional<uint64_t>(req->checksum()) : std::nullopt);
  if (!checksum.ok()) return ToGrpcStatus(checksum.status());
  resp->set_checksum(*checksum);
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

absl::Status GrpcCoordinatorLink::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::StoreSetRequest req;
  req.set_key(key);
  req.set_value(value);
  v1::StoreSetResponse resp;
  return FromGrpcStatus(stub_->StoreSet(&ctx, req, &resp));
}

absl::StatusOr<std::string> GrpcCoordinatorLink::Get(const std::string& key,
                                                     absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
  v1::StoreGetRequest req;
  req.set_key(key);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::StoreGetResponse resp;
  absl::Status s = FromGrpcStatus(stub_->StoreGet(&ctx, req, &resp));
  if (!s.ok()) return s;
  return std::move(*resp.mutable_value());
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

namespace {

// One unary call to the coordinator with a deadline `timeout` from now.
template <typename Resp, typename Req, typename Method>
absl::StatusOr<Resp> Unary(v1::Coordinator::Stub* stub, Method method, const Req& req,
                           absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Resp resp;
  absl::Status s = FromGrpcStatus((stub->*method)(&ctx, req, &resp));
  if (!s.ok()) return s;
  return resp;
}

}  // namespace

absl::StatusOr<v1::StepInfo> GrpcCoordinatorLink::GetStep(uint64_t epoch, uint64_t known_layout) {
  v1::GetStepRequest req;
  req.set_epoch(epoch);
  req.set_known_layout(known_layout);
  return Unary<v1::StepInfo>(stub_.get(), &v1::Coordinator::Stub::GetStep, req, absl::Seconds(30));
}

absl::StatusOr<v1::StepPlan> GrpcCoordinatorLink::ReportStep(const v1::ReportStepRequest& req,
                                                             absl::Duration timeout) {
  return Unary<v1::StepPlan>(stub_.get(), &v1::Coordinator::Stub::ReportStep, req, timeout);
}

absl::StatusOr<v1::StepResolution> GrpcCoordinatorLink::FinishStep(const v1::FinishStepRequest& req,
                                                                   absl::Duration timeout) {
  return Unary<v1::StepResolution>(stub_.get(), &v1::Coordinator::Stub::FinishStep, req, timeout);
}

absl::StatusOr<v1::StepResolution> GrpcCoordinatorLink::WaitStep(uint64_t epoch,
                                                                 absl::Duration timeout) {
  v1::WaitStepRequest req;
  req.set_epoch(epoch);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return Unary<v1::StepResolution>(stub_.get(), &v1::Coordinator::Stub::WaitStep, req,
                                   timeout + absl::Seconds(5));
}

}  // namespace repvar::worker

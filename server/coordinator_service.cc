// SPDX-License-Identifier: Apache-2.0
#include "server/coordinator_service.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/model/names.h"
#include "common/rpc/convert.h"
#include "common/rpc/grpc_status.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

constexpr uint64_t kMaxInlineBytes = 32ull << 20;    // batched calls
constexpr uint64_t kMaxReadValueBytes = 4ull << 20;  // read_value in a response

grpc::Status Fail(const char* method, const absl::Status& s) {
  spdlog::debug("{} failed: {}", method, s.ToString());
  return ToGrpcStatus(s);
}

absl::StatusOr<RequestKey> KeyOf(const std::string& request_id,
                                 const google::protobuf::Message& payload) {
  REPVAR_RETURN_IF_ERROR(ValidateRequestId(request_id));
  return RequestKey{request_id, Digest(payload)};
}

}  // namespace

absl::StatusOr<VariableDef> VariableDefFromProto(const v1::VariableSpec& proto) {
  VariableDef def;
  def.name = proto.name();
  REPVAR_RETURN_IF_ERROR(ValidateVariableName(def.name));
  auto spec = SpecFromProto(proto.tensor());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", def.name, ": ", spec.status().message()));
  }
  def.tensor = *std::move(spec);
  def.trainable = proto.trainable();
  def.collections.assign(proto.collections().begin(), proto.collections().end());
  std::sort(def.collections.begin(), def.collections.end());
  def.collections.erase(std::unique(def.collections.begin(), def.collections.end()),
                        def.collections.end());
  def.replica_count = proto.replica_count();
  int agg = proto.aggregation() == v1::AGGREGATION_UNSPECIFIED ? v1::AGGREGATION_NONE
                                                               : proto.aggregation();
  if (agg < 1 || agg > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", def.name, ": unknown aggregation ", agg));
  }
  def.aggregation = static_cast<Aggregation>(agg);
  def.allow_nonfinite = proto.allow_nonfinite();
  return def;
}

void VariableViewToProto(const VariableView& view, v1::VariableInfo* proto) {
  proto->set_id(view.id);
  v1::VariableSpec* spec = proto->mutable_spec();
  spec->set_name(view.def.name);
  SpecToProto(view.def.tensor, spec->mutable_tensor());
  spec->set_trainable(view.def.trainable);
  for (const auto& c : view.def.collections) spec->add_collections(c);
  spec->set_replica_count(view.def.replica_count);
  spec->set_aggregation(static_cast<v1::Aggregation>(view.def.aggregation));
  spec->set_allow_nonfinite(view.def.allow_nonfinite);
  proto->set_version(view.version);
  proto->set_checksum(view.checksum);
  proto->set_initialized(view.initialized);
  proto->set_needs_resync(view.needs_resync);
  for (const auto& c : view.collections) proto->add_collections(c);
  for (const ReplicaView& r : view.replicas) {
    v1::ReplicaInfo* p = proto->add_replicas();
    p->set_index(r.index);
    p->set_name(r.name);
    p->set_device(r.device.ToString());
    p->set_job(r.task.job);
    p->set_task(r.task.task);
    p->set_version(r.version);
    p->set_checksum(r.checksum);
    p->set_state(static_cast<v1::ReplicaState>(r.state));
  }
}

void TopologyToProto(const TopologySnapshot& topo, v1::Topology* proto) {
  proto->set_version(topo.version);
  for (const LiveTask& t : topo.tasks) {
    v1::TaskInfo* p = proto->add_tasks();
    p->set_job(t.key.job);
    p->set_task(t.key.task);
    p->set_address(t.address);
    p->set_incarnation(t.incarnation);
    for (const DeviceName& d : t.devices) p->add_devices(d.ToString());
  }
  for (const Accelerator& a : topo.accelerators) {
    v1::AcceleratorInfo* p = proto->add_accelerators();
    p->set_ordinal(a.ordinal);
    p->set_device(a.device.ToString());
    p->set_job(a.task.job);
    p->set_task(a.task.task);
  }
  if (topo.infeed_host) {
    v1::InfeedHost* p = proto->mutable_infeed_host();
    p->set_job(topo.infeed_host->task.job);
    p->set_task(topo.infeed_host->task.task);
    p->set_address(topo.infeed_host->address);
    p->set_cpu_device(topo.infeed_host->cpu_device);
  }
  for (const auto& m : topo.missing_tasks) proto->add_missing_tasks(m);
}

grpc::Status CoordinatorService::RegisterWorker(grpc::ServerContext*,
                                                const v1::RegisterWorkerRequest* req,
                                                v1::RegisterWorkerResponse* resp) {
  WorkerRegistration reg{req->job(),
                         req->task(),
                         req->address(),
                         req->incarnation(),
                         {req->devices().begin(), req->devices().end()}};
  auto version = core_->RegisterWorker(reg);
  if (!version.ok()) return Fail("RegisterWorker", version.status());
  resp->set_topology_version(*version);
  resp->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(core_->membership().options().heartbeat_timeout / 4));
  spdlog::info("worker {}:{} registered at {} (incarnation {}, {} devices)", req->job(),
               req->task(), req->address(), req->incarnation(), req->devices_size());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  auto version = core_->Heartbeat(TaskKey{req->job(), req->task()}, req->incarnation());
  if (!version.ok()) return Fail("Heartbeat", version.status());
  resp->set_topology_version(*version);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetTopology(grpc::ServerContext*, const v1::GetTopologyRequest*,
                                             v1::Topology* resp) {
  TopologyToProto(core_->membership().Snapshot(), resp);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchTopology(grpc::ServerContext* ctx,
                                               const v1::WatchTopologyRequest* req,
                                               grpc::ServerWriter<v1::Topology>* writer) {
  int64_t after = req->after_version();
  while (!ctx->IsCancelled() && !shutting_down_) {
    TopologySnapshot snap =
        core_->membership().WaitForChange(after, absl::Now() + absl::Milliseconds(500));
    if (snap.version <= after) continue;
    v1::Topology proto;
    TopologyToProto(snap, &proto);
    if (!writer->Write(proto)) break;
    after = snap.version;
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WaitForTopology(grpc::ServerContext* ctx,
                                                 const v1::WaitForTopologyRequest* req,
                                                 v1::Topology* resp) {
  absl::Time deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, req->timeout_ms()));
  absl::Time call_deadline = absl::FromChrono(ctx->deadline());
  if (call_deadline < deadline) deadline = call_deadline;
  auto topo = core_->membership().WaitForExpected(deadline);
  if (!topo.ok()) return Fail("WaitForTopology", topo.status());
  TopologyToProto(*topo, resp);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CreateVariables(grpc::ServerContext*,
                                                 const v1::CreateVariablesRequest* req,
                                                 v1::CreateVariablesResponse* resp) {
  auto key = KeyOf(req->request_id(), *req);
  if (!key.ok()) return Fail("CreateVariables", key.status());
  std::vector<CreateItem> items;
  for (const v1::CreateVariableItem& p : req->items()) {
    auto def = VariableDefFromProto(p.spec());
    if (!def.ok()) return Fail("CreateVariables", def.status());
    auto init = InitializerFromProto(p.initializer());
    if (!init.ok()) return Fail("CreateVariables", init.status());
    items.push_back(CreateItem{*std::move(def), *std::move(init)});
  }
  auto result = core_->CreateVariables(*key, items);
  if (!result.ok()) return Fail("CreateVariables", result.status());
  for (const VariableView& v : result->variables) VariableViewToProto(v, resp->add_variables());
  for (bool c : result->created) resp->add_created(c);
  for (const auto& w : result->warnings) resp->add_warnings(w);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetVariable(grpc::ServerContext*,
                                             const v1::GetVariableRequest* req,
                                             v1::VariableInfo* resp) {
  auto view = core_->GetVariable(req->name());
  if (!view.ok()) return Fail("GetVariable", view.status());
  VariableViewToProto(*view, resp);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListVariables(grpc::ServerContext*,
                                               const v1::ListVariablesRequest* req,
                                               v1::ListVariablesResponse* resp) {
  for (const VariableView& v : core_->ListVariables(req->collection())) {
    VariableViewToProto(v, resp->add_variables());
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DeleteVariable(grpc::ServerContext*,
                                                const v1::DeleteVariableRequest* req,
                                                v1::DeleteVariableResponse*) {
  auto key = KeyOf(req->request_id(), *req);
  if (!key.ok()) return Fail("DeleteVariable", key.status());
  return ToGrpcStatus(core_->DeleteVariable(*key, req->name()));
}

grpc::Status CoordinatorService::InitializeVariables(grpc::ServerContext*,
                                                     const v1::InitializeVariablesRequest* req,
                                                     v1::InitializeVariablesResponse* resp) {
  auto key = KeyOf(req->request_id(), *req);
  if (!key.ok()) return Fail("InitializeVariables", key.status());
  std::vector<InitializeItem> items;
  for (const v1::InitializeItem& p : req->items()) {
    InitializeItem item{p.name(), std::nullopt};
    if (p.has_initializer()) {
      auto init = InitializerFromProto(p.initializer());
      if (!init.ok()) return Fail("InitializeVariables", init.status());
      if (init->kind != InitializerKind::kNone) item.initializer = *std::move(init);
    }
    items.push_back(std::move(item));
  }
  auto results = core_->Initialize(*key, items);
  if (!results.ok()) return Fail("InitializeVariables", results.status());
  for (const InitializeResult& r : *results) {
    v1::InitializeResult* p = resp->add_results();
    p->set_name(r.name);
    p->set_initialized_now(r.initialized_now);
    p->set_version(r.version);
    p->set_checksum(r.checksum);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::IsInitialized(grpc::ServerContext*,
                                               const v1::IsInitializedRequest* req,
                                               v1::IsInitializedResponse* resp) {
  for (const std::string& name : req->names()) {
    auto view = core_->GetVariable(name);
    if (!view.ok()) return Fail("IsInitialized", view.status());
    v1::VariableInfo info;
    VariableViewToProto(*view, &info);
    v1::IsInitializedResult* r = resp->add_results();
    r->set_name(name);
    r->set_initialized(view->initialized);
    r->mutable_replicas()->Swap(info.mutable_replicas());
  }
  return grpc::Status::OK;
}

namespace {
v1::AssignVariableResponse WriteResultToProto(const WriteResult& r, bool read_value) {
  v1::AssignVariableResponse p;
  p.set_version(r.version);
  p.set_checksum(r.checksum);
  if (read_value && r.value && r.value->bytes.size() <= kMaxReadValueBytes) {
    TensorToProto(*r.value, p.mutable_value());
  }
  return p;
}
AssignOp OpFromProto(v1::AssignOp op) {
  switch (op) {
    case v1::ASSIGN_OP_ADD:
      return AssignOp::kAdd;
    case v1::ASSIGN_OP_SUB:
      return AssignOp::kSub;
    default:
      return AssignOp::kAssign;
  }
}
}  // namespace

grpc::Status CoordinatorService::AssignVariable(
    grpc::ServerContext*, grpc::ServerReader<v1::AssignVariableRequest>* reader,
    v1::AssignVariableResponse* resp) {
  v1::AssignVariableRequest msg;
  if (!reader->Read(&msg) || !msg.has_header()) {
    return Fail("AssignVariable",
                absl::InvalidArgumentError("the stream must start with an AssignHeader"));
  }
  const v1::AssignHeader header = msg.header();
  if (header.op() < 0 || header.op() > v1::ASSIGN_OP_SUB) {
    return Fail("AssignVariable", absl::InvalidArgumentError("unknown assign op"));
  }
  auto key = KeyOf(header.request_id(), header);
  if (!key.ok()) return Fail("AssignVariable", key.status());
  auto spec = SpecFromProto(header.tensor().spec());
  if (!spec.ok()) return Fail("AssignVariable", spec.status());
  // Refuse a mismatch before receiving the bytes.
  auto view = core_->GetVariable(header.name());
  if (!view.ok()) return Fail("AssignVariable", view.status());
  if (!(view->def.tensor == *spec)) {
    return Fail("AssignVariable",
                absl::FailedPreconditionError(absl::StrCat("variable ", header.name(), " is ",
                                                           view->def.tensor.ToString(),
                                                           "; the value is ", spec->ToString())));
  }
  auto assembler = ChunkAssembler::Start(*spec, header.tensor().byte_size(),
                                         header.tensor().checksum(), UINT64_MAX);
  if (!assembler.ok()) return Fail("AssignVariable", assembler.status());
  while (reader->Read(&msg)) {
    if (!msg.has_chunk()) {
      return Fail("AssignVariable", absl::InvalidArgumentError("a second header in one stream"));
    }
    absl::Status s = AddChunk(*assembler, msg.chunk());
    if (!s.ok()) return Fail("AssignVariable", s);
  }
  auto value = assembler->Finish();
  if (!value.ok()) return Fail("AssignVariable", value.status());

  AssignItem item{header.name(), OpFromProto(header.op()),
                  std::make_shared<const Tensor>(*std::move(value))};
  auto result = core_->Assign(*key, item);
  if (!result.ok()) return Fail("AssignVariable", result.status());
  *resp = WriteResultToProto(*result, header.read_value());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::AssignVariables(grpc::ServerContext*,
                                                 const v1::AssignVariablesRequest* req,
                                                 v1::AssignVariablesResponse* resp) {
  auto key = KeyOf(req->request_id(), *req);
  if (!key.ok()) return Fail("AssignVariables", key.status());
  std::vector<AssignItem> items;
  for (const v1::AssignItem& p : req->items()) {
    auto t = TensorFromProto(p.value());
    if (!t.ok()) {
      return Fail("AssignVariables",
                  absl::Status(t.status().code(),
                               absl::StrCat("variable ", p.name(), ": ", t.status().message())));
    }
    items.push_back(
        AssignItem{p.name(), OpFromProto(p.op()), std::make_shared<const Tensor>(*std::move(t))});
  }
  auto results = core_->AssignBatch(*key, items);
  if (!results.ok()) return Fail("AssignVariables", results.status());
  for (const WriteResult& r : *results) *resp->add_results() = WriteResultToProto(r, false);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReadVariable(
    grpc::ServerContext* ctx, const v1::ReadVariableRequest* req,
    grpc::ServerWriter<v1::ReadVariableResponse>* writer) {
  auto read = core_->Read(req->name());
  if (!read.ok()) return Fail("ReadVariable", read.status());
  const Tensor& t = *read->value;
  v1::ReadVariableResponse msg;
  msg.mutable_header()->set_version(read->version);
  HeaderToProto(t, msg.mutable_header()->mutable_tensor());
  if (!writer->Write(msg)) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  bool ok = true;
  ForEachChunk(t.bytes.span(), static_cast<size_t>(req->chunk_bytes()),
               [&](uint64_t off, std::span<const std::byte> piece) {
                 if (!ok || ctx->IsCancelled()) {
                   ok = false;
                   return;
                 }
                 v1::ReadVariableResponse m;
                 ChunkToProto(off, piece, m.mutable_chunk());
                 ok = writer->Write(m);
               });
  if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReadVariables(grpc::ServerContext*,
                                               const v1::ReadVariablesRequest* req,
                                               v1::ReadVariablesResponse* resp) {
  std::vector<std::pair<std::string, ReadResult>> reads;
  uint64_t total = 0;
  for (const std::string& name : req->names()) {
    auto r = core_->Read(name);
    if (!r.ok()) return Fail("ReadVariables", r.status());
    total += r->value->bytes.size();
    if (total > kMaxInlineBytes) {
      return Fail("ReadVariables",
                  absl::ResourceExhaustedError("batched read exceeds 32 MiB; read large "
                                               "variables one at a time with ReadVariable"));
    }
    reads.emplace_back(name, *std::move(r));
  }
  for (const auto& [name, r] : reads) {
    v1::ReadResult* p = resp->add_results();
    p->set_name(name);
    p->set_version(r.version);
    TensorToProto(*r.value, p->mutable_value());
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::StoreSet(grpc::ServerContext*, const v1::StoreSetRequest* req,
                                          v1::StoreSetResponse*) {
  return ToGrpcStatus(core_->store().Set(req->key(), req->value()));
}

grpc::Status CoordinatorService::StoreGet(grpc::ServerContext* ctx, const v1::StoreGetRequest* req,
                                          v1::StoreGetResponse* resp) {
  absl::Time deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, req->timeout_ms()));
  deadline = std::min(deadline, absl::FromChrono(ctx->deadline()));
  auto value = core_->store().Get(req->key(), deadline);
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*std::move(value));
  return grpc::Status::OK;
}

}  // namespace repvar::server

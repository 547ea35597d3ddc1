// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/trainers_service.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_util.h"
#include "common/model/names.h"
#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/to_proto.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

constexpr uint64_t kMaxInlineBytes = 32ull << 20;    // batched calls
constexpr uint64_t kMaxReadValueBytes = 4ull << 20;  // read_value in a response
// A batched read the callback thread answers itself, at most: a larger one
// is copied into its answer (from blob files' pages, maybe not in memory)
// on a pool thread.
constexpr uint64_t kHeldAnswerBytes = 1ull << 20;

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

grpc::Status TrainersService::GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest*,
                                          v1::Topology* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  TopologyToProto(core_->registry().Snapshot(), resp);
  return grpc::Status::OK;
}

grpc::Status TrainersService::WatchTopology(grpc::ServerContext* ctx,
                                            const v1::WatchTopologyRequest* req,
                                            grpc::ServerWriter<v1::Topology>* writer) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  int64_t after = req->after_version();
  while (!ctx->IsCancelled() && !shutting_down_) {
    TopologySnapshot snap =
        core_->registry().WaitForChange(after, absl::Now() + absl::Milliseconds(500));
    if (snap.version <= after) continue;
    v1::Topology proto;
    TopologyToProto(snap, &proto);
    if (!writer->Write(proto)) break;
    after = snap.version;
  }
  return grpc::Status::OK;
}

grpc::Status TrainersService::WaitForTopology(grpc::ServerContext* ctx,
                                              const v1::WaitForTopologyRequest* req,
                                              v1::Topology* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  if (req->timeout_ms() < 0) {
    return Fail("WaitForTopology", absl::InvalidArgumentError(absl::StrCat(
                                       "timeout_ms must be >= 0, got ", req->timeout_ms())));
  }
  absl::Time deadline = absl::Now() + absl::Milliseconds(req->timeout_ms());
  absl::Time call_deadline = absl::FromChrono(ctx->deadline());
  if (call_deadline < deadline) deadline = call_deadline;
  auto topo = core_->registry().WaitForExpected(deadline);
  if (!topo.ok()) return Fail("WaitForTopology", topo.status());
  TopologyToProto(*topo, resp);
  return grpc::Status::OK;
}

grpc::Status TrainersService::CreateVariables(grpc::ServerContext* ctx,
                                              const v1::CreateVariablesRequest* req,
                                              v1::CreateVariablesResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto key = KeyOf(req->request_id(), *req);
  if (!key.ok()) return Fail("CreateVariables", key.status());
  auto detail = VariableDetailFromProto(req->detail());
  if (!detail.ok()) return Fail("CreateVariables", detail.status());
  std::vector<CreateItem> items;
  items.reserve(req->items_size());
  for (const v1::CreateVariableItem& p : req->items()) {
    auto def = VariableDefFromProto(p.spec());
    if (!def.ok()) return Fail("CreateVariables", def.status());
    auto init = InitializerFromProto(p.initializer());
    if (!init.ok()) return Fail("CreateVariables", init.status());
    items.push_back(CreateItem{*std::move(def), *std::move(init)});
  }
  auto result = core_->CreateVariables(*key, items, *detail);
  if (!result.ok()) return Fail("CreateVariables", result.status());
  resp->mutable_variables()->Reserve(static_cast<int>(result->variables.size()));
  for (const VariableView& v : result->variables) VariableViewToProto(v, resp->add_variables());
  for (bool c : result->created) resp->add_created(c);
  for (const auto& w : result->warnings) resp->add_warnings(w);
  return grpc::Status::OK;
}

grpc::Status TrainersService::GetVariable(grpc::ServerContext* ctx,
                                          const v1::GetVariableRequest* req,
                                          v1::VariableInfo* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto view = core_->GetVariable(req->name());
  if (!view.ok()) return Fail("GetVariable", view.status());
  VariableViewToProto(*view, resp);
  return grpc::Status::OK;
}

grpc::Status TrainersService::ListVariables(grpc::ServerContext* ctx,
                                            const v1::ListVariablesRequest* req,
                                            v1::ListVariablesResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto detail = VariableDetailFromProto(req->detail());
  if (!detail.ok()) return Fail("ListVariables", detail.status());
  for (const VariableView& v : core_->ListVariables(req->collection(), *detail)) {
    VariableViewToProto(v, resp->add_variables());
  }
  return grpc::Status::OK;
}

grpc::Status TrainersService::InitializeVariables(grpc::ServerContext* ctx,
                                                  const v1::InitializeVariablesRequest* req,
                                                  v1::InitializeVariablesResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
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

grpc::Status TrainersService::IsInitialized(grpc::ServerContext* ctx,
                                            const v1::IsInitializedRequest* req,
                                            v1::IsInitializedResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
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

namespace {}  // namespace

grpc::Status TrainersService::AssignVariableFrames(grpc::ServerContext* ctx, FrameReader* reader,
                                                   v1::AssignVariableResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  v1::AssignVariableRequest msg;
  std::optional<ReceivedChunk> chunk;
  absl::StatusOr<bool> more = ReadFrame(reader, &msg, &chunk);
  if (!more.ok()) return Fail("AssignVariable", more.status());
  if (!*more || chunk || !msg.has_header()) {
    return Fail("AssignVariable",
                absl::InvalidArgumentError("the stream must start with an AssignHeader"));
  }
  const v1::AssignHeader header = msg.header();
  auto op = AssignOpFromProto(header.op());
  if (!op.ok()) return Fail("AssignVariable", op.status());
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
  // Memory follows the bytes as they arrive, within this connection's share
  // of the coordinator's budget.
  const std::shared_ptr<MemoryBudget> budget = connections_.For(ctx->peer());
  auto assembler = ChunkAssembler::Start(*spec, header.tensor().byte_size(),
                                         header.tensor().checksum(), UINT64_MAX, budget.get());
  if (!assembler.ok()) return Fail("AssignVariable", assembler.status());
  while (true) {
    more = ReadFrame(reader, &msg, &chunk);
    if (!more.ok()) return Fail("AssignVariable", more.status());
    if (!*more) break;
    if (!chunk) {
      return Fail("AssignVariable", absl::InvalidArgumentError("a second header in one stream"));
    }
    absl::Status s = AddChunk(*assembler, *chunk);
    if (!s.ok()) return Fail("AssignVariable", s);
  }
  auto value = assembler->Finish();
  if (!value.ok()) return Fail("AssignVariable", value.status());

  Assignment item{header.name(), *op, std::make_shared<const Tensor>(*std::move(value))};
  auto result = core_->Assign(*key, item);
  if (!result.ok()) return Fail("AssignVariable", result.status());
  const bool read_value = header.has_read_value() ? header.read_value() : ReadValueByDefault(*op);
  WriteResultToProto(*result, read_value ? kMaxReadValueBytes : 0, resp);
  return grpc::Status::OK;
}

grpc::Status TrainersService::AssignVariables(grpc::ServerContext* ctx,
                                              const v1::AssignVariablesRequest* req,
                                              v1::AssignVariablesResponse* resp) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto key = KeyOf(req->request_id(), *req);
  if (!key.ok()) return Fail("AssignVariables", key.status());
  std::vector<Assignment> items;
  for (const v1::AssignItem& p : req->items()) {
    auto t = TensorFromProto(p.value());
    if (!t.ok()) {
      return Fail("AssignVariables",
                  absl::Status(t.status().code(),
                               absl::StrCat("variable ", p.name(), ": ", t.status().message())));
    }
    auto op = AssignOpFromProto(p.op());
    if (!op.ok()) return Fail("AssignVariables", op.status());
    items.push_back(Assignment{p.name(), *op, std::make_shared<const Tensor>(*std::move(t))});
  }
  auto results = core_->AssignBatch(*key, items);
  if (!results.ok()) return Fail("AssignVariables", results.status());
  for (size_t i = 0; i < results->size(); ++i) {
    const v1::AssignItem& p = req->items(static_cast<int>(i));
    const bool read_value = p.has_read_value() ? p.read_value() : ReadValueByDefault(items[i].op);
    WriteResultToProto((*results)[i], read_value ? kMaxReadValueBytes : 0, resp->add_results());
  }
  return grpc::Status::OK;
}

grpc::Status TrainersService::ReadVariableFrames(grpc::ServerContext* ctx,
                                                 const v1::ReadVariableRequest& req,
                                                 FrameWriter<v1::ReadVariableRequest>* writer) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  auto chunk_bytes = RequestedChunkBytes(req.chunk_bytes());
  if (!chunk_bytes.ok()) return Fail("ReadVariable", chunk_bytes.status());
  auto read = core_->Read(req.name());
  if (!read.ok()) return Fail("ReadVariable", read.status());
  v1::ReadVariableResponse head;
  head.mutable_header()->set_version(read->version);
  HeaderToProto(*read->value, head.mutable_header()->mutable_tensor());
  const bool ok = SendTensorFrames(
      head, v1::ReadVariableResponse::kChunkFieldNumber, read->value, *chunk_bytes,
      [&](const grpc::ByteBuffer& m) { return !ctx->IsCancelled() && writer->Write(m); });
  if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  return grpc::Status::OK;
}

namespace {

// ReadVariables' answer: the values by column (or a result each, for a
// client from before the columns).
grpc::Status AnswerReads(const absl::StatusOr<std::vector<ReadResult>>& reads,
                         absl::Span<const absl::string_view> names, bool columns,
                         v1::ReadVariablesResponse* resp) {
  if (!reads.ok()) return Fail("ReadVariables", reads.status());
  if (columns) {
    ReadColumnsToProto(*reads, resp->mutable_columns());
    return grpc::Status::OK;
  }
  resp->mutable_results()->Reserve(static_cast<int>(names.size()));
  for (size_t i = 0; i < names.size(); ++i) {
    v1::ReadResult* p = resp->add_results();
    p->set_name(names[i].data(), names[i].size());
    p->set_version((*reads)[i].version);
    TensorToProto(*(*reads)[i].value, p->mutable_value());
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::ServerUnaryReactor* TrainersService::ReadVariables(grpc::CallbackServerContext* ctx,
                                                         const v1::ReadVariablesRequest* req,
                                                         v1::ReadVariablesResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // Views into the request, which lives until the call is finished.
  std::vector<absl::string_view> names(req->names().begin(), req->names().end());
  std::string request_id = RequestIdOf(*ctx);
  {
    const ScopedRequestId scoped(request_id);
    absl::StatusOr<std::optional<std::vector<ReadResult>>> held =
        core_->ReadBatchHeld(names, kMaxInlineBytes, kHeldAnswerBytes);
    if (!held.ok()) {
      reactor->Finish(Fail("ReadVariables", held.status()));
      return reactor;
    }
    if (*held) {
      reactor->Finish(AnswerReads(*std::move(*held), names, req->columns(), resp));
      return reactor;
    }
  }
  // Not held (Replication::ReadBatchHeld): a value only a replica holds, a
  // copy not checked since a restart, a state not durable yet, or more than
  // kHeldAnswerBytes.
  replica_reads_.Schedule(
      [this, reactor, req, resp, names = std::move(names), request_id = std::move(request_id)] {
        const ScopedRequestId scoped(request_id);
        reactor->Finish(
            AnswerReads(core_->ReadBatch(names, kMaxInlineBytes), names, req->columns(), resp));
      });
  return reactor;
}

grpc::Status TrainersService::PublishScalars(grpc::ServerContext* ctx,
                                             const v1::PublishScalarsRequest* req,
                                             v1::PublishScalarsResponse*) {
  const ScopedRequestId request_id(RequestIdOf(*ctx));
  std::vector<ScalarSample> samples;
  samples.reserve(static_cast<size_t>(req->points_size()));
  for (const v1::ScalarPoint& p : req->points()) samples.push_back({p.name(), p.step(), p.value()});
  if (absl::Status s = scalars_->Publish(samples); !s.ok()) return Fail("PublishScalars", s);
  return grpc::Status::OK;
}

}  // namespace repvar::server

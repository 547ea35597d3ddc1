// SPDX-License-Identifier: Apache-2.0
#include "repvar/client.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client_impl.h"
#include "client/convert.h"
#include "common/base/arena_message.h"
#include "common/base/memory_budget.h"
#include "common/base/random.h"
#include "common/base/status_util.h"
#include "common/rpc/chunk_frame.h"
#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/replica_stream.h"
#include "common/rpc/to_proto.h"
#include "common/tensor/buffer.h"
#include "common/tensor/tensor.h"

namespace repvar {

using client_internal::HeaderToProto;
using client_internal::InitializerFromSpec;
using client_internal::ReplicaFromProto;
using client_internal::TensorValueFromProto;
using client_internal::TopologyFromProto;
using client_internal::VariableFromProto;
using client_internal::VariableSpecToProto;

// ---------------------------------------------------------------------------
// ReplicatedScope

namespace {
struct ScopeFrame {
  int32_t replica_count;
  std::string prefix;
};
thread_local std::vector<ScopeFrame> scope_stack;
}  // namespace

ReplicatedScope::ReplicatedScope(int32_t replica_count, std::string prefix) {
  scope_stack.push_back(ScopeFrame{replica_count, std::move(prefix)});
}

ReplicatedScope::~ReplicatedScope() { scope_stack.pop_back(); }

VariableSpec ReplicatedScope::Apply(VariableSpec spec) {
  std::vector<std::string> parts;
  int32_t replicas = 0;
  for (const ScopeFrame& f : scope_stack) {
    if (!f.prefix.empty()) parts.push_back(f.prefix);
    replicas = f.replica_count;
  }
  if (!parts.empty()) spec.name = absl::StrCat(absl::StrJoin(parts, "/"), "/", spec.name);
  if (spec.replica_count == 0) spec.replica_count = replicas > 0 ? replicas : 1;
  return spec;
}

namespace {

constexpr int64_t kSmallReadBytes = 1 << 20;
constexpr int64_t kSmallWriteBytes = 1 << 20;  // written in one unary call

// One variable's value in an AssignVariables request (a small write, or
// one item of a batch).
void PutAssignItem(const std::string& name, AssignOp op, const TensorSpec& spec,
                   std::span<const std::byte> bytes, bool read_value, v1::AssignItem* p) {
  p->set_name(name);
  p->set_op(static_cast<v1::AssignOp>(op));
  p->set_read_value(read_value);
  HeaderToProto(spec.dtype, spec.dims, bytes, p->mutable_value()->mutable_header());
  p->mutable_value()->set_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::string NewRequestId() {
  return absl::StrFormat("%016x%016x", RandomNonZero64(), RandomNonZero64());
}

// The acknowledgement of a write of `name`: with the new value when
// `read_value` asked for it, from the answer, or read when it was too large
// to ride along (or the answer was a retry's, recorded without values).
absl::StatusOr<WriteAck> Acknowledge(Client& client, const std::string& name,
                                     const v1::AssignVariableResponse& resp, bool read_value) {
  WriteAck out{resp.version(), resp.checksum(), std::nullopt};
  if (resp.has_value()) {
    REPVAR_ASSIGN_OR_RETURN(out.value, TensorValueFromProto(resp.value(), resp.version()));
  } else if (read_value) {
    REPVAR_ASSIGN_OR_RETURN(TensorValue v, client.Read(name));
    out.value = std::move(v);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.coordinator_address.empty()) {
    const char* env = std::getenv("REPVAR_COORDINATOR_ADDRESS");
    if (env == nullptr || *env == '\0') {
      return absl::InvalidArgumentError(
          "no coordinator address: pass one or set REPVAR_COORDINATOR_ADDRESS");
    }
    options.coordinator_address = env;
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError("chunk_bytes must be in (0, 4 MiB]");
  }
  for (auto [field, env] : {std::pair{&options.tls_ca_file, "REPVAR_TLS_CA"},
                            std::pair{&options.tls_cert_file, "REPVAR_TLS_CERT"},
                            std::pair{&options.tls_key_file, "REPVAR_TLS_KEY"},
                            std::pair{&options.token_file, "REPVAR_TOKEN_FILE"}}) {
    const char* value = std::getenv(env);
    if (field->empty() && value != nullptr) *field = value;
  }
  absl::StatusOr<ChannelSecurity> security = LoadChannelSecurity(
      options.tls_ca_file, options.tls_cert_file, options.tls_key_file, options.token_file);
  if (!security.ok()) return security.status();
  if (options.tune_malloc) TuneMallocForBulkTransfers();
  return std::unique_ptr<Client>(
      new Client(std::make_unique<Impl>(std::move(options), *std::move(security))));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const std::string& Client::coordinator_address() const {
  return impl_->options().coordinator_address;
}

absl::StatusOr<Topology> Client::GetTopology() {
  v1::Topology resp;
  REPVAR_RETURN_IF_ERROR(
      impl_->Call(&v1::CoordinatorTrainers::Stub::GetTopology, v1::GetTopologyRequest(), &resp));
  return TopologyFromProto(resp);
}

absl::StatusOr<Topology> Client::WaitForTopology(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  v1::Topology resp;
  REPVAR_RETURN_IF_ERROR(impl_->Retry([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline + absl::Seconds(5)));
    ctx.set_wait_for_ready(true);  // the coordinator may still be starting
    v1::WaitForTopologyRequest req;
    req.set_timeout_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    return FromGrpcStatus(impl_->stub()->WaitForTopology(&ctx, req, &resp));
  }));
  return TopologyFromProto(resp);
}

absl::StatusOr<Topology> Client::WatchTopology(int64_t after_version, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::WatchTopologyRequest req;
  req.set_after_version(after_version);
  auto reader = impl_->stub()->WatchTopology(&ctx, req);
  v1::Topology t;
  if (reader->Read(&t)) {
    ctx.TryCancel();
    reader->Finish();
    return TopologyFromProto(t);
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!s.ok() && !absl::IsDeadlineExceeded(s)) return s;
  return GetTopology();
}

absl::StatusOr<VariableInfo> Client::CreateVariable(VariableSpec spec) {
  REPVAR_ASSIGN_OR_RETURN(auto v, CreateVariables({std::move(spec)}));
  return v.front();
}

absl::StatusOr<std::vector<VariableInfo>> Client::CreateVariables(std::vector<VariableSpec> specs,
                                                                  VariableDetail detail) {
  ArenaMessage<v1::CreateVariablesRequest> req;
  req->set_request_id(NewRequestId());
  req->set_detail(static_cast<v1::VariableDetail>(detail));
  req->mutable_items()->Reserve(static_cast<int>(specs.size()));
  for (VariableSpec& s : specs) {
    s = ReplicatedScope::Apply(std::move(s));
    v1::CreateVariableItem* item = req->add_items();
    VariableSpecToProto(s, item->mutable_spec());
    REPVAR_ASSIGN_OR_RETURN(Initializer init, InitializerFromSpec(s.initializer, s.dtype, s.shape));
    InitializerToProto(init, item->mutable_initializer());
  }
  ArenaMessage<v1::CreateVariablesResponse> resp;
  REPVAR_RETURN_IF_ERROR(impl_->Retry([&] {
    grpc::ClientContext ctx;
    impl_->SetDeadline(&ctx, req->ByteSizeLong());
    return FromGrpcStatus(impl_->stub()->CreateVariables(&ctx, *req, resp.get()));
  }));
  std::vector<VariableInfo> out;
  out.reserve(resp->variables_size());
  for (int i = 0; i < resp->variables_size(); ++i) {
    VariableInfo v = VariableFromProto(resp->variables(i));
    v.created = i < resp->created_size() && resp->created(i);
    impl_->Remember(v);
    out.push_back(std::move(v));
  }
  if (!out.empty()) {
    out.front().warnings.assign(resp->warnings().begin(), resp->warnings().end());
  }
  return out;
}

absl::StatusOr<VariableInfo> Client::GetVariable(const std::string& name) {
  v1::GetVariableRequest req;
  req.set_name(name);
  v1::VariableInfo resp;
  REPVAR_RETURN_IF_ERROR(impl_->Call(&v1::CoordinatorTrainers::Stub::GetVariable, req, &resp));
  VariableInfo v = VariableFromProto(resp);
  impl_->Remember(v);
  return v;
}

absl::StatusOr<std::vector<VariableInfo>> Client::ListVariables(const std::string& collection,
                                                                VariableDetail detail) {
  v1::ListVariablesRequest req;
  req.set_collection(collection);
  req.set_detail(static_cast<v1::VariableDetail>(detail));
  ArenaMessage<v1::ListVariablesResponse> resp;
  REPVAR_RETURN_IF_ERROR(
      impl_->Call(&v1::CoordinatorTrainers::Stub::ListVariables, req, resp.get()));
  std::vector<VariableInfo> out;
  out.reserve(resp->variables_size());
  for (const auto& p : resp->variables()) out.push_back(VariableFromProto(p));
  return out;
}

absl::Status Client::DeleteVariable(const std::string& name) {
  v1::DeleteVariableRequest req;
  req.set_request_id(NewRequestId());
  req.set_name(name);
  impl_->Forget(name);
  v1::DeleteVariableResponse resp;
  return impl_->Call(&v1::CoordinatorAdmin::Stub::DeleteVariable, req, &resp);
}

absl::Status Client::PublishScalar(const std::string& name, int64_t step, double value) {
  v1::PublishScalarsRequest req;
  v1::ScalarPoint* point = req.add_points();
  point->set_name(name);
  point->set_step(step);
  point->set_value(value);
  v1::PublishScalarsResponse resp;
  // Not retried: a repeat that follows a lost answer would count twice.
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx);
  return FromGrpcStatus(impl_->stub()->PublishScalars(&ctx, req, &resp));
}

absl::StatusOr<ClusterStatus> Client::GetClusterStatus() {
  v1::ClusterStatus resp;
  REPVAR_RETURN_IF_ERROR(impl_->Call(&v1::CoordinatorAdmin::Stub::GetClusterStatus,
                                     v1::GetClusterStatusRequest(), &resp));
  ClusterStatus out;
  out.topology = TopologyFromProto(resp.topology());
  for (const auto& v : resp.variables()) out.variables.push_back(VariableFromProto(v));
  REPVAR_ASSIGN_OR_RETURN(StepsStatus steps, StepsStatusFromProto(resp.steps()));
  out.steps = client_internal::StepsLines(steps);
  out.steps_summary = client_internal::StepsSummaryOf(steps);
  out.draining = resp.draining();
  for (const auto& [in, n] : resp.divergences_repaired()) out.divergences_repaired[in] = n;
  for (const v1::ScalarSeries& s : resp.scalars()) {
    out.scalars.push_back(
        {s.name(), {s.steps().begin(), s.steps().end()}, {s.values().begin(), s.values().end()}});
  }
  return out;
}

absl::StatusOr<Client::DrainState> Client::Drain(bool resume) {
  v1::DrainRequest req;
  req.set_resume(resume);
  v1::DrainResponse resp;
  REPVAR_RETURN_IF_ERROR(impl_->Call(&v1::CoordinatorAdmin::Stub::Drain, req, &resp));
  return DrainState{resp.draining(), resp.open_step()};
}

absl::StatusOr<std::vector<InitializeResult>> Client::Initialize(
    const std::vector<std::string>& names) {
  ArenaMessage<v1::InitializeVariablesRequest> req;
  req->set_request_id(NewRequestId());
  req->mutable_items()->Reserve(static_cast<int>(names.size()));
  for (const auto& n : names) req->add_items()->set_name(n);
  ArenaMessage<v1::InitializeVariablesResponse> resp;
  REPVAR_RETURN_IF_ERROR(
      impl_->Call(&v1::CoordinatorTrainers::Stub::InitializeVariables, *req, resp.get()));
  std::vector<InitializeResult> out;
  out.reserve(resp->results_size());
  for (const auto& r : resp->results()) {
    out.push_back(InitializeResult{r.name(), r.initialized_now(), r.version(), r.checksum()});
  }
  return out;
}

absl::StatusOr<std::vector<InitializedState>> Client::IsInitialized(
    const std::vector<std::string>& names) {
  v1::IsInitializedRequest req;
  for (const auto& n : names) req.add_names(n);
  v1::IsInitializedResponse resp;
  REPVAR_RETURN_IF_ERROR(impl_->Call(&v1::CoordinatorTrainers::Stub::IsInitialized, req, &resp));
  std::vector<InitializedState> out;
  for (const auto& r : resp.results()) {
    InitializedState s{r.name(), r.initialized(), {}};
    for (const auto& rep : r.replicas()) s.replicas.push_back(ReplicaFromProto(rep));
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<WriteAck> Client::Assign(const std::string& name, std::span<const std::byte> bytes,
                                        bool read_value) {
  return Write(name, AssignOp::kAssign, bytes, std::nullopt, read_value);
}
absl::StatusOr<WriteAck> Client::AssignAdd(const std::string& name,
                                           std::span<const std::byte> bytes, bool read_value) {
  return Write(name, AssignOp::kAdd, bytes, std::nullopt, read_value);
}
absl::StatusOr<WriteAck> Client::AssignSub(const std::string& name,
                                           std::span<const std::byte> bytes, bool read_value) {
  return Write(name, AssignOp::kSub, bytes, std::nullopt, read_value);
}

absl::StatusOr<WriteAck> Client::Write(const std::string& name, AssignOp kind,
                                       std::span<const std::byte> bytes, std::optional<DType> dtype,
                                       bool read_value) {
  auto spec = impl_->Spec(name);
  if (!spec) {
    REPVAR_RETURN_IF_ERROR(GetVariable(name).status());
    spec = impl_->Spec(name);
  }
  if (dtype && *dtype != spec->dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "variable ", name, " is ", DTypeName(spec->dtype), "; the values are ", DTypeName(*dtype)));
  }
  if (static_cast<int64_t>(bytes.size()) <= kSmallWriteBytes) {
    // A small value goes in one unary call: a stream's set-up costs more
    // than the bytes.
    v1::AssignVariablesRequest req;
    req.set_request_id(NewRequestId());
    PutAssignItem(name, kind, *spec, bytes, read_value, req.add_items());
    v1::AssignVariablesResponse resp;
    absl::Status s = impl_->AssignVariables(req, &resp);
    if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) impl_->Forget(name);
    REPVAR_RETURN_IF_ERROR(s);
    if (resp.results_size() != 1) {
      return absl::InternalError(
          absl::StrCat("the coordinator answered a write of one variable with ",
                       resp.results_size(), " results"));
    }
    return Acknowledge(*this, name, resp.results(0), read_value);
  }
  v1::AssignVariableRequest head;
  v1::AssignHeader* h = head.mutable_header();
  h->set_request_id(NewRequestId());
  h->set_name(name);
  h->set_op(static_cast<v1::AssignOp>(kind));
  h->set_read_value(read_value);
  HeaderToProto(spec->dtype, spec->dims, bytes, h->mutable_tensor());

  v1::AssignVariableResponse resp;
  absl::Status s = impl_->Retry([&] {
    grpc::ClientContext ctx;
    impl_->SetDeadline(&ctx, bytes.size());
    auto stream = impl_->AssignVariableFrames(&ctx, &resp);
    bool ok = stream->Write(MessageFrame(head));
    ForEachChunk(bytes, impl_->options().chunk_bytes,
                 [&](uint64_t offset, std::span<const std::byte> piece) {
                   ok = ok && stream->Write(CopiedChunkFrame(
                                  v1::AssignVariableRequest::kChunkFieldNumber, offset, piece));
                 });
    stream->WritesDone();
    return FromGrpcStatus(stream->Finish());
  });
  if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) impl_->Forget(name);
  REPVAR_RETURN_IF_ERROR(s);
  return Acknowledge(*this, name, resp, read_value);
}

absl::StatusOr<std::vector<WriteAck>> Client::AssignBatch(const std::vector<AssignItem>& items) {
  v1::AssignVariablesRequest req;
  req.set_request_id(NewRequestId());
  for (const AssignItem& item : items) {
    auto spec = impl_->Spec(item.name);
    if (!spec) {
      REPVAR_RETURN_IF_ERROR(GetVariable(item.name).status());
      spec = impl_->Spec(item.name);
    }
    PutAssignItem(item.name, item.op, *spec, item.bytes,
                  item.read_value.value_or(ReadValueByDefault(item.op)), req.add_items());
  }
  v1::AssignVariablesResponse resp;
  REPVAR_RETURN_IF_ERROR(impl_->AssignVariables(req, &resp));
  if (resp.results_size() != static_cast<int>(items.size())) {
    return absl::InternalError(absl::StrCat("the coordinator answered a write of ", items.size(),
                                            " variables with ", resp.results_size(), " results"));
  }
  std::vector<WriteAck> out;
  for (size_t i = 0; i < items.size(); ++i) {
    REPVAR_ASSIGN_OR_RETURN(WriteAck ack,
                            Acknowledge(*this, items[i].name, resp.results(static_cast<int>(i)),
                                        req.items(static_cast<int>(i)).read_value()));
    out.push_back(std::move(ack));
  }
  return out;
}

namespace {

absl::Status WrongSize(const std::string& name, uint64_t value_bytes, size_t out_bytes) {
  return absl::InvalidArgumentError(absl::StrCat(
      name, " holds ", value_bytes, " bytes; the buffer to read it into has ", out_bytes));
}

// The byte size of `name` as this client last saw its spec, if it did. A
// variable known to be small is read in one unary call, which costs a
// fraction of a stream's set-up.
std::optional<uint64_t> KnownBytes(ClientAccess::Impl& impl, const std::string& name) {
  std::optional<TensorSpec> spec = impl.Spec(name);
  if (!spec) return std::nullopt;
  absl::StatusOr<int64_t> bytes = spec->ByteSize();
  if (!bytes.ok()) return std::nullopt;
  return static_cast<uint64_t>(*bytes);
}

// One attempt at `name`'s ReadVariable stream into `receiver` (ReadReceiver:
// each chunk copied once from gRPC's slices into its place and checked
// there), with a deadline that allows for `bytes_hint` bytes. Every fault of
// the stream is DATA_LOSS; a header above what the receiver may hold,
// RESOURCE_EXHAUSTED; one of another size than the caller's buffer
// `out_bytes` (when given), INVALID_ARGUMENT.
absl::StatusOr<ReceivedInPlace> ReadStream(ClientAccess::Impl& impl, const std::string& name,
                                           uint64_t bytes_hint, std::optional<size_t> out_bytes,
                                           ReadReceiver receiver) {
  grpc::ClientContext ctx;
  v1::ReadVariableRequest req;
  req.set_name(name);
  req.set_chunk_bytes(static_cast<int64_t>(impl.options().chunk_bytes));
  impl.SetDeadline(&ctx, bytes_hint);
  auto reader = impl.ReadVariableFrames(&ctx, req);
  absl::Status s = ReceiveFrames(ctx, *reader, receiver);
  const std::optional<uint64_t> announced = receiver.announced_bytes();
  // A header of another size than the buffer is refused by the receiver.
  if (out_bytes && announced && *announced != *out_bytes) {
    return WrongSize(name, *announced, *out_bytes);
  }
  if (absl::IsDataLoss(s) || absl::IsResourceExhausted(s)) {
    return absl::Status(s.code(), absl::StrCat("reading ", name, ": ", s.message()));
  }
  REPVAR_RETURN_IF_ERROR(s);  // the call's own error, e.g. NOT_FOUND before any message
  absl::StatusOr<ReceivedInPlace> got = receiver.FinishInPlace();
  if (!got.ok()) {
    return absl::DataLossError(absl::StrCat("reading ", name, ": ", got.status().message()));
  }
  return got;
}

// What a read tells its caller of the value it read.
ReadInfo InfoOf(ReceivedInPlace got) {
  return ReadInfo{got.header.spec.dtype, std::move(got.header.spec.dims), got.version,
                  got.header.checksum};
}

// `names` read in one ReadVariables call.
absl::Status CallReadVariables(ClientAccess::Impl& impl, const std::vector<std::string>& names,
                               v1::ReadVariablesResponse* resp) {
  ArenaMessage<v1::ReadVariablesRequest> req;
  req->mutable_names()->Reserve(static_cast<int>(names.size()));
  for (const auto& n : names) req->add_names(n);
  req->set_columns(true);
  return impl.Call(&v1::CoordinatorTrainers::Stub::ReadVariables, *req, resp);
}

// The `count` values of a ReadVariables answer, each in a vector of its own.
absl::StatusOr<std::vector<TensorValue>> ValuesOf(const v1::ReadVariablesResponse& resp,
                                                  size_t count) {
  if (resp.results_size() == 0) return client_internal::ReadColumnsFromProto(resp.columns(), count);
  // A coordinator from before the columns answers a result per variable.
  std::vector<TensorValue> out;
  out.reserve(resp.results_size());
  for (const auto& r : resp.results()) {
    REPVAR_ASSIGN_OR_RETURN(TensorValue v, TensorValueFromProto(r.value(), r.version()));
    out.push_back(std::move(v));
  }
  return out;
}

// A variable this client knows (`known`: KnownBytes) to be small, read in
// one unary call, its value handed to `take` with its spec, version,
// checksum as sent, and bytes (a view into the answer): `take` copies them
// once, where they go, and checks them there. False when it is not known
// to be small, or has been created again too large for a unary answer since
// this client saw it (then it is streamed).
absl::StatusOr<bool> ReadKnownSmall(
    ClientAccess::Impl& impl, const std::string& name, std::optional<uint64_t> known,
    absl::FunctionRef<absl::Status(const TensorSpec& spec, int64_t version, uint64_t checksum,
                                   std::span<const std::byte> data)>
        take) {
  if (!known || *known > kSmallReadBytes) return false;
  ArenaMessage<v1::ReadVariablesResponse> resp;
  const absl::Status called = CallReadVariables(impl, {name}, resp.get());
  if (absl::IsResourceExhausted(called)) return false;
  REPVAR_RETURN_IF_ERROR(called);
  if (resp->results_size() == 0) {
    REPVAR_RETURN_IF_ERROR(client_internal::ForEachReadColumn(
        resp->columns(), 1,
        [&](size_t, const TensorSpec& spec, int64_t version, uint64_t checksum,
            std::span<const std::byte> data) { return take(spec, version, checksum, data); }));
    return true;
  }
  REPVAR_ASSIGN_OR_RETURN(std::vector<TensorValue> one, ValuesOf(*resp, 1));
  REPVAR_RETURN_IF_ERROR(
      take(TensorSpec{one[0].dtype, one[0].shape}, one[0].version, one[0].checksum, one[0].bytes));
  return true;
}

}  // namespace

absl::StatusOr<ReadInfo> Client::ReadInto(const std::string& name, std::span<std::byte> out) {
  if (std::optional<absl::StatusOr<ReadInfo>> local = impl_->ReadLocalInto(name, out)) {
    return *std::move(local);
  }
  ReadInfo info;
  // A small one: copied from the answer into `out`, and checked there.
  auto into_out = [&](const TensorSpec& spec, int64_t version, uint64_t checksum,
                      std::span<const std::byte> data) -> absl::Status {
    if (data.size() != out.size()) return WrongSize(name, data.size(), out.size());
    if (!out.empty()) std::memcpy(out.data(), data.data(), out.size());
    info = ReadInfo{spec.dtype, spec.dims, version, Checksum(out)};
    return info.checksum == checksum ? absl::OkStatus() : client_internal::ValueFailsItsChecksum(0);
  };
  REPVAR_ASSIGN_OR_RETURN(bool small,
                          ReadKnownSmall(*impl_, name, KnownBytes(*impl_, name), into_out));
  if (small) return info;
  REPVAR_RETURN_IF_ERROR(impl_->Retry([&]() -> absl::Status {
    REPVAR_ASSIGN_OR_RETURN(ReceivedInPlace got,
                            ReadStream(*impl_, name, out.size(), out.size(), ReadReceiver(out)));
    info = InfoOf(std::move(got));
    return absl::OkStatus();
  }));
  impl_->Remember(name, TensorSpec{info.dtype, info.shape});
  return info;
}

absl::StatusOr<TensorValue> Client::Read(const std::string& name) {
  TensorValue value;
  if (impl_->ReadLocal(name, value)) return value;
  const std::optional<uint64_t> known = KnownBytes(*impl_, name);
  auto into_value = [&](const TensorSpec& spec, int64_t version, uint64_t checksum,
                        std::span<const std::byte> data) {
    return client_internal::TakeValue(0, spec, version, checksum, data, value);
  };
  REPVAR_ASSIGN_OR_RETURN(bool small, ReadKnownSmall(*impl_, name, known, into_value));
  if (small) return value;
  ReadInfo info;
  REPVAR_RETURN_IF_ERROR(impl_->Retry([&]() -> absl::Status {
    // A vector holds at most what this process may use.
    REPVAR_ASSIGN_OR_RETURN(ReceivedInPlace got,
                            ReadStream(*impl_, name, known.value_or(0), std::nullopt,
                                       ReadReceiver(&value.bytes, MemoryBudget::MemoryLimit())));
    info = InfoOf(std::move(got));
    return absl::OkStatus();
  }));
  impl_->Remember(name, TensorSpec{info.dtype, info.shape});
  value.dtype = info.dtype;
  value.shape = std::move(info.shape);
  value.version = info.version;
  value.checksum = info.checksum;
  return value;
}

absl::StatusOr<std::vector<TensorValue>> Client::ReadBatch(const std::vector<std::string>& names) {
  ArenaMessage<v1::ReadVariablesResponse> resp;
  REPVAR_RETURN_IF_ERROR(CallReadVariables(*impl_, names, resp.get()));
  return ValuesOf(*resp, names.size());
}

}  // namespace repvar

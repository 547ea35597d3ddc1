// SPDX-License-Identifier: Apache-2.0

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/convert.h"
#include "client/step_scope_impl.h"
#include "client/step_status.h"
#include "common/base/arena_message.h"
#include "common/base/status_util.h"
#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/replica_stream.h"
#include "common/rpc/to_proto.h"
#include "common/tensor/buffer.h"
#include "repvar/step.h"

namespace repvar {
namespace {

constexpr size_t kInlineBytes = 64 << 10;
// From this size on, in-step reads and writes go through a shared mapping of
// the worker's buffer (one copy) rather than its socket (three).
constexpr size_t kMapBytes = 1 << 20;
constexpr size_t kCopyBlock = 256 << 10;

}  // namespace

absl::StatusOr<const StepVariable*> StepScope::Impl::Var(const std::string& name) const {
  auto it = layout->vars.find(name);
  if (it == layout->vars.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("variable ", name, " is not in step ", header.step,
                     " (it does not exist, or was created or initialized after the step began)"));
  }
  return &layout->info.variables[it->second];
}

void StepScope::Impl::FillHeader(const StepVariable& var, int32_t replica,
                                 std::span<const std::byte> bytes, v1::StepWriteHeader* h) const {
  h->set_step(header.step);
  h->set_epoch(header.epoch);
  h->set_layout_id(header.layout_id);
  h->set_barrier_timeout_ms(absl::ToInt64Milliseconds(header.barrier_timeout));
  h->set_variable_id(var.id);
  h->set_replica(replica);
  SpecToProto(var.spec, h->mutable_tensor()->mutable_spec());
  h->mutable_tensor()->set_byte_size(bytes.size());
  h->mutable_tensor()->set_checksum(Checksum(bytes));
}

StepScope::StepScope(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StepScope::~StepScope() {
  if (!impl_->closed) {
    (void)Abort("the trainer's StepScope ended without a Commit");
  }
}

absl::Status StepScope::Impl::SetWorker(StepOptions given) {
  options = std::move(given);
  if (options.worker.empty()) {
    const char* env = std::getenv("REPVAR_WORKER");
    if (env != nullptr) options.worker = env;
  }
  auto colon = options.worker.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.worker.substr(colon + 1), &task)) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepOptions.worker must name this trainer's host as \"job:task\" (or set "
                     "REPVAR_WORKER); got \"",
                     options.worker, "\""));
  }
  job = options.worker.substr(0, colon);
  return absl::OkStatus();
}

absl::StatusOr<StepInfo> StepScope::Impl::BeginOnCoordinator(int64_t step) {
  std::shared_ptr<const ClientAccess::Impl::StepLayout> known = client->step_layout();
  v1::BeginStepRequest req;
  req.set_step(step);
  req.set_barrier_timeout_ms(absl::ToInt64Milliseconds(options.barrier_timeout));
  req.set_known_layout(known ? known->info.layout_id : 0);
  req.set_shared_lists(true);
  v1::StepInfo answer;
  auto begin = [&] {
    return client->Retry([&] {
      grpc::ClientContext ctx;
      // BeginStep waits for cross-replica writes in flight.
      ctx.set_deadline(
          absl::ToChronoTime(absl::Now() + client->options().deadline + options.barrier_timeout));
      return FromGrpcStatus(client->stub()->BeginStep(&ctx, req, &answer));
    });
  };
  REPVAR_RETURN_IF_ERROR(begin());
  if (answer.layout_omitted() && (!known || known->info.layout_id != answer.layout_id())) {
    req.set_known_layout(0);  // another thread moved the cache on: ask for it whole
    REPVAR_RETURN_IF_ERROR(begin());
  }
  REPVAR_ASSIGN_OR_RETURN(StepInfo info, StepInfoFromProto(answer));
  if (info.layout_omitted) {
    layout = known;
  } else {
    auto fresh = std::make_shared<ClientAccess::Impl::StepLayout>();
    fresh->info.layout_id = info.layout_id;
    fresh->info.participants = std::move(info.participants);
    fresh->info.variables = std::move(info.variables);
    for (size_t i = 0; i < fresh->info.variables.size(); ++i) {
      fresh->vars[fresh->info.variables[i].name] = static_cast<int>(i);
    }
    layout = fresh;
    client->set_step_layout(fresh);
  }
  info.participants.clear();
  info.variables.clear();
  return info;
}

absl::StatusOr<std::string> StepScope::Impl::WorkerAddress(Client& c) {
  std::string address;
  const std::vector<StepParticipant>& participants = layout->info.participants;
  for (size_t i = 0; i < participants.size(); ++i) {
    if (participants[i].task == TaskKey{job, task}) {
      me = static_cast<int32_t>(i);
      address = participants[i].address;
    }
  }
  if (me < 0) {
    const std::vector<TaskKey>& out = header.sitting_out;
    if (std::find(out.begin(), out.end(), TaskKey{job, task}) != out.end()) {
      // Its trainer's writes would count for nothing: say so now rather
      // than answer COMMITTED at the end.
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", options.worker, " sits step ", header.step,
          " out: its replicas are not up to date (a resync is under way), so no write from "
          "this host would count; begin the next step once it has caught up"));
    }
  }
  if (address.empty()) {
    // A host holding no replica of the step still commits through its worker.
    REPVAR_ASSIGN_OR_RETURN(Topology topo, c.GetTopology());
    for (const TaskInfo& t : topo.tasks) {
      if (t.job == job && t.task == task) address = t.address;
    }
  }
  if (address.empty()) {
    return absl::NotFoundError(absl::StrCat("worker ", options.worker, " is not live"));
  }
  return address;
}

absl::StatusOr<std::unique_ptr<StepScope>> StepScope::Begin(Client& client, int64_t step,
                                                            StepOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->client = &ClientAccess::Of(client);
  REPVAR_RETURN_IF_ERROR(impl->SetWorker(std::move(options)));
  REPVAR_ASSIGN_OR_RETURN(impl->header, impl->BeginOnCoordinator(step));
  REPVAR_ASSIGN_OR_RETURN(const std::string address, impl->WorkerAddress(client));
  impl->link = impl->client->Worker(address);
  impl->worker = impl->link->stub.get();
  return std::unique_ptr<StepScope>(new StepScope(std::move(impl)));
}

int64_t StepScope::step() const { return impl_->header.step; }
uint64_t StepScope::epoch() const { return impl_->header.epoch; }

std::vector<std::string> StepScope::Variables() const {
  std::vector<std::string> out;
  for (const StepVariable& v : impl_->layout->info.variables) out.push_back(v.name);
  return out;
}

absl::StatusOr<std::vector<int32_t>> StepScope::LocalReplicas(const std::string& name) const {
  REPVAR_ASSIGN_OR_RETURN(const StepVariable* var, impl_->Var(name));
  std::vector<int32_t> out;
  for (size_t i = 0; i < var->replica_participant.size(); ++i) {
    if (impl_->me >= 0 && var->replica_participant[i] == impl_->me) {
      out.push_back(static_cast<int32_t>(i));
    }
  }
  return out;
}

absl::StatusOr<ReceivedInPlace> StepScope::Impl::ReadThroughSocket(const StepVariable& var,
                                                                   int32_t replica,
                                                                   ReplicaReceiver& receiver) {
  v1::StepReadRequest req;
  req.set_step(header.step);
  req.set_epoch(header.epoch);
  req.set_variable_id(var.id);
  req.set_replica(replica);
  req.set_chunk_bytes(static_cast<int64_t>(client->options().chunk_bytes));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, static_cast<uint64_t>(var.spec.ByteSize().value_or(0)));
  auto reader = link->StepReadFrames(&ctx, req);
  REPVAR_RETURN_IF_ERROR(ReceiveFrames(ctx, *reader, receiver));
  absl::StatusOr<ReceivedInPlace> got = receiver.FinishInPlace();
  if (!got.ok()) {
    return absl::DataLossError(absl::StrCat("reading ", var.name, "/", replica,
                                            " from the worker: ", got.status().message()));
  }
  if (!(got->header.spec == var.spec)) {
    return absl::DataLossError(absl::StrCat("reading ", var.name, "/", replica,
                                            ": the worker sent ", got->header.spec.ToString(),
                                            ", not ", var.spec.ToString()));
  }
  return got;
}

absl::StatusOr<ReadInfo> StepScope::ReadView(const std::string& name, int32_t replica,
                                             std::span<std::byte> out,
                                             std::vector<std::byte>* grow) {
  REPVAR_ASSIGN_OR_RETURN(const StepVariable* var, impl_->Var(name));
  const TensorSpec& spec = var->spec;
  const uint64_t size = static_cast<uint64_t>(spec.ByteSize().value_or(0));
  if (grow == nullptr && out.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " holds ", size, " bytes; the buffer to read it into has ", out.size()));
  }
  ReadInfo info{spec.dtype, spec.dims, 0, 0};
  // The bytes, once, where the caller wants them.
  auto put = [&](std::span<const std::byte> bytes) {
    if (grow != nullptr) {
      AssignBulk(*grow, bytes);
    } else if (size > 0) {
      std::memcpy(out.data(), bytes.data(), size);
    }
  };
  if (size >= kMapBytes && !impl_->map_failed) {
    auto m = Map(name, replica, MapMode::kRead);
    if (m.ok()) {
      put((*m)->bytes());
      info.checksum = (*m)->checksum();
      info.version = (*m)->version();
      return info;
    }
    if (!impl_->map_failed) return m.status();
  }
  if (size <= kInlineBytes) {  // one unary call costs less than a stream's set-up
    REPVAR_RETURN_IF_ERROR(
        impl_->ReadSmall({{var, replica}}, [&](size_t, const Impl::ViewRead& view) {
          put(view.bytes);
          info.version = view.version;
          info.checksum = view.checksum;
        }));
    return info;
  }
  // The step's layout bounds what the worker may send: the variable's size.
  ReplicaReceiver receiver = grow != nullptr ? ReplicaReceiver(grow, size) : ReplicaReceiver(out);
  REPVAR_ASSIGN_OR_RETURN(ReceivedInPlace got, impl_->ReadThroughSocket(*var, replica, receiver));
  info.version = got.version;
  info.checksum = got.header.checksum;
  return info;
}

absl::StatusOr<TensorValue> StepScope::Read(const std::string& name, int32_t replica) {
  TensorValue out;
  REPVAR_ASSIGN_OR_RETURN(ReadInfo info, ReadView(name, replica, {}, &out.bytes));
  out.dtype = info.dtype;
  out.shape = std::move(info.shape);
  out.version = info.version;
  out.checksum = info.checksum;
  return out;
}

absl::StatusOr<ReadInfo> StepScope::ReadInto(const std::string& name, int32_t replica,
                                             std::span<std::byte> out) {
  return ReadView(name, replica, out, nullptr);
}

absl::Status StepScope::Write(const std::string& name, int32_t replica,
                              std::span<const std::byte> bytes) {
  if (bytes.size() <= kInlineBytes) return WriteBatch({LocalWrite{name, replica, bytes}});
  if (bytes.size() >= kMapBytes && !impl_->map_failed) {
    auto m = Map(name, replica, MapMode::kWrite);
    if (m.ok()) {
      if ((*m)->bytes().size() != bytes.size()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " has ", (*m)->bytes().size(),
                                                       " bytes; the value has ", bytes.size()));
      }
      // Copy and hash block by block: each block is hashed while in cache.
      ChecksumStream hash;
      std::byte* dst = (*m)->bytes().data();
      for (size_t off = 0; off < bytes.size(); off += kCopyBlock) {
        const size_t n = std::min(kCopyBlock, bytes.size() - off);
        std::memcpy(dst + off, bytes.data() + off, n);
        hash.Update(dst + off, n);
      }
      return PublishMapping(*std::move(m), hash.Digest());
    }
    if (!impl_->map_failed) return m.status();  // the worker refused
  }
  REPVAR_ASSIGN_OR_RETURN(const StepVariable* var, impl_->Var(name));
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, bytes.size());
  v1::StepWriteResponse resp;
  auto writer = impl_->worker->StepWrite(&ctx, &resp);
  v1::StepWriteRequest msg;
  impl_->FillHeader(*var, replica, bytes, msg.mutable_header());
  msg.mutable_header()->set_stream_writes(1);
  (void)(writer->Write(msg) && SendChunks<v1::StepWriteRequest>(
                                   bytes, impl_->client->options().chunk_bytes,
                                   [&](const v1::StepWriteRequest& m) { return writer->Write(m); },
                                   [](v1::StepWriteRequest& m) { return m.mutable_chunk(); }));
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

absl::Status StepScope::WriteBatch(const std::vector<LocalWrite>& writes) {
  v1::StepWriteSmallRequest req;
  uint64_t total = 0;
  for (const LocalWrite& w : writes) {
    REPVAR_ASSIGN_OR_RETURN(const StepVariable* var, impl_->Var(w.name));
    if (w.bytes.size() > kInlineBytes) {
      REPVAR_RETURN_IF_ERROR(Write(w.name, w.replica, w.bytes));
      continue;
    }
    v1::StepWriteHeader* h = req.add_writes();
    impl_->FillHeader(*var, w.replica, w.bytes, h);
    h->set_inline_data(reinterpret_cast<const char*>(w.bytes.data()), w.bytes.size());
    CountSentTensorBytes(w.bytes.size());
    total += w.bytes.size();
  }
  if (req.writes_size() == 0) return absl::OkStatus();
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, total);
  v1::StepWriteResponse resp;
  return FromGrpcStatus(impl_->worker->StepWriteSmall(&ctx, req, &resp));
}

namespace {

// A batch of small in-step reads: at most this many values' bytes (each
// counted with `kSmallReadOverheadBytes` for its header and framing), and
// this many reads, well inside what the worker answers in one call
// (StepsService::kMaxSmallReadAnswerBytes, kMaxSmallReads).
constexpr uint64_t kSmallReadBatchBytes = 2 << 20;
constexpr uint64_t kSmallReadOverheadBytes = 128;
constexpr size_t kSmallReadBatchCount = 4096;

}  // namespace

absl::Status StepScope::Impl::ReadSmall(const std::vector<SmallRead>& batch,
                                        absl::FunctionRef<void(size_t, const ViewRead&)> take) {
  v1::StepReadSmallRequest req;
  uint64_t bytes = 0;
  for (const SmallRead& read : batch) {
    v1::StepReadRequest* r = req.add_reads();
    r->set_step(header.step);
    r->set_epoch(header.epoch);
    r->set_variable_id(read.var->id);
    r->set_replica(read.replica);
    bytes += static_cast<uint64_t>(read.var->spec.ByteSize().value_or(0));
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx, bytes);
  ArenaMessage<v1::StepReadSmallResponse> resp;
  REPVAR_RETURN_IF_ERROR(FromGrpcStatus(worker->StepReadSmall(&ctx, req, resp.get())));
  if (static_cast<size_t>(resp->values_size()) != batch.size()) {
    return absl::DataLossError(absl::StrCat("the worker answered ", resp->values_size(),
                                            " values for ", batch.size(), " reads"));
  }
  for (size_t k = 0; k < batch.size(); ++k) {
    const SmallRead& read = batch[k];
    const v1::Tensor& t = resp->values(static_cast<int>(k)).value();
    absl::StatusOr<std::span<const std::byte>> data =
        client_internal::CheckedStepValue(t, read.var->spec);
    if (!data.ok()) {
      return absl::DataLossError(absl::StrCat("reading ", read.var->name, "/", read.replica,
                                              " from the worker: ", data.status().message()));
    }
    CountReceivedTensorBytes(data->size());
    take(k, ViewRead{resp->values(static_cast<int>(k)).version(), t.header().checksum(), *data});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorValue>> StepScope::ReadBatch(const std::vector<LocalRead>& reads) {
  std::vector<TensorValue> out(reads.size());
  std::vector<Impl::SmallRead> batch;
  uint64_t batch_bytes = 0;
  auto read_batch = [&]() -> absl::Status {
    REPVAR_RETURN_IF_ERROR(impl_->ReadSmall(batch, [&](size_t k, const Impl::ViewRead& view) {
      TensorValue& v = out[batch[k].slot];
      v.dtype = batch[k].var->spec.dtype;
      v.shape = batch[k].var->spec.dims;
      AssignBulk(v.bytes, view.bytes);
      v.version = view.version;
      v.checksum = view.checksum;
    }));
    batch.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  for (size_t i = 0; i < reads.size(); ++i) {
    REPVAR_ASSIGN_OR_RETURN(const StepVariable* var, impl_->Var(reads[i].name));
    const uint64_t size = static_cast<uint64_t>(var->spec.ByteSize().value_or(0));
    if (size > kInlineBytes) {
      REPVAR_ASSIGN_OR_RETURN(out[i], Read(reads[i].name, reads[i].replica));
      continue;
    }
    const uint64_t counted = size + kSmallReadOverheadBytes;
    if (batch_bytes + counted > kSmallReadBatchBytes || batch.size() == kSmallReadBatchCount) {
      REPVAR_RETURN_IF_ERROR(read_batch());
    }
    batch.push_back({var, reads[i].replica, i});
    batch_bytes += counted;
  }
  if (!batch.empty()) REPVAR_RETURN_IF_ERROR(read_batch());
  return out;
}

absl::StatusOr<StepResult> StepScope::Commit() {
  if (impl_->closed) return absl::FailedPreconditionError("the step scope is already closed");
  v1::CommitStepRequest req;
  req.set_step(impl_->header.step);
  req.set_epoch(impl_->header.epoch);
  req.set_layout_id(impl_->header.layout_id);
  req.set_barrier_timeout_ms(absl::ToInt64Milliseconds(impl_->header.barrier_timeout));
  for (const std::string& d : impl_->options.devices) req.add_devices(d);
  // The barrier timeout, then the aggregation, then slack.
  absl::Duration wait = impl_->options.barrier_timeout * 2 + absl::Minutes(2);
  req.set_timeout_ms(absl::ToInt64Milliseconds(wait));
  // The trainer's view of its step while it waits: stragglers, resolution.
  std::optional<client_internal::StepEventWatch> watch;
  if (impl_->options.on_event) {
    const uint64_t epoch = impl_->header.epoch;
    watch.emplace(*impl_->client, 0, [this, epoch](const StepEventInfo& e) {
      if (e.epoch == epoch && (e.kind == StepEventInfo::Kind::kStragglers ||
                               e.kind == StepEventInfo::Kind::kResolved)) {
        impl_->options.on_event(e);
      }
      return !(e.epoch == epoch && e.kind == StepEventInfo::Kind::kResolved);
    });
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + wait + absl::Seconds(10)));
  v1::StepResolution answer;
  absl::Status s = FromGrpcStatus(impl_->worker->CommitStep(&ctx, req, &answer));
  if (watch) watch->Stop();
  impl_->closed = true;
  if (!s.ok()) {
    // The outcome is unknown here; make sure the step does not stay open.
    (void)Abort(absl::StrCat("the trainer on ", impl_->job, ":", impl_->task,
                             " could not commit through its worker: ", s.ToString()));
    return s;
  }
  StepResolution res = ResolutionFromProto(answer);
  if (res.state != StepState::kCommitted) return res.status;
  return client_internal::StepResultOf(res);
}

absl::Status StepScope::Abort(const std::string& reason) {
  impl_->closed = true;
  v1::AbortStepRequest req;
  req.set_epoch(impl_->header.epoch);
  req.set_reason(reason);
  absl::Status s = impl_->client->Retry([&] {
    grpc::ClientContext ctx;
    impl_->SetDeadline(&ctx);
    v1::AbortStepResponse resp;
    return FromGrpcStatus(impl_->client->stub()->AbortStep(&ctx, req, &resp));
  });
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx);
  v1::DiscardStepRequest dreq;
  dreq.set_epoch(impl_->header.epoch);
  v1::DiscardStepResponse dresp;
  (void)impl_->worker->DiscardStep(&ctx, dreq, &dresp);
  return s;
}

}  // namespace repvar

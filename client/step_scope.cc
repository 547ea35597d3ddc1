// SPDX-License-Identifier: Apache-2.0
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client_impl.h"
#include "common/base/status_util.h"
#include "common/rpc/convert.h"
#include "common/rpc/replica_stream.h"
#include "common/tensor/tensor.h"
#include "repvar/step.h"

namespace repvar {
namespace {

constexpr size_t kInlineBytes = 64 << 10;
// From this size on, in-step reads and writes go through a shared mapping of
// the worker's buffer (one copy) rather than its socket (three).
constexpr size_t kMapBytes = 1 << 20;
constexpr size_t kCopyBlock = 256 << 10;

absl::Status FailureOf(const v1::StepResolution& r) {
  return absl::Status(static_cast<absl::StatusCode>(r.code() == 0 ? 2 : r.code()), r.message());
}

// Streams step events after `after_seq` to `fn` until it returns false or the
// call ends (its deadline, or ctx.TryCancel()).
absl::Status StreamStepEvents(ClientAccess::Impl& c, grpc::ClientContext& ctx, int64_t after_seq,
                              const std::function<bool(const StepEventInfo&)>& fn) {
  v1::WatchStepsRequest req;
  req.set_after_seq(after_seq);
  auto reader = c.stub()->WatchSteps(&ctx, req);
  v1::StepEvent e;
  while (reader->Read(&e)) {
    StepEventInfo info;
    info.seq = e.seq();
    info.kind = static_cast<StepEventInfo::Kind>(e.kind());
    info.step = e.step();
    info.epoch = e.epoch();
    if (!e.job().empty()) info.task = absl::StrCat(e.job(), ":", e.task());
    info.missing.assign(e.missing().begin(), e.missing().end());
    if (e.has_resolution()) {
      info.committed = e.resolution().state() == v1::STEP_STATE_COMMITTED;
      if (!info.committed) info.error = FailureOf(e.resolution()).ToString();
    }
    if (!fn(info)) {
      ctx.TryCancel();
      break;
    }
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (absl::IsDeadlineExceeded(s) || absl::IsCancelled(s)) return absl::OkStatus();
  return s;
}

}  // namespace

class StepScope::Impl {
 public:
  ClientAccess::Impl* client = nullptr;
  StepOptions options;
  std::string job;
  int32_t task = 0;
  int32_t me = -1;  // participant index
  v1::StepInfo info;
  std::shared_ptr<const ClientAccess::Impl::StepLayout> layout;
  v1::Worker::Stub* worker = nullptr;
  bool closed = false;
  bool map_failed = false;  // the worker's memory cannot be mapped from here

  absl::StatusOr<const v1::StepVariable*> Var(const std::string& name) const {
    auto it = layout->vars.find(name);
    if (it == layout->vars.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("variable ", name, " is not in step ", info.step(),
                       " (it does not exist, or was created or initialized after the step began)"));
    }
    return &layout->info.variables(it->second);
  }

  void FillHeader(const v1::StepVariable& var, int32_t replica, std::span<const std::byte> bytes,
                  v1::StepWriteHeader* h) const {
    h->set_step(info.step());
    h->set_epoch(info.epoch());
    h->set_layout_id(info.layout_id());
    h->set_barrier_timeout_ms(info.barrier_timeout_ms());
    h->set_variable_id(var.id());
    h->set_replica(replica);
    *h->mutable_tensor()->mutable_spec() = var.spec();
    h->mutable_tensor()->set_byte_size(bytes.size());
    h->mutable_tensor()->set_checksum(Checksum(bytes));
  }

  void SetDeadline(grpc::ClientContext* ctx, uint64_t bytes = 0) const {
    client->SetDeadline(ctx, bytes);
  }
};

class LocalMapping::Impl {
 public:
  ~Impl() {
    if (data != nullptr) munmap(data, size);
    if (lease != 0 && worker != nullptr) {  // not published: give the buffer back
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::StepUnmapRequest req;
      req.set_lease(lease);
      v1::StepUnmapResponse resp;
      (void)worker->StepUnmap(&ctx, req, &resp);
    }
  }
  v1::Worker::Stub* worker = nullptr;
  uint64_t lease = 0;
  std::string variable;
  int32_t replica = 0;
  bool writable = false;
  uint64_t checksum = 0;
  int64_t version = 0;
  std::byte* data = nullptr;
  size_t size = 0;
};

LocalMapping::LocalMapping(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalMapping::~LocalMapping() = default;
const std::string& LocalMapping::variable() const { return impl_->variable; }
int32_t LocalMapping::replica() const { return impl_->replica; }
bool LocalMapping::writable() const { return impl_->writable; }
uint64_t LocalMapping::checksum() const { return impl_->checksum; }
int64_t LocalMapping::version() const { return impl_->version; }
std::span<std::byte> LocalMapping::bytes() { return {impl_->data, impl_->size}; }
std::span<const std::byte> LocalMapping::bytes() const { return {impl_->data, impl_->size}; }

StepScope::StepScope(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StepScope::~StepScope() {
  if (!impl_->closed) {
    (void)Abort("the trainer's StepScope ended without a Commit");
  }
}

absl::StatusOr<std::unique_ptr<StepScope>> StepScope::Begin(Client& client, int64_t step,
                                                            StepOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->client = &ClientAccess::Of(client);
  if (options.worker.empty()) {
    const char* env = std::getenv("REPVAR_WORKER");
    if (env != nullptr) options.worker = env;
  }
  auto colon = options.worker.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.worker.substr(colon + 1), &impl->task)) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepOptions.worker must name this trainer's host as \"job:task\" (or set "
                     "REPVAR_WORKER); got \"",
                     options.worker, "\""));
  }
  impl->job = options.worker.substr(0, colon);
  impl->options = options;

  std::shared_ptr<const ClientAccess::Impl::StepLayout> known = impl->client->step_layout();
  v1::BeginStepRequest req;
  req.set_step(step);
  req.set_barrier_timeout_ms(absl::ToInt64Milliseconds(options.barrier_timeout));
  req.set_known_layout(known ? known->info.layout_id() : 0);
  auto begin = [&] {
    return impl->client->Retry([&] {
      grpc::ClientContext ctx;
      // BeginStep waits for cross-replica writes in flight.
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + impl->client->options().deadline +
                                          options.barrier_timeout));
      return FromGrpcStatus(impl->client->stub()->BeginStep(&ctx, req, &impl->info));
    });
  };
  REPVAR_RETURN_IF_ERROR(begin());
  if (impl->info.layout_omitted() &&
      (!known || known->info.layout_id() != impl->info.layout_id())) {
    req.set_known_layout(0);  // another thread moved the cache on: ask for it whole
    REPVAR_RETURN_IF_ERROR(begin());
  }
  if (impl->info.layout_omitted()) {
    impl->layout = known;
  } else {
    auto layout = std::make_shared<ClientAccess::Impl::StepLayout>();
    layout->info.set_layout_id(impl->info.layout_id());
    layout->info.mutable_participants()->Swap(impl->info.mutable_participants());
    layout->info.mutable_variables()->Swap(impl->info.mutable_variables());
    for (int i = 0; i < layout->info.variables_size(); ++i) {
      layout->vars[layout->info.variables(i).name()] = i;
    }
    impl->layout = layout;
    impl->client->set_step_layout(layout);
  }
  std::string address;
  for (int i = 0; i < impl->layout->info.participants_size(); ++i) {
    const v1::StepParticipant& p = impl->layout->info.participants(i);
    if (p.job() == impl->job && p.task() == impl->task) {
      impl->me = i;
      address = p.address();
    }
  }
  if (address.empty()) {
    // A host holding no replica of the step still commits through its worker.
    REPVAR_ASSIGN_OR_RETURN(Topology topo, client.GetTopology());
    for (const TaskInfo& t : topo.tasks) {
      if (t.job == impl->job && t.task == impl->task) address = t.address;
    }
  }
  if (address.empty()) {
    return absl::NotFoundError(absl::StrCat("worker ", options.worker, " is not live"));
  }
  impl->worker = impl->client->WorkerStub(address);
  return std::unique_ptr<StepScope>(new StepScope(std::move(impl)));
}

int64_t StepScope::step() const { return impl_->info.step(); }
uint64_t StepScope::epoch() const { return impl_->info.epoch(); }

std::vector<std::string> StepScope::Variables() const {
  std::vector<std::string> out;
  for (const v1::StepVariable& v : impl_->layout->info.variables()) out.push_back(v.name());
  return out;
}

absl::StatusOr<std::vector<int32_t>> StepScope::LocalReplicas(const std::string& name) const {
  REPVAR_ASSIGN_OR_RETURN(const v1::StepVariable* var, impl_->Var(name));
  std::vector<int32_t> out;
  for (int i = 0; i < var->replica_participant_size(); ++i) {
    if (impl_->me >= 0 && var->replica_participant(i) == impl_->me) out.push_back(i);
  }
  return out;
}

absl::StatusOr<TensorValue> StepScope::Read(const std::string& name, int32_t replica) {
  REPVAR_ASSIGN_OR_RETURN(const v1::StepVariable* var, impl_->Var(name));
  REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(var->spec()));
  const uint64_t size = static_cast<uint64_t>(spec.ByteSize().value_or(0));
  if (size >= kMapBytes && !impl_->map_failed) {
    auto m = Map(name, replica, MapMode::kRead);
    if (m.ok()) {
      TensorValue out;
      out.dtype = spec.dtype;
      out.shape = spec.dims;
      out.bytes.assign((*m)->bytes().begin(), (*m)->bytes().end());
      out.checksum = (*m)->checksum();
      out.version = (*m)->version();
      return out;
    }
    if (!impl_->map_failed) return m.status();
  }
  v1::ReadReplicaRequest req;
  req.set_variable_id(var->id());
  req.set_replica(replica);
  req.set_epoch(impl_->info.epoch());
  req.set_chunk_bytes(static_cast<int64_t>(impl_->client->options().chunk_bytes));
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, size);
  auto reader = impl_->worker->ReadReplica(&ctx, req);
  REPVAR_ASSIGN_OR_RETURN(ReceivedReplica got, ReceiveReplica(ctx, *reader));
  if (!(got.value.spec == spec)) return absl::DataLossError("the worker sent another shape");
  TensorValue out;
  out.version = got.version;
  out.checksum = got.value.checksum;
  out.dtype = spec.dtype;
  out.shape = spec.dims;
  out.bytes.assign(got.value.bytes.data(), got.value.bytes.data() + got.value.bytes.size());
  return out;
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
      std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h(XXH3_createState(),
                                                                 &XXH3_freeState);
      XXH3_64bits_reset(h.get());
      std::byte* dst = (*m)->bytes().data();
      for (size_t off = 0; off < bytes.size(); off += kCopyBlock) {
        const size_t n = std::min(kCopyBlock, bytes.size() - off);
        std::memcpy(dst + off, bytes.data() + off, n);
        XXH3_64bits_update(h.get(), dst + off, n);
      }
      return PublishMapping(*std::move(m), XXH3_64bits_digest(h.get()));
    }
    if (!impl_->map_failed) return m.status();  // the worker refused
  }
  REPVAR_ASSIGN_OR_RETURN(const v1::StepVariable* var, impl_->Var(name));
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, bytes.size());
  v1::StepWriteResponse resp;
  auto writer = impl_->worker->StepWrite(&ctx, &resp);
  v1::StepWriteRequest msg;
  impl_->FillHeader(*var, replica, bytes, msg.mutable_header());
  bool ok = writer->Write(msg);
  ForEachChunk(bytes, impl_->client->options().chunk_bytes,
               [&](uint64_t off, std::span<const std::byte> piece) {
                 if (!ok) return;
                 v1::StepWriteRequest m;
                 ChunkToProto(off, piece, m.mutable_chunk());
                 ok = writer->Write(m);
               });
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

absl::Status StepScope::WriteBatch(const std::vector<LocalWrite>& writes) {
  v1::StepWriteSmallRequest req;
  uint64_t total = 0;
  for (const LocalWrite& w : writes) {
    REPVAR_ASSIGN_OR_RETURN(const v1::StepVariable* var, impl_->Var(w.name));
    if (w.bytes.size() > kInlineBytes) {
      REPVAR_RETURN_IF_ERROR(Write(w.name, w.replica, w.bytes));
      continue;
    }
    v1::StepWriteHeader* h = req.add_writes();
    impl_->FillHeader(*var, w.replica, w.bytes, h);
    h->set_inline_data(reinterpret_cast<const char*>(w.bytes.data()), w.bytes.size());
    total += w.bytes.size();
  }
  if (req.writes_size() == 0) return absl::OkStatus();
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, total);
  v1::StepWriteResponse resp;
  return FromGrpcStatus(impl_->worker->StepWriteSmall(&ctx, req, &resp));
}

absl::StatusOr<std::unique_ptr<LocalMapping>> StepScope::Map(const std::string& name,
                                                             int32_t replica, MapMode mode) {
  REPVAR_ASSIGN_OR_RETURN(const v1::StepVariable* var, impl_->Var(name));
  v1::StepMapRequest req;
  req.set_step(impl_->info.step());
  req.set_epoch(impl_->info.epoch());
  req.set_variable_id(var->id());
  req.set_replica(replica);
  req.set_layout_id(impl_->info.layout_id());
  req.set_barrier_timeout_ms(impl_->info.barrier_timeout_ms());
  req.set_write(mode != MapMode::kRead);
  req.set_initialize(mode == MapMode::kUpdate);
  v1::StepMapResponse resp;
  {
    grpc::ClientContext ctx;
    impl_->SetDeadline(&ctx);
    REPVAR_RETURN_IF_ERROR(FromGrpcStatus(impl_->worker->StepMap(&ctx, req, &resp)));
  }
  auto m = std::make_unique<LocalMapping::Impl>();
  m->worker = impl_->worker;
  m->lease = resp.lease();
  m->variable = name;
  m->replica = replica;
  m->writable = mode != MapMode::kRead;
  m->size = resp.byte_size();
  m->checksum = resp.checksum();
  m->version = resp.version();
  // The worker's memfd, opened through /proc: works on the worker's host for
  // the same user.
  std::string path = absl::StrCat("/proc/", resp.pid(), "/fd/", resp.fd());
  int fd = open(path.c_str(), m->writable ? O_RDWR : O_RDONLY);
  if (fd < 0) {
    impl_->map_failed = true;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map ", name, "/", replica, " from the worker's memory (", path, ": ",
                     std::strerror(errno), "); is this trainer on the worker's host?"));
  }
  if (m->size > 0) {
    void* p = mmap(nullptr, m->size, m->writable ? PROT_READ | PROT_WRITE : PROT_READ,
                   MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map ", m->size, " bytes: ", std::strerror(errno)));
    }
    m->data = static_cast<std::byte*>(p);
  }
  close(fd);
  return std::unique_ptr<LocalMapping>(new LocalMapping(std::move(m)));
}

absl::Status StepScope::Publish(std::unique_ptr<LocalMapping> mapping) {
  return PublishMapping(std::move(mapping), std::nullopt);
}

absl::Status StepScope::PublishMapping(std::unique_ptr<LocalMapping> mapping,
                                       std::optional<uint64_t> checksum) {
  if (mapping == nullptr || !mapping->writable()) {
    return absl::InvalidArgumentError("only a kWrite or kUpdate mapping can be published");
  }
  LocalMapping::Impl& m = *mapping->impl_;
  v1::StepUnmapRequest req;
  req.set_lease(m.lease);
  req.set_publish(true);
  if (checksum) req.set_checksum(*checksum);
  v1::StepUnmapResponse resp;
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx, m.size);
  absl::Status s = FromGrpcStatus(m.worker->StepUnmap(&ctx, req, &resp));
  m.lease = 0;  // published or refused: the worker has ended the lease either way
  return s;
}

absl::StatusOr<StepResult> StepScope::Commit() {
  if (impl_->closed) return absl::FailedPreconditionError("the step scope is already closed");
  v1::CommitStepRequest req;
  req.set_step(impl_->info.step());
  req.set_epoch(impl_->info.epoch());
  req.set_layout_id(impl_->info.layout_id());
  req.set_barrier_timeout_ms(impl_->info.barrier_timeout_ms());
  for (const std::string& d : impl_->options.devices) req.add_devices(d);
  // The barrier timeout, then the aggregation, then slack.
  absl::Duration wait = impl_->options.barrier_timeout * 2 + absl::Minutes(2);
  req.set_timeout_ms(absl::ToInt64Milliseconds(wait));
  // The trainer's view of its step while it waits: stragglers, resolution.
  grpc::ClientContext watch_ctx;
  std::thread watcher;
  if (impl_->options.on_event) {
    const uint64_t epoch = impl_->info.epoch();
    watcher = std::thread([this, &watch_ctx, epoch] {
      (void)StreamStepEvents(*impl_->client, watch_ctx, 0, [&](const StepEventInfo& e) {
        if (e.epoch == epoch && (e.kind == StepEventInfo::Kind::kStragglers ||
                                 e.kind == StepEventInfo::Kind::kResolved)) {
          impl_->options.on_event(e);
        }
        return !(e.epoch == epoch && e.kind == StepEventInfo::Kind::kResolved);
      });
    });
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + wait + absl::Seconds(10)));
  v1::StepResolution res;
  absl::Status s = FromGrpcStatus(impl_->worker->CommitStep(&ctx, req, &res));
  if (watcher.joinable()) {
    watch_ctx.TryCancel();
    watcher.join();
  }
  impl_->closed = true;
  if (!s.ok()) {
    // The outcome is unknown here; make sure the step does not stay open.
    (void)Abort(absl::StrCat("the trainer on ", impl_->job, ":", impl_->task,
                             " could not commit through its worker: ", s.ToString()));
    return s;
  }
  if (res.state() != v1::STEP_STATE_COMMITTED) return FailureOf(res);
  StepResult out;
  out.step = res.step();
  out.epoch = res.epoch();
  for (const v1::CommittedVariable& c : res.changed()) {
    out.changed.push_back(StepChange{c.name(), c.version(), c.checksum()});
  }
  for (const v1::Divergence& d : res.divergences()) {
    out.divergences.push_back(
        StepDivergence{d.name(),
                       {d.replica_checksums().begin(), d.replica_checksums().end()},
                       d.chosen_checksum(),
                       {d.repaired().begin(), d.repaired().end()}});
  }
  for (const v1::WorkerStepLatency& l : res.latencies()) {
    out.latencies.push_back(
        StepWorkerLatency{l.job(), l.task(), absl::Milliseconds(l.report_ms())});
  }
  return out;
}

absl::Status StepScope::Abort(const std::string& reason) {
  impl_->closed = true;
  v1::AbortStepRequest req;
  req.set_epoch(impl_->info.epoch());
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
  dreq.set_epoch(impl_->info.epoch());
  v1::DiscardStepResponse dresp;
  (void)impl_->worker->DiscardStep(&ctx, dreq, &dresp);
  return s;
}

namespace {

std::string ResolutionLine(const v1::StepResolution& r) {
  std::string line = absl::StrCat("step ", r.step(), " (epoch ", r.epoch(), "): ");
  if (r.state() == v1::STEP_STATE_COMMITTED) {
    absl::StrAppend(&line, "committed, ", r.changed_size(), " variable(s) changed");
    if (r.divergences_size() > 0) {
      absl::StrAppend(&line, ", ", r.divergences_size(), " divergence(s) repaired");
    }
  } else {
    absl::StrAppend(&line, "FAILED: ", FailureOf(r).ToString());
  }
  std::vector<std::string> lat;
  for (const v1::WorkerStepLatency& l : r.latencies()) {
    lat.push_back(absl::StrCat(l.job(), ":", l.task(), " ", l.report_ms(), " ms"));
  }
  if (!lat.empty()) absl::StrAppend(&line, "; reports: ", absl::StrJoin(lat, ", "));
  return line;
}
}  // namespace

namespace {
absl::StatusOr<v1::StepsStatus> GetSteps(Client& client) {
  ClientAccess::Impl& c = ClientAccess::Of(client);
  v1::StepsStatus st;
  REPVAR_RETURN_IF_ERROR(c.Retry([&] {
    grpc::ClientContext ctx;
    c.SetDeadline(&ctx);
    return FromGrpcStatus(c.stub()->GetSteps(&ctx, v1::GetStepsRequest(), &st));
  }));
  return st;
}
}  // namespace

absl::StatusOr<int64_t> LastCommittedStep(Client& client) {
  REPVAR_ASSIGN_OR_RETURN(v1::StepsStatus st, GetSteps(client));
  return st.last_committed_step();
}

absl::StatusOr<std::vector<std::string>> DescribeSteps(Client& client) {
  REPVAR_ASSIGN_OR_RETURN(v1::StepsStatus st, GetSteps(client));
  std::vector<std::string> out;
  out.push_back(absl::StrCat("last committed step: ", st.last_committed_step()));
  if (st.has_open()) {
    out.push_back(absl::StrCat("open: step ", st.open().step(), " (epoch ", st.open().epoch(),
                               "), barrier timeout ", st.open().barrier_timeout_ms(), " ms, ",
                               st.open().participants_size(), " participant(s), ",
                               st.open().variables_size(), " variable(s)"));
    for (const v1::ParticipantProgress& p : st.progress()) {
      out.push_back(absl::StrCat("  ", p.job(), ":", p.task(), "  ",
                                 p.reported() ? "reported" : "WAITING", "  ", p.last_activity()));
    }
  } else {
    out.push_back("no step is open");
  }
  for (const v1::StepResolution& r : st.recent()) out.push_back(ResolutionLine(r));
  return out;
}

absl::Status WatchSteps(Client& client, int64_t after_seq, absl::Duration timeout,
                        const std::function<bool(const StepEventInfo&)>& fn) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return StreamStepEvents(ClientAccess::Of(client), ctx, after_seq, fn);
}

}  // namespace repvar

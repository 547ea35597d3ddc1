// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/grpc_worker_client.h"

#include <grpcpp/grpcpp.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/arena_message.h"
#include "common/base/logging.h"
#include "common/base/status_util.h"
#include "common/rpc/chunk_frame.h"
#include "common/rpc/chunks.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/replica_stream.h"
#include "common/rpc/to_proto.h"

namespace repvar::server {
namespace {

constexpr size_t kMaxInlineBytes = 64 << 10;  // see WriteReplicasHeader.inline_data
constexpr uint64_t kMaxUnaryBytes = 8 << 20;  // one WriteSmallReplicas message at most

// The header of one write; sets inline_data when the bytes ride in it.
// Returns whether chunks must follow.
bool FillHeader(const WorkerTarget& target, const ReplicaWrite& w, v1::WriteReplicasHeader* h) {
  h->set_incarnation(target.incarnation);
  h->set_variable_id(w.variable_id);
  h->set_name(w.name);
  h->set_version(w.version);
  h->set_fence(w.fence);
  h->mutable_replicas()->Assign(w.replicas.begin(), w.replicas.end());
  HeaderToProto(*w.value, h->mutable_tensor());
  if (w.collective) {
    CollectiveToProto(*w.collective, h->mutable_collective());
    if (w.collective->rank != w.collective->root) return false;  // bytes come over gloo
  }
  if (w.value->bytes.size() <= kMaxInlineBytes) {
    h->set_inline_data(reinterpret_cast<const char*>(w.value->bytes.data()), w.value->bytes.size());
    CountSentTensorBytes(w.value->bytes.size());
    return false;
  }
  return true;
}

absl::Status Named(const WorkerTarget& target, absl::Status s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("worker ", target.task.ToString(), " at ",
                                             target.address, ": ", s.message()));
}

// A call made for the request the calling thread serves carries its id
// (x-request-id): the worker's log lines about it show the same id.
std::shared_ptr<grpc::ClientContext> CallContext() {
  auto ctx = std::make_shared<grpc::ClientContext>();
  if (absl::string_view id = CurrentRequestId(); !id.empty()) {
    ctx->AddMetadata(kRequestIdKey, std::string(id));
  }
  return ctx;
}

// A unary call in flight: owns what the call needs until its callback.
template <typename Req, typename Resp, typename DoneT>
struct UnaryCall {
  // Tracked in `in_flight` under `key` until it finishes.
  UnaryCall(std::shared_ptr<GrpcWorkerClient::InFlight> calls, const WorkerTarget& target)
      : in_flight(std::move(calls)), key(GrpcWorkerClient::InFlight::KeyOf(target)) {
    in_flight->Add(key, ctx);
  }
  ~UnaryCall() { in_flight->Remove(key, ctx.get()); }
  std::shared_ptr<GrpcWorkerClient::InFlight> in_flight;
  std::string key;
  std::shared_ptr<grpc::ClientContext> ctx = CallContext();
  // A batch of a thousand headers is built on the call's arena.
  alignas(8) char first_block[kArenaFirstBlockBytes];
  google::protobuf::Arena arena{BatchArenaOptions(first_block)};
  Req& req = *google::protobuf::Arena::CreateMessage<Req>(&arena);
  Resp& resp = *google::protobuf::Arena::CreateMessage<Resp>(&arena);
  DoneT done;
};

// One WriteReplicas stream: each write's header, then its chunks, one
// message in flight at a time; deletes itself when the call is done. The
// stream carries byte buffers so that a chunk goes out as a ChunkFrame:
// gRPC writes the value's own bytes to the socket, not copies of them.
class WriteCall final : public grpc::ClientWriteReactor<grpc::ByteBuffer> {
 public:
  WriteCall(WorkerTarget target, std::vector<ReplicaWrite> writes, size_t chunk_bytes,
            absl::Time deadline, WorkerClient::Done done,
            std::shared_ptr<GrpcWorkerClient::InFlight> in_flight)
      : target_(std::move(target)),
        writes_(std::move(writes)),
        chunk_bytes_(chunk_bytes),
        done_(std::move(done)),
        in_flight_(std::move(in_flight)),
        key_(GrpcWorkerClient::InFlight::KeyOf(target_)) {
    ctx_->set_deadline(absl::ToChronoTime(deadline));
    const std::optional<CollectiveSpec>& c = writes_.front().collective;
    in_flight_->Add(key_, ctx_, c ? c->group : "");
  }
  ~WriteCall() override { in_flight_->Remove(key_, ctx_.get()); }

  void Start(const GrpcWorkerClient::Channel& channel) {
    grpc::internal::ClientCallbackWriterFactory<grpc::ByteBuffer>::Create(
        channel.channel.get(), channel.write_replicas, ctx_.get(), &resp_, this);
    WriteNext();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();  // else the stream broke: OnDone reports why
  }
  void OnDone(const grpc::Status& status) override {
    std::move(done_)(Named(target_, FromGrpcStatus(status)));
    delete this;
  }

 private:
  // Starts the next message, or ends the stream after the last.
  void WriteNext() {
    if (chunks_) {
      const std::shared_ptr<const Tensor>& t = writes_[index_].value;
      const size_t n = std::min(chunk_bytes_, t->bytes.size() - offset_);
      const std::span<const std::byte> piece = t->bytes.span().subspan(offset_, n);
      msg_ = ChunkFrame(v1::WriteReplicasRequest::kChunkFieldNumber, offset_, piece,
                        t->ChunkChecksum(offset_, n), t);
      offset_ += n;
      if (offset_ == t->bytes.size()) {
        chunks_ = false;
        ++index_;
      }
      StartWrite(&msg_);
      return;
    }
    if (index_ == writes_.size()) {
      StartWritesDone();
      return;
    }
    v1::WriteReplicasRequest head;
    chunks_ = FillHeader(target_, writes_[index_], head.mutable_header());
    if (index_ == 0) head.mutable_header()->set_stream_writes(static_cast<int32_t>(writes_.size()));
    offset_ = 0;
    if (!chunks_) ++index_;
    msg_ = MessageFrame(head);
    StartWrite(&msg_);
  }

  const WorkerTarget target_;
  const std::vector<ReplicaWrite> writes_;
  const size_t chunk_bytes_;
  WorkerClient::Done done_;
  const std::shared_ptr<GrpcWorkerClient::InFlight> in_flight_;
  const std::string key_;
  const std::shared_ptr<grpc::ClientContext> ctx_ = CallContext();
  v1::WriteReplicasResponse resp_;
  grpc::ByteBuffer msg_;  // the message in flight
  size_t index_ = 0;      // the write being sent
  bool chunks_ = false;   // its chunks come next
  size_t offset_ = 0;
};

// One ReadReplica stream, rebuilt message by message. It reads byte
// buffers, so that each chunk is copied from gRPC's slices straight into the
// value (ReplicaReceiver::OnFrame).
class ReadCall final : public grpc::ClientReadReactor<grpc::ByteBuffer> {
 public:
  ReadCall(WorkerTarget target, absl::Time deadline, WorkerClient::ReadDone done,
           std::shared_ptr<GrpcWorkerClient::InFlight> in_flight)
      : target_(std::move(target)),
        done_(std::move(done)),
        in_flight_(std::move(in_flight)),
        key_(GrpcWorkerClient::InFlight::KeyOf(target_)) {
    ctx_->set_deadline(absl::ToChronoTime(deadline));
    in_flight_->Add(key_, ctx_);
  }
  ~ReadCall() override { in_flight_->Remove(key_, ctx_.get()); }

  void Start(const GrpcWorkerClient::Channel& channel, const v1::ReadReplicaRequest& req) {
    req_ = req;
    grpc::internal::ClientCallbackReaderFactory<grpc::ByteBuffer>::Create(
        channel.channel.get(), channel.read_replica, ctx_.get(), &req_, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (error_.ok()) error_ = receiver_.OnFrame(msg_);
    if (!error_.ok()) {
      ctx_->TryCancel();
      return;
    }
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::StatusOr<WorkerClient::ReplicaValue> out;
    if (!error_.ok()) {
      out = error_;
    } else if (!status.ok()) {
      out = FromGrpcStatus(status);
    } else if (auto got = receiver_.Finish(); !got.ok()) {
      out = got.status();
    } else {
      out = WorkerClient::ReplicaValue{got->version,
                                       std::make_shared<const Tensor>(std::move(got->value))};
    }
    if (!out.ok()) out = Named(target_, out.status());
    std::move(done_)(std::move(out));
    delete this;
  }

 private:
  const WorkerTarget target_;
  WorkerClient::ReadDone done_;
  const std::shared_ptr<GrpcWorkerClient::InFlight> in_flight_;
  const std::string key_;
  const std::shared_ptr<grpc::ClientContext> ctx_ = CallContext();
  v1::ReadReplicaRequest req_;
  grpc::ByteBuffer msg_;
  ReplicaReceiver receiver_;
  absl::Status error_;
};

}  // namespace

void GrpcWorkerClient::InFlight::Add(const std::string& key,
                                     const std::shared_ptr<grpc::ClientContext>& ctx,
                                     const std::string& group) {
  absl::MutexLock lock(&mu_);
  calls_.emplace(key, Call{ctx, group});
}

void GrpcWorkerClient::InFlight::Remove(const std::string& key, const grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  auto [begin, end] = calls_.equal_range(key);
  for (auto it = begin; it != end; ++it) {
    if (it->second.ctx.lock().get() == ctx) {
      calls_.erase(it);
      return;
    }
  }
}

void GrpcWorkerClient::InFlight::CancelAll(const std::string& key) {
  std::vector<std::shared_ptr<grpc::ClientContext>> calls;
  {
    absl::MutexLock lock(&mu_);
    std::set<std::string> groups;
    auto [begin, end] = calls_.equal_range(key);
    for (auto it = begin; it != end; ++it) {
      if (!it->second.group.empty()) groups.insert(it->second.group);
    }
    for (const auto& [k, call] : calls_) {
      if (k != key && !groups.contains(call.group)) continue;
      if (auto live = call.ctx.lock()) calls.push_back(std::move(live));
    }
  }
  for (const auto& ctx : calls) ctx->TryCancel();
}

void GrpcWorkerClient::CancelCalls(const WorkerTarget& target) {
  in_flight_->CancelAll(InFlight::KeyOf(target));
}

GrpcWorkerClient::Channel::Channel(std::shared_ptr<grpc::Channel> c)
    : channel(std::move(c)),
      stub(v1::WorkerReplicas::NewStub(channel)),
      write_replicas(FullMethodName(v1::WorkerReplicas::service_full_name(), "WriteReplicas"),
                     grpc::internal::RpcMethod::CLIENT_STREAMING, channel),
      read_replica(FullMethodName(v1::WorkerReplicas::service_full_name(), "ReadReplica"),
                   grpc::internal::RpcMethod::SERVER_STREAMING, channel) {}

const GrpcWorkerClient::Channel& GrpcWorkerClient::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Channel>& c = channels_[address];
  if (c == nullptr) c = std::make_unique<Channel>(OpenChannel(address, options_.security));
  return *c;
}

v1::WorkerReplicas::Stub* GrpcWorkerClient::StubFor(const std::string& address) {
  return ChannelTo(address).stub.get();
}

void GrpcWorkerClient::WriteReplicasAsync(const WorkerTarget& target,
                                          const std::vector<ReplicaWrite>& writes, Done done) {
  uint64_t bytes = 0;
  bool all_small = true;
  for (const ReplicaWrite& w : writes) {
    bytes += w.value->bytes.size();
    all_small &= !w.collective && w.value->bytes.size() <= kMaxInlineBytes;
  }
  const absl::Time deadline =
      absl::Now() + options_.base_deadline +
      absl::Seconds(static_cast<double>(bytes) / options_.min_bytes_per_second);
  if (all_small && bytes <= kMaxUnaryBytes) {
    // One message, one unary call: far cheaper than a stream for small writes.
    using Call = UnaryCall<v1::WriteSmallReplicasRequest, v1::WriteReplicasResponse, Done>;
    auto* call = new Call(in_flight_, target);
    call->ctx->set_deadline(absl::ToChronoTime(deadline));
    SmallWritesToProto(target.incarnation, writes, &call->req);
    call->done = std::move(done);
    StubFor(target.address)
        ->async()
        ->WriteSmallReplicas(call->ctx.get(), &call->req, &call->resp,
                             [call, target](grpc::Status s) {
                               std::move(call->done)(Named(target, FromGrpcStatus(s)));
                               delete call;
                             });
    return;
  }
  auto* call =
      new WriteCall(target, writes, options_.chunk_bytes, deadline, std::move(done), in_flight_);
  call->Start(ChannelTo(target.address));
}

void GrpcWorkerClient::ReadReplicaAsync(const WorkerTarget& target, uint64_t variable_id,
                                        int32_t replica, int64_t min_version, ReadDone done) {
  v1::ReadReplicaRequest req;
  req.set_variable_id(variable_id);
  req.set_replica(replica);
  req.set_min_version(min_version);
  req.set_chunk_bytes(static_cast<int64_t>(options_.chunk_bytes));
  auto* call =
      new ReadCall(target, absl::Now() + options_.base_deadline, std::move(done), in_flight_);
  call->Start(ChannelTo(target.address), req);
}

void GrpcWorkerClient::DropVariableAsync(const WorkerTarget& target, uint64_t variable_id,
                                         Done done) {
  using Call = UnaryCall<v1::DropVariableRequest, v1::DropVariableResponse, Done>;
  auto* call = new Call(in_flight_, target);
  call->ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.base_deadline));
  call->req.set_incarnation(target.incarnation);
  call->req.set_variable_id(variable_id);
  call->done = std::move(done);
  StubFor(target.address)
      ->async()
      ->DropVariable(call->ctx.get(), &call->req, &call->resp, [call, target](grpc::Status s) {
        std::move(call->done)(Named(target, FromGrpcStatus(s)));
        delete call;
      });
}

void GrpcWorkerClient::ListReplicasAsync(const WorkerTarget& target, uint64_t fence_floor,
                                         absl::Time deadline, ListDone done) {
  using Call = UnaryCall<v1::GetReplicaStatusRequest, v1::GetReplicaStatusResponse, ListDone>;
  auto* call = new Call(in_flight_, target);
  call->ctx->set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + options_.base_deadline)));
  call->req.set_fence_floor(fence_floor);
  call->req.set_incarnation(target.incarnation);
  call->done = std::move(done);
  StubFor(target.address)
      ->async()
      ->GetReplicaStatus(call->ctx.get(), &call->req, &call->resp, [call, target](grpc::Status s) {
        absl::StatusOr<std::vector<HeldReplica>> out;
        if (!s.ok()) {
          out = Named(target, FromGrpcStatus(s));
        } else if (call->resp.incarnation() != target.incarnation) {
          out = Named(target,
                      absl::AbortedError(absl::StrCat("incarnation ", call->resp.incarnation(),
                                                      " answered, not ", target.incarnation)));
        } else {
          std::vector<HeldReplica> held;
          for (const v1::LocalReplica& r : call->resp.replicas()) {
            held.push_back(HeldReplica{r.variable_id(), r.replica(), r.version(), r.checksum()});
          }
          out = std::move(held);
        }
        std::move(call->done)(std::move(out));
        delete call;
      });
}

}  // namespace repvar::server

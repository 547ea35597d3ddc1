// SPDX-License-Identifier: Apache-2.0
// The client's internals, shared by its .cc files. Not part of the public
// API (gRPC types live here, never in client/include).
#ifndef REPVAR_CLIENT_CLIENT_IMPL_H_
#define REPVAR_CLIENT_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/mapping_cache.h"
#include "client/retry.h"
#include "common/model/step.h"
#include "common/rpc/chunk_frame.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/security.h"
#include "common/tensor/local_read_table.h"
#include "common/tensor/tensor.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"

namespace repvar {

// One Client's channel to the coordinator (its trainer- and admin-facing
// services), its channels to the workers it steps through, its retry policy
// and what it caches: variable specs and the last step layout. Thread-safe.
class Client::Impl {
 public:
  Impl(ClientOptions options, ChannelSecurity security)
      : options_(std::move(options)),
        security_(std::move(security)),
        retry_(options_.max_attempts, options_.initial_backoff, RealClock::Get()),
        mappings_(options_.mapping_cache_bytes) {
    channel_ = OpenChannel(options_.coordinator_address, security_);
    trainers_ = v1::CoordinatorTrainers::NewStub(channel_);
    admin_ = v1::CoordinatorAdmin::NewStub(channel_);
    assign_variable_ = std::make_unique<grpc::internal::RpcMethod>(
        FullMethodName(v1::CoordinatorTrainers::service_full_name(), "AssignVariable"),
        grpc::internal::RpcMethod::CLIENT_STREAMING, channel_);
    read_variable_ = std::make_unique<grpc::internal::RpcMethod>(
        FullMethodName(v1::CoordinatorTrainers::service_full_name(), "ReadVariable"),
        grpc::internal::RpcMethod::SERVER_STREAMING, channel_);
  }

  const ClientOptions& options() const { return options_; }
  v1::CoordinatorTrainers::Stub* stub() { return trainers_.get(); }
  v1::CoordinatorAdmin::Stub* admin() { return admin_.get(); }
  // AssignVariable as a stream of byte buffers: its chunks go out as
  // CopiedChunkFrames, one copy each instead of protobuf's two.
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> AssignVariableFrames(
      grpc::ClientContext* ctx, v1::AssignVariableResponse* resp) {
    return std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>>(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channel_.get(), *assign_variable_, ctx, resp));
  }
  // ReadVariable answered as byte buffers: its chunks are read where they
  // lie in gRPC's slices (ReadFrame) and copied once, into place.
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> ReadVariableFrames(
      grpc::ClientContext* ctx, const v1::ReadVariableRequest& req) {
    return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(),
                                                                      *read_variable_, ctx, req));
  }
  // Workers' buffers mapped by StepScope::Map, kept between leases.
  MappingCache& mappings() { return mappings_; }

  // The local read table in use (UseLocalReads); null: none.
  struct LocalTable {
    LocalTable(void* mapped, size_t bytes, LocalReadView table)
        : map(mapped), size(bytes), view(table) {}
    ~LocalTable();
    void* const map;
    const size_t size;
    const LocalReadView view;
    std::atomic<uint64_t> served{0};
    std::atomic<uint64_t> asked{0};
  };
  LocalTable* local_table() { return local_table_.load(std::memory_order_acquire); }
  // Replaces the table (the old one stays mapped until the Client goes:
  // a read may be using it).
  void set_local_table(std::unique_ptr<LocalTable> table) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    local_table_.store(table.get(), std::memory_order_release);
    local_tables_.push_back(std::move(table));
  }
  // A committed value from the local table (C8), or false / nullopt: ask
  // the coordinator. ReadLocalInto: INVALID_ARGUMENT when `out` is not the
  // value's size.
  bool ReadLocal(const std::string& name, TensorValue& value);
  std::optional<absl::StatusOr<ReadInfo>> ReadLocalInto(const std::string& name,
                                                        std::span<std::byte> out);

  // The per-attempt deadline, plus time for `bytes` at 50 MB/s.
  void SetDeadline(grpc::ClientContext* ctx, uint64_t bytes = 0) const {
    absl::Duration d = options_.deadline + absl::Seconds(static_cast<double>(bytes) / 50e6);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  }
  // See RetryPolicy: only for operations that are safe to repeat.
  template <typename F>
  absl::Status Retry(F&& attempt) {
    return retry_.Run(std::forward<F>(attempt));
  }

  // One unary call to the coordinator's trainer or admin service, retried
  // (only for calls safe to repeat), each attempt with the client's
  // deadline.
  template <typename Stub, typename Request, typename Response>
  absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& req, Response* resp) {
    Stub* stub = nullptr;
    if constexpr (std::is_same_v<Stub, v1::CoordinatorAdmin::Stub>) {
      stub = admin_.get();
    } else {
      stub = trainers_.get();
    }
    return Retry([&] {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      return FromGrpcStatus((stub->*method)(&ctx, req, resp));
    });
  }

  // The AssignVariables call (small writes and batches), retried: the
  // request id makes a repeat safe.
  absl::Status AssignVariables(const v1::AssignVariablesRequest& req,
                               v1::AssignVariablesResponse* resp) {
    return Retry([&] {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, req.ByteSizeLong());
      return FromGrpcStatus(stub()->AssignVariables(&ctx, req, resp));
    });
  }

  // The specs of variables this client has seen (writes need them).
  std::optional<TensorSpec> Spec(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = specs_.find(name);
    if (it == specs_.end()) return std::nullopt;
    return it->second;
  }
  void Remember(const VariableInfo& v) ABSL_LOCKS_EXCLUDED(mu_) {
    Remember(v.spec.name, TensorSpec{v.spec.dtype, v.spec.shape});
  }
  void Remember(const std::string& name, TensorSpec spec) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    specs_[name] = std::move(spec);
  }
  void Forget(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    specs_.erase(name);
  }

  // The last step layout seen (participants, variables and the lookup by
  // name), reused while the coordinator says it is unchanged.
  struct StepLayout {
    StepInfo info;                                 // participants, variables, layout_id
    std::map<std::string, int, std::less<>> vars;  // name -> index in info.variables
  };
  std::shared_ptr<const StepLayout> step_layout() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return step_layout_;
  }
  void set_step_layout(std::shared_ptr<const StepLayout> layout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    step_layout_ = std::move(layout);
  }

  // The trainer-facing service of the worker at `address`: its stub, and
  // StepRead answered as byte buffers (its chunks copied once, into place:
  // ReceiveFrames).
  struct WorkerLink {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::WorkerSteps::Stub> stub;
    std::unique_ptr<grpc::internal::RpcMethod> step_read;
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> StepReadFrames(
        grpc::ClientContext* ctx, const v1::StepReadRequest& req) {
      return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
          grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), *step_read,
                                                                        ctx, req));
    }
  };
  // The link to the worker at `address` (channels are kept and reused). A
  // new channel connects before its first call, within the client's
  // deadline: step calls are not retried, and a first connect lost on a
  // loaded host should not fail a step.
  WorkerLink* Worker(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<grpc::Channel> fresh;
    WorkerLink* link = nullptr;
    {
      absl::MutexLock lock(&mu_);
      std::unique_ptr<WorkerLink>& slot = workers_[address];
      if (slot == nullptr) {
        fresh = OpenChannel(address, security_);
        slot = std::make_unique<WorkerLink>();
        slot->channel = fresh;
        slot->stub = v1::WorkerSteps::NewStub(fresh);
        slot->step_read = std::make_unique<grpc::internal::RpcMethod>(
            FullMethodName(v1::WorkerSteps::service_full_name(), "StepRead"),
            grpc::internal::RpcMethod::SERVER_STREAMING, fresh);
      }
      link = slot.get();
    }
    if (fresh != nullptr) {
      (void)fresh->WaitForConnected(absl::ToChronoTime(absl::Now() + options_.deadline));
    }
    return link;
  }

 private:
  const ClientOptions options_;
  const ChannelSecurity security_;
  const client_internal::RetryPolicy retry_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::internal::RpcMethod> assign_variable_;
  std::unique_ptr<grpc::internal::RpcMethod> read_variable_;
  std::unique_ptr<v1::CoordinatorTrainers::Stub> trainers_;
  std::unique_ptr<v1::CoordinatorAdmin::Stub> admin_;
  MappingCache mappings_;

  // State below is protected by mu_.
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, TensorSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<WorkerLink>> workers_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const StepLayout> step_layout_ ABSL_GUARDED_BY(mu_);
  std::atomic<LocalTable*> local_table_{nullptr};
  std::vector<std::unique_ptr<LocalTable>> local_tables_ ABSL_GUARDED_BY(mu_);
};

// How the library's step code reaches a Client's internals.
struct ClientAccess {
  using Impl = Client::Impl;
  static Impl& Of(Client& c) { return *c.impl_; }
};

}  // namespace repvar

#endif  // REPVAR_CLIENT_CLIENT_IMPL_H_

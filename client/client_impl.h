// SPDX-License-Identifier: Apache-2.0
// The client's internals, shared by client.cc and step_scope.cc. Not part of
// the public API (gRPC types live here, never in client/include).
#ifndef REPVAR_CLIENT_CLIENT_IMPL_H_
#define REPVAR_CLIENT_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/channel.h"
#include "common/rpc/grpc_status.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"

namespace repvar {

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {
    stub_ = v1::Coordinator::NewStub(OpenChannel(options_.coordinator_address));
  }

  const ClientOptions& options() const { return options_; }
  v1::Coordinator::Stub* stub() { return stub_.get(); }

  void SetDeadline(grpc::ClientContext* ctx, uint64_t bytes = 0) const {
    absl::Duration d = options_.deadline + absl::Seconds(static_cast<double>(bytes) / 50e6);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  }

  // Runs `attempt` until it succeeds, fails with a code other than
  // UNAVAILABLE, or runs out of attempts. Only call it for operations that
  // are safe to repeat (reads, or writes carrying one request id).
  template <typename F>
  absl::Status Retry(F&& attempt) {
    absl::Duration backoff = options_.initial_backoff;
    absl::Status s;
    for (int i = 0; i < std::max(1, options_.max_attempts); ++i) {
      s = attempt();
      if (!absl::IsUnavailable(s)) return s;
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
    }
    return s;
  }

  struct CachedSpec {
    DType dtype;
    std::vector<int64_t> shape;
  };
  std::optional<CachedSpec> Spec(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto it = specs_.find(name);
    if (it == specs_.end()) return std::nullopt;
    return it->second;
  }
  void Remember(const VariableInfo& v) {
    absl::MutexLock lock(&mu_);
    specs_[v.spec.name] = CachedSpec{v.spec.dtype, v.spec.shape};
  }
  // The last step layout seen (participants, variables and the lookup by
  // name), reused while the coordinator says it is unchanged.
  struct StepLayout {
    v1::StepInfo info;                             // participants, variables, layout_id
    std::map<std::string, int, std::less<>> vars;  // name -> index in info.variables
  };
  std::shared_ptr<const StepLayout> step_layout() {
    absl::MutexLock lock(&mu_);
    return step_layout_;
  }
  void set_step_layout(std::shared_ptr<const StepLayout> layout) {
    absl::MutexLock lock(&mu_);
    step_layout_ = std::move(layout);
  }

  // A stub for the worker at `address` (channels are kept and reused).
  v1::Worker::Stub* WorkerStub(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto& stub = workers_[address];
    if (stub == nullptr) stub = v1::Worker::NewStub(OpenChannel(address));
    return stub.get();
  }
  void Forget(const std::string& name) {
    absl::MutexLock lock(&mu_);
    specs_.erase(name);
  }

 private:
  const ClientOptions options_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, CachedSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<v1::Worker::Stub>> workers_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const StepLayout> step_layout_ ABSL_GUARDED_BY(mu_);
};

// How the library's step code (step_scope.cc) reaches a Client's internals.
struct ClientAccess {
  using Impl = Client::Impl;
  static Impl& Of(Client& c) { return *c.impl_; }
};

}  // namespace repvar

#endif  // REPVAR_CLIENT_CLIENT_IMPL_H_

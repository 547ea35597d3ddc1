// SPDX-License-Identifier: Apache-2.0
// Starting a daemon's gRPC server the same way everywhere. Header-only so that
// repvar_common never links gRPC; only *_main.cc include it.
#ifndef REPVAR_COMMON_GRPC_SERVER_H_
#define REPVAR_COMMON_GRPC_SERVER_H_

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/resource_quota.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/daemon.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/security.h"
#include "spdlog/spdlog.h"

namespace repvar {

// A service a daemon serves, with its full name ("repvar.v1.WorkerSteps"),
// under which grpc.health.v1 reports it.
struct ServedService {
  grpc::Service* service;
  std::string name;
};

// The daemon's gRPC listener, and optionally a plaintext listener serving
// grpc.health.v1 and nothing else (--health_address: probes that cannot
// speak TLS, such as Kubernetes' grpc probe). Both answer the same health:
//
//   name                 SERVING
//   ""                   ready (SetServing(true)), not draining, not stopping
//   each served service  as "" unless the daemon says otherwise (drain)
//   "liveness"           from Start until StopServing: a draining or not yet
//                        ready daemon is alive
//   anything else        NOT_FOUND
//
// Thread-safe.
class DaemonServer {
 public:
  // Serves `services`, grpc.health.v1 and server reflection (grpcurl-style
  // listing) on `security.address` with its credentials (every call checked
  // by its policy, see security.h); port 0 picks a free port, written to
  // `port_file` (when set) atomically. Messages may be up to 64 MiB (tensors
  // stream in chunks far below that). `max_threads` > 0 bounds the threads
  // of the synchronous methods: a call beyond them is refused with
  // RESOURCE_EXHAUSTED instead of costing another thread (callback methods
  // do not count). Errors: UNAVAILABLE (cannot listen, e.g. the port is in
  // use), INTERNAL (port file).
  static absl::StatusOr<std::unique_ptr<DaemonServer>> Start(const ServerSecurity& security,
                                                             std::vector<ServedService> services,
                                                             const std::string& port_file,
                                                             int max_threads = 0,
                                                             const SideListenerFlags& health = {}) {
    auto d = std::unique_ptr<DaemonServer>(new DaemonServer(std::move(services)));
    const std::string& address = security.address;
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    if (max_threads > 0) {
      grpc::ResourceQuota quota("repvar-rpc-threads");
      quota.SetMaxThreads(max_threads);
      builder.SetResourceQuota(quota);
    }
    // A synchronous method's thread goes back to waiting for calls instead of
    // exiting while fewer than 64 wait (gRPC's default keeps 2): a step's
    // burst of BeginStep calls, one per trainer, otherwise creates and joins
    // a thread each, every step.
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 64);
    builder.AddListeningPort(address, ServerCredentialsFor(security), &d->port_);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    // gRPC sets SO_REUSEPORT by default: a second daemon on a busy port would
    // start and share it. A busy port is a startup error instead.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // Our channels' keepalive pings (credentials.h) are welcome.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(kMinPingInterval)));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    for (const ServedService& s : d->services_) builder.RegisterService(s.service);
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counting;
    counting.push_back(std::make_unique<RpcMetricsFactory>());
    builder.experimental().SetInterceptorCreators(std::move(counting));
    d->server_ = builder.BuildAndStart();
    if (d->server_ == nullptr || d->port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
    }
    if (!health.address.empty()) {
      grpc::ServerBuilder hb;
      int health_port = 0;
      hb.AddListeningPort(health.address, grpc::InsecureServerCredentials(), &health_port);
      hb.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
      hb.SetOption(std::make_unique<WithoutPlugins>());  // no reflection here
      // gRPC wants a polled completion queue on a server without methods of
      // its own (the default health service is added to it).
      d->health_cq_ = hb.AddCompletionQueue();
      d->health_ = hb.BuildAndStart();
      d->health_cq_thread_ = std::thread([cq = d->health_cq_.get()] {
        void* tag;
        bool ok;
        while (cq->Next(&tag, &ok)) {
        }
      });
      if (d->health_ == nullptr || health_port == 0) {
        return absl::UnavailableError(absl::StrCat("cannot listen on ", health.address));
      }
      spdlog::info("grpc.health.v1 alone, in plaintext, on {}:{}",
                   health.address.substr(0, health.address.rfind(':')), health_port);
      if (!health.port_file.empty()) {
        if (absl::Status s = WritePortFile(health.port_file, health_port); !s.ok()) return s;
      }
    }
    d->SetServing(false);
    d->ForEachHealth([](grpc::HealthCheckServiceInterface& h) {
      h.SetServingStatus(std::string(kLivenessService), true);
    });
    if (!port_file.empty()) {
      if (absl::Status s = WritePortFile(port_file, d->port_); !s.ok()) return s;
    }
    return d;
  }

  static constexpr absl::string_view kLivenessService = "liveness";

  int port() const { return port_; }

  // "" and every served service SERVING (ready) or NOT_SERVING.
  void SetServing(bool serving) {
    std::vector<std::string> names;
    for (const ServedService& s : services_) names.push_back(s.name);
    SetServing(names, serving);
  }
  // "" and the services named; the others keep their status.
  void SetServing(const std::vector<std::string>& services, bool serving) {
    ForEachHealth([&](grpc::HealthCheckServiceInterface& h) {
      h.SetServingStatus("", serving);
      for (const std::string& name : services) h.SetServingStatus(name, serving);
    });
  }
  // From SIGTERM on: every name NOT_SERVING ("liveness" too), for good.
  void StopServing() {
    ForEachHealth([](grpc::HealthCheckServiceInterface& h) { h.Shutdown(); });
  }
  // New calls refused; calls in flight get until `deadline`, then are
  // cancelled. Returns once every listener has stopped.
  void Shutdown(absl::Time deadline) {
    if (health_ != nullptr) health_->Shutdown(absl::ToChronoTime(deadline));
    server_->Shutdown(absl::ToChronoTime(deadline));
    server_->Wait();
    if (health_ != nullptr) health_->Wait();
    StopHealthQueue();
  }

  ~DaemonServer() {
    if (health_ != nullptr) health_->Shutdown();  // before its queue; a no-op when done
    StopHealthQueue();
  }

 private:
  // Removes every builder plugin (server reflection) from a server.
  class WithoutPlugins final : public grpc::ServerBuilderOption {
   public:
    void UpdateArguments(grpc::ChannelArguments*) override {}
    void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
      plugins->clear();
    }
  };

  explicit DaemonServer(std::vector<ServedService> services) : services_(std::move(services)) {}

  void StopHealthQueue() {
    if (!health_cq_thread_.joinable()) return;
    health_cq_->Shutdown();
    health_cq_thread_.join();
  }

  template <typename F>
  void ForEachHealth(F f) {
    for (grpc::Server* s : {server_.get(), health_.get()}) {
      if (s == nullptr) continue;
      if (grpc::HealthCheckServiceInterface* h = s->GetHealthCheckService()) f(*h);
    }
  }

  const std::vector<ServedService> services_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  // The queue outlives the server polled through it (members go in reverse).
  std::unique_ptr<grpc::ServerCompletionQueue> health_cq_;
  std::unique_ptr<grpc::Server> health_;  // null without --health_address
  std::thread health_cq_thread_;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_GRPC_SERVER_H_

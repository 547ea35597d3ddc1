// SPDX-License-Identifier: Apache-2.0
// Starting a daemon's gRPC server the same way everywhere. Header-only so that
// repvar_common never links gRPC; only *_main.cc include it.
#ifndef REPVAR_COMMON_GRPC_SERVER_H_
#define REPVAR_COMMON_GRPC_SERVER_H_

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/daemon.h"
#include "common/rpc/metrics_server.h"
#include "common/rpc/security.h"

namespace repvar {

// A service a daemon serves, with its full name ("repvar.v1.WorkerSteps"),
// under which grpc.health.v1 reports it.
struct ServedService {
  grpc::Service* service;
  std::string name;
};

// grpc.health.v1 reports the whole server ("") and each of `services`
// SERVING or NOT_SERVING; other services keep their status. Thread-safe.
inline void SetServing(grpc::Server& server, const std::vector<ServedService>& services,
                       bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  for (const ServedService& s : services) health->SetServingStatus(s.name, serving);
}

// Serves `services`, grpc.health.v1 and server reflection (grpcurl-style
// listing) on `security.address` with its credentials (every call checked by
// its policy, see security.h); port 0 picks a free port, returned in `*port` and,
// when `port_file` is set, written there atomically. Health says
// NOT_SERVING until the daemon calls SetServing(..., true) (ready), and again
// from HealthCheckServiceInterface::Shutdown (draining). Messages may be up
// to 64 MiB (tensors stream in chunks far below that). `max_threads` > 0
// bounds the threads of the synchronous methods: a call beyond them is
// refused with RESOURCE_EXHAUSTED instead of costing another thread
// (callback methods do not count). Errors: UNAVAILABLE (cannot listen, e.g.
// the port is in use), INTERNAL (port file).
inline absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const ServerSecurity& security, const std::vector<ServedService>& services,
    const std::string& port_file, int* port, int max_threads = 0) {
  const std::string& address = security.address;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (max_threads > 0) {
    grpc::ResourceQuota quota("repvar-rpc-threads");
    quota.SetMaxThreads(max_threads);
    builder.SetResourceQuota(quota);
  }
  builder.AddListeningPort(address, ServerCredentialsFor(security), port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // gRPC sets SO_REUSEPORT by default: a second daemon on a busy port would
  // start and share it. A busy port is a startup error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (const ServedService& s : services) builder.RegisterService(s.service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counting;
  counting.push_back(std::make_unique<RpcMetricsFactory>());
  builder.experimental().SetInterceptorCreators(std::move(counting));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  SetServing(*server, services, false);
  if (!port_file.empty()) {
    absl::Status s = WritePortFile(port_file, *port);
    if (!s.ok()) return s;
  }
  return server;
}

}  // namespace repvar

#endif  // REPVAR_COMMON_GRPC_SERVER_H_

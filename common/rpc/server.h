// SPDX-License-Identifier: Apache-2.0
// Starting a daemon's gRPC server the same way everywhere. Header-only so that
// repvar_common never links gRPC; only *_main.cc include it.
#ifndef REPVAR_COMMON_GRPC_SERVER_H_
#define REPVAR_COMMON_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/daemon.h"

namespace repvar {

// Serves `services` (and grpc.health.v1) on `address`; port 0 picks a free
// port, returned in `*port` and, when `port_file` is set, written there
// atomically. Messages may be up to 64 MiB (tensors stream in chunks far
// below that). `max_threads` > 0 bounds the threads of the synchronous
// methods: a call beyond them is refused with RESOURCE_EXHAUSTED instead of
// costing another thread (callback methods do not count). Errors:
// UNAVAILABLE (cannot listen, e.g. the port is in use), INTERNAL (port
// file).
inline absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const std::string& port_file, int* port, int max_threads = 0) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (max_threads > 0) {
    grpc::ResourceQuota quota("repvar-rpc-threads");
    quota.SetMaxThreads(max_threads);
    builder.SetResourceQuota(quota);
  }
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  // gRPC sets SO_REUSEPORT by default: a second daemon on a busy port would
  // start and share it. A busy port is a startup error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  if (!port_file.empty()) {
    absl::Status s = WritePortFile(port_file, *port);
    if (!s.ok()) return s;
  }
  return server;
}

}  // namespace repvar

#endif  // REPVAR_COMMON_GRPC_SERVER_H_

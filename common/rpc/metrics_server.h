// SPDX-License-Identifier: Apache-2.0
// What a daemon shows operators over HTTP (cpp-httplib): /metrics, the
// process's Metrics in the Prometheus text format, /healthz, 200 while the
// daemon is ready and 503 otherwise, and whatever routes the daemon adds
// (the coordinator's web view). HTTPS with the daemon's own certificate when
// it serves gRPC over TLS. And the gRPC interceptor that counts every call.
#ifndef REPVAR_COMMON_RPC_METRICS_SERVER_H_
#define REPVAR_COMMON_RPC_METRICS_SERVER_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_interceptor.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/base/memory_budget.h"
#include "common/rpc/security.h"

namespace httplib {
class Server;
}

namespace repvar {

// Counts each call by method and status code (repvar_rpc_requests_total)
// and times it by method (repvar_rpc_duration_seconds), from the first
// metadata to the status sent; and writes its access log line ("rpc
// request_id=... method=... code=... ms=...": DEBUG, WARN when it failed on
// this side) with the caller's "x-request-id" (else a fresh one), which goes
// back in the trailing metadata and, for the handler, replaces the caller's
// in the call's client metadata (RequestIdOf). Calls the access policy
// refused never get here (repvar_auth_refused_total counts them).
class RpcMetricsFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcMetricsFactory();
  ~RpcMetricsFactory() override;

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

  // One method's series, looked up in the registry once and kept: a call
  // counts itself with no registry lock, label string or allocation.
  struct Method;

 private:
  Method* For(absl::string_view method) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Method>> methods_ ABSL_GUARDED_BY(mu_);
};

inline constexpr char kRequestIdKey[] = "x-request-id";

// The call's request id, as RpcMetricsFactory made it ("" on a server
// without it). Handlers log under it: ScopedRequestId(RequestIdOf(*ctx)).
std::string RequestIdOf(const grpc::ServerContextBase& ctx);

// A GET as a route's handler sees it, and its answer: no HTTP library in
// the handlers (they are tested without sockets).
struct HttpRequest {
  std::string path;
  std::string authorization;  // the Authorization header, "" when none
};
struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};
struct HttpRoute {
  std::string path;  // exact
  std::function<HttpResponse(const HttpRequest&)> handler;
};

struct HttpOptions {
  std::function<bool()> ready;  // answers /healthz
  std::vector<HttpRoute> routes;
  // The daemon's certificate and key (the same copies its gRPC listener
  // reads, so SIGHUP rotates both): HTTPS. Null: plain HTTP.
  std::shared_ptr<ReloadableCertificates> certificates;
};

class MetricsServer {
 public:
  // Serves on `address` ("127.0.0.1:0" picks a port). Errors: UNAVAILABLE
  // (cannot listen), INVALID_ARGUMENT (bad address).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              HttpOptions options);
  ~MetricsServer();  // stops serving
  int port() const { return port_; }
  bool https() const { return https_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::shared_ptr<ReloadableCertificates> certificates_;  // the handshakes read them
  int port_ = 0;
  bool https_ = false;
};

// repvar_inflight_bytes{of=used|limit}: what `budget` lends now, and its
// size. RemoveGauge("repvar_inflight_bytes") before `budget` goes.
void SetInflightBytesGauge(const MemoryBudget* budget);

// What both daemons do with --metrics_address and --metrics_port_file: no
// server when the address is empty (the default), else one started, its
// URL logged and its port written to the port file. Errors as Start, and
// the port file's.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartDaemonMetrics(HttpOptions options);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_METRICS_SERVER_H_

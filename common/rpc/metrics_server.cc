// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/metrics_server.h"

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <array>
#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/daemon.h"
#include "common/base/metrics.h"
#include "common/base/random.h"
#include "spdlog/spdlog.h"

namespace repvar {
namespace {

// The daemon's certificate and key for each handshake, read from the copies
// gRPC reads too: a SIGHUP that rotates them reaches both listeners. A read
// between the copies' renames (a new key, the old certificate) fails the
// check and is read once more.
bool UseDaemonCertificate(SSL_CTX* ctx, const std::shared_ptr<ReloadableCertificates>& certs) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(
      ctx,
      [](SSL* ssl, void* arg) -> int {
        const auto* copies = static_cast<const ReloadableCertificates*>(arg);
        for (int attempt = 0; attempt < 2; ++attempt) {
          if (SSL_use_certificate_chain_file(ssl, copies->cert_path().c_str()) == 1 &&
              SSL_use_PrivateKey_file(ssl, copies->key_path().c_str(), SSL_FILETYPE_PEM) == 1 &&
              SSL_check_private_key(ssl) == 1) {
            return 1;
          }
          ERR_clear_error();
        }
        return 0;
      },
      certs.get());
  return true;
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

struct RpcMetricsFactory::Method {
  explicit Method(std::string method)
      : name(std::move(method)),
        duration(Metrics::Global().GetHistogram(
            "repvar_rpc_duration_seconds", "gRPC call latency, by method", {{"method", name}})) {}

  Counter& Calls(grpc::StatusCode code) {
    const auto i = static_cast<size_t>(code);
    if (i >= calls.size()) return Series(code);  // not a code gRPC defines
    Counter* c = calls[i].load(std::memory_order_acquire);
    if (c == nullptr) {
      c = &Series(code);  // the registry returns the same one to a racing call
      calls[i].store(c, std::memory_order_release);
    }
    return *c;
  }

  const std::string name;
  Histogram& duration;

 private:
  Counter& Series(grpc::StatusCode code) {
    return Metrics::Global().GetCounter("repvar_rpc_requests_total",
                                        "gRPC calls served, by method and status code",
                                        {{"method", name}, {"code", CodeName(code)}});
  }

  std::array<std::atomic<Counter*>, 17> calls{};  // by code: OK .. UNAUTHENTICATED
};

namespace {

class RpcMetrics : public grpc::experimental::Interceptor {
 public:
  explicit RpcMetrics(RpcMetricsFactory::Method* method) : method_(method), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_INITIAL_METADATA)) {
      auto* metadata = methods->GetRecvInitialMetadata();
      auto it = metadata->find(kRequestIdKey);
      if (it != metadata->end() && it->second.size() <= 64) {
        request_id_.assign(it->second.data(), it->second.size());
        // Printable ASCII only: it goes on log lines.
        for (char& c : request_id_) c = (c > ' ' && c < 127) ? c : '?';
      }
      if (request_id_.empty()) request_id_ = absl::StrFormat("%016x", RandomNonZero64());
      // The handler sees this one (RequestIdOf); request_id_ outlives the call.
      metadata->erase(kRequestIdKey);
      metadata->emplace(kRequestIdKey, request_id_);
    }
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;  // or the end of a stream: see below
    }
    if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      // gRPC answers a request that does not parse itself, with INTERNAL or
      // UNIMPLEMENTED and no message (every status of repvar's handlers has
      // one): named here, as every other bad input is.
      if (unparsed_ && methods->GetSendStatus().error_message().empty() &&
          (methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL ||
           methods->GetSendStatus().error_code() == grpc::StatusCode::UNIMPLEMENTED)) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request does not parse as the input of ", method_->name)));
      }
      const grpc::Status status = methods->GetSendStatus();
      if (request_id_.empty()) request_id_ = absl::StrFormat("%016x", RandomNonZero64());
      methods->GetSendTrailingMetadata()->emplace(kRequestIdKey, request_id_);
      // The access log: every call at DEBUG; at WARN those that failed on
      // this side (not a caller's mistake or choice).
      const absl::Duration took = absl::Now() - start_;
      const bool ours = status.error_code() == grpc::StatusCode::INTERNAL ||
                        status.error_code() == grpc::StatusCode::UNKNOWN ||
                        status.error_code() == grpc::StatusCode::DATA_LOSS ||
                        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      const spdlog::level::level_enum level = ours ? spdlog::level::warn : spdlog::level::debug;
      if (spdlog::should_log(level)) {
        spdlog::log(level, "rpc request_id={} method={} code={} ms={:.2f}{}{}", request_id_,
                    method_->name, CodeName(status.error_code()), absl::ToDoubleMilliseconds(took),
                    status.ok() ? "" : " error=", status.error_message());
      }
      method_->Calls(status.error_code()).Add();
      method_->duration.Observe(took);
    }
    methods->Proceed();
  }

 private:
  RpcMetricsFactory::Method* const method_;
  const absl::Time start_;
  std::string request_id_;
  bool unparsed_ = false;  // a message was not received, or did not parse
};

}  // namespace

std::string RequestIdOf(const grpc::ServerContextBase& ctx) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kRequestIdKey);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

RpcMetricsFactory::RpcMetricsFactory() = default;
RpcMetricsFactory::~RpcMetricsFactory() = default;

RpcMetricsFactory::Method* RpcMetricsFactory::For(absl::string_view method) {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = methods_.find(method);
    if (it != methods_.end()) return it->second.get();
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Method>& slot = methods_[method];
  if (slot == nullptr) slot = std::make_unique<Method>(std::string(method));
  return slot.get();
}

grpc::experimental::Interceptor* RpcMetricsFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  // Methods of repvar's and gRPC's own services are labels; anything else a
  // caller names is "other" (no unbounded series).
  const absl::string_view method = info->method() == nullptr ? "" : info->method();
  const bool known = absl::StartsWith(method, "/repvar.v1.") || absl::StartsWith(method, "/grpc.");
  return new RpcMetrics(For(known && method.size() <= 128 ? method : "other"));
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    HttpOptions options) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("not host:port: ", address));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  if (options.certificates != nullptr) {
    auto https = std::make_unique<httplib::SSLServer>(
        [certs = options.certificates](SSL_CTX& ctx) { return UseDaemonCertificate(&ctx, certs); });
    if (!https->is_valid()) return absl::InternalError("cannot set up TLS for HTTP");
    server->http_ = std::move(https);
  } else {
    server->http_ = std::make_unique<httplib::Server>();
  }
  server->http_->Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(Metrics::Global().Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server->http_->Get("/healthz", [ready = std::move(options.ready)](const httplib::Request&,
                                                                    httplib::Response& res) {
    const bool ok = ready();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "SERVING\n" : "NOT_SERVING\n", "text/plain");
  });
  for (HttpRoute& route : options.routes) {
    server->http_->Get(route.path, [handler = std::move(route.handler)](const httplib::Request& req,
                                                                        httplib::Response& res) {
      const HttpResponse out =
          handler(HttpRequest{req.path, req.get_header_value("Authorization")});
      res.status = out.status;
      for (const auto& [name, value] : out.headers) res.set_header(name, value);
      res.set_content(out.body, out.content_type);
    });
  }
  server->https_ = options.certificates != nullptr;
  server->certificates_ = std::move(options.certificates);
  server->port_ = port == 0 ? server->http_->bind_to_any_port(host)
                            : (server->http_->bind_to_port(host, port) ? port : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  }
  server->thread_ = std::thread([http = server->http_.get()] { http->listen_after_bind(); });
  return server;
}

MetricsServer::~MetricsServer() {
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

void SetInflightBytesGauge(const MemoryBudget* budget) {
  Metrics::Global().SetGauge("repvar_inflight_bytes",
                             "memory lent to tensors being received, and its limit", [budget] {
                               return std::vector<std::pair<MetricLabels, double>>{
                                   {{{"of", "used"}}, static_cast<double>(budget->used())},
                                   {{{"of", "limit"}}, static_cast<double>(budget->capacity())}};
                             });
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartDaemonMetrics(HttpOptions options) {
  const SideListenerFlags flags = GetMetricsFlags();
  if (flags.address.empty()) return std::unique_ptr<MetricsServer>();
  auto server = MetricsServer::Start(flags.address, std::move(options));
  if (!server.ok()) return server.status();
  spdlog::info("metrics on {}://{}:{}/metrics", (*server)->https() ? "https" : "http",
               flags.address.substr(0, flags.address.rfind(':')), (*server)->port());
  if (!flags.port_file.empty()) {
    if (absl::Status s = WritePortFile(flags.port_file, (*server)->port()); !s.ok()) return s;
  }
  return server;
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/web_view.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/daemon.h"
#include "server/rpc/cluster_status.h"

namespace repvar::server {

extern const char kWebIndexHtml[];  // server/web/index.html (web_assets.cc, generated)

namespace {

// Everything the view answers: never cached, never framed, nothing loaded
// from elsewhere.
void AddCommonHeaders(HttpResponse* res) {
  res->headers.push_back({"Cache-Control", "no-store"});
  res->headers.push_back({"X-Content-Type-Options", "nosniff"});
  res->headers.push_back({"X-Frame-Options", "DENY"});
  res->headers.push_back(
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "connect-src 'self'; img-src data:; frame-ancestors 'none'"});
}

HttpResponse Text(int status, std::string body) {
  HttpResponse res;
  res.status = status;
  res.body = std::move(body);
  AddCommonHeaders(&res);
  return res;
}

}  // namespace

std::string WebViewRefusal(absl::string_view http_address, bool tls, bool admin_token_file) {
  if (IsLoopback(http_address)) return "";
  if (!tls) {
    return absl::StrCat("the web view is off: --metrics_address=", http_address,
                        " is not a loopback address, and the coordinator serves without TLS "
                        "(give it --tls_cert, --tls_key, --tls_ca and --admin_token_file)");
  }
  if (!admin_token_file) {
    return absl::StrCat("the web view is off: --metrics_address=", http_address,
                        " is not a loopback address, and no --admin_token_file says who may "
                        "look");
  }
  return "";
}

std::vector<HttpRoute> WebView::Routes() const {
  return {{"/", [this](const HttpRequest& req) { return Page(req); }},
          {"/api/state", [this](const HttpRequest& req) { return State(req); }}};
}

HttpResponse WebView::Page(const HttpRequest&) const {
  if (!refusal_.empty()) return Text(403, refusal_ + "\n");
  HttpResponse res = Text(200, kWebIndexHtml);
  res.content_type = "text/html; charset=utf-8";
  return res;
}

HttpResponse WebView::State(const HttpRequest& req) const {
  if (!refusal_.empty()) return Text(403, refusal_ + "\n");
  // As if the caller made an admin call with this token.
  CallerCredentials caller;
  caller.method = "/repvar.v1.CoordinatorAdmin/GetClusterStatus";
  constexpr absl::string_view kBearer = "Bearer ";
  if (req.authorization.size() > kBearer.size() &&
      absl::StartsWithIgnoreCase(req.authorization, kBearer)) {
    caller.token = absl::string_view(req.authorization).substr(kBearer.size());
  }
  if (absl::StatusOr<Admission> admitted = policy_->Authorize(caller); !admitted.ok()) {
    const bool unauthenticated = admitted.status().code() == absl::StatusCode::kUnauthenticated;
    HttpResponse res = Text(unauthenticated ? 401 : 403,
                            absl::StrCat(unauthenticated ? "the web view needs the admin token"
                                                         : "this token may not see the web view",
                                         ": ", admitted.status().message(), "\n"));
    if (unauthenticated) res.headers.push_back({"WWW-Authenticate", "Bearer realm=\"repvar\""});
    return res;
  }
  v1::ClusterStatus status;
  ClusterStatusToProto(core_, scalars_, kMaxVariables, &status);
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  HttpResponse res = Text(200, "");
  if (!google::protobuf::util::MessageToJsonString(status, &res.body, options).ok()) {
    return Text(500, "cannot encode the cluster status\n");
  }
  res.content_type = "application/json";
  return res;
}

}  // namespace repvar::server

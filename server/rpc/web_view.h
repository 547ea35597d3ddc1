// SPDX-License-Identifier: Apache-2.0
// The coordinator's web view, on its metrics listener: `/` is one page
// (server/web/index.html, built into the binary: no CDN, no build step)
// that polls `/api/state`, the cluster status as repvarctl status gets it
// (ClusterStatus in protobuf's JSON mapping: 64-bit integers as strings,
// NaN as "NaN"), with the published scalars' curves.
//
// Who may look (the state names every variable and worker):
//   listener on loopback   whoever the gRPC listener admits to an admin call:
//                          the admin token when token files are set, anyone
//                          when none are (a development cluster)
//   any other address      only with TLS (the listener is then HTTPS) and
//                          --admin_token_file; else the view is off and
//                          both paths answer 403 saying why
// The token goes as "Authorization: Bearer <token>"; the page asks for it
// once (or takes it from the URL's "#token=...", which browsers never send)
// and keeps it for the tab.
#ifndef REPVAR_SERVER_RPC_WEB_VIEW_H_
#define REPVAR_SERVER_RPC_WEB_VIEW_H_

#include <memory>
#include <string>
#include <vector>

#include "common/rpc/metrics_server.h"
#include "common/rpc/security.h"
#include "server/core/coordinator.h"
#include "server/core/scalar_board.h"

namespace repvar::server {

// Why the view must be off for a listener on `http_address` ("" when it
// may be on).
std::string WebViewRefusal(absl::string_view http_address, bool tls, bool admin_token_file);

class WebView {
 public:
  // The page lists this many variables at most (the first by name) and
  // counts all of them.
  static constexpr size_t kMaxVariables = 500;

  // `policy` decides who is admin; `refusal` (WebViewRefusal) non-empty
  // turns the view off.
  WebView(Coordinator* core, const ScalarBoard* scalars, std::shared_ptr<const AccessPolicy> policy,
          std::string refusal)
      : core_(core), scalars_(scalars), policy_(std::move(policy)), refusal_(std::move(refusal)) {}

  std::vector<HttpRoute> Routes() const;
  HttpResponse Page(const HttpRequest& req) const;   // "/"
  HttpResponse State(const HttpRequest& req) const;  // "/api/state"
  const std::string& refusal() const { return refusal_; }

 private:
  Coordinator* const core_;
  const ScalarBoard* const scalars_;
  const std::shared_ptr<const AccessPolicy> policy_;
  const std::string refusal_;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_WEB_VIEW_H_

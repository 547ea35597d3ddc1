// SPDX-License-Identifier: Apache-2.0
// The web view's two paths as handlers, without sockets: the state is the
// cluster status in protobuf's JSON mapping; who may see it is who may make
// an admin call, and off loopback only with TLS and an admin token file.
// (A real coordinator's page in headless Chromium: tests/python/test_web_view.py.)
#include "server/rpc/web_view.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/match.h"
#include "tests/testing/in_process_coordinator.h"

namespace repvar::server {
namespace {

constexpr char kTrainer[] = "trainer-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789ab";

std::shared_ptr<const AccessPolicy> OpenPolicy() {
  return std::make_shared<AccessPolicy>(false, AccessPolicy::Tokens{});
}
std::shared_ptr<const AccessPolicy> TokenPolicy() {
  AccessPolicy::Tokens t;
  t.worker = TokenSet::Of({"worker-token-0123456789"});
  t.trainer = TokenSet::Of({kTrainer});
  t.admin = TokenSet::Of({kAdmin});
  return std::make_shared<AccessPolicy>(false, std::move(t));
}

std::string Header(const HttpResponse& res, const std::string& name) {
  for (const auto& [k, v] : res.headers) {
    if (k == name) return v;
  }
  return "";
}

v1::ClusterStatus Parse(const HttpResponse& res) {
  v1::ClusterStatus status;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(res.body, &status).ok()) << res.body;
  return status;
}

class WebViewTest : public ::testing::Test {
 protected:
  void SetUp() override { coordinator_.RegisterWorkers(2, 2); }
  WebView View(std::shared_ptr<const AccessPolicy> policy, std::string refusal = "") {
    return WebView(&coordinator_.core(), &coordinator_.scalars(), std::move(policy),
                   std::move(refusal));
  }
  testing::InProcessCoordinator coordinator_;
};

TEST_F(WebViewTest, State_IsTheClusterStatusAsJson_HostsInfeedVariablesCurves) {
  ASSERT_TRUE(coordinator_.scalars().Publish("train/loss", 3, 0.5).ok());
  ASSERT_TRUE(coordinator_.scalars().Publish("train/loss", 4, std::nan("")).ok());
  const WebView view = View(OpenPolicy());
  const HttpResponse res = view.State({"/api/state", ""});
  ASSERT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(res.content_type, "application/json");
  EXPECT_EQ(Header(res, "Cache-Control"), "no-store");
  // 64-bit integers as strings, NaN as "NaN": what the page parses.
  EXPECT_TRUE(absl::StrContains(res.body, "\"NaN\"")) << res.body;
  const v1::ClusterStatus status = Parse(res);
  ASSERT_EQ(status.topology().tasks_size(), 2);
  EXPECT_EQ(status.topology().infeed_host().job(), "tpu_worker");
  EXPECT_EQ(status.topology().infeed_host().task(), 0);
  EXPECT_EQ(status.topology().accelerators_size(), 4);
  ASSERT_EQ(status.scalars_size(), 1);
  EXPECT_EQ(status.scalars(0).name(), "train/loss");
  EXPECT_EQ(status.scalars(0).steps_size(), 2);
  EXPECT_EQ(status.scalars(0).values(0), 0.5);
  EXPECT_TRUE(status.divergences_repaired().contains("step"));
  EXPECT_FALSE(status.draining());
}

TEST_F(WebViewTest, State_ListsAtMostKMaxVariables_CountsAll) {
  std::vector<CreateItem> items;
  for (size_t i = 0; i < WebView::kMaxVariables + 3; ++i) {
    CreateItem item;
    item.def.name = absl::StrCat("v", i);
    item.def.tensor = TensorSpec{DType::kFloat32, {1}};
    item.def.replica_count = 3;  // on both hosts
    items.push_back(std::move(item));
  }
  ASSERT_TRUE(coordinator_.core().CreateVariables(RequestKey{}, items).ok());
  const v1::ClusterStatus status = Parse(View(OpenPolicy()).State({"/api/state", ""}));
  EXPECT_EQ(status.variables_size(), static_cast<int>(WebView::kMaxVariables));
  EXPECT_EQ(status.variable_count(), static_cast<int64_t>(WebView::kMaxVariables + 3));
  EXPECT_EQ(status.replicas_by_state().at("UNINITIALIZED"),
            3 * static_cast<int64_t>(WebView::kMaxVariables + 3));
}

TEST_F(WebViewTest, X1_WithTokenFiles_OnlyTheAdminTokenSeesTheState) {
  const WebView view = View(TokenPolicy());
  const HttpResponse none = view.State({"/api/state", ""});
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(Header(none, "WWW-Authenticate"), "Bearer realm=\"repvar\"");
  EXPECT_FALSE(absl::StrContains(none.body, "tpu_worker"));
  EXPECT_EQ(view.State({"/api/state", "Bearer not-a-token-of-anyone"}).status, 401);
  const HttpResponse trainer = view.State({"/api/state", absl::StrCat("Bearer ", kTrainer)});
  EXPECT_EQ(trainer.status, 403) << trainer.body;
  EXPECT_FALSE(absl::StrContains(trainer.body, "tpu_worker"));
  // The valid credential, next to the refused ones (either spelling of the scheme).
  EXPECT_EQ(view.State({"/api/state", absl::StrCat("Bearer ", kAdmin)}).status, 200);
  EXPECT_EQ(view.State({"/api/state", absl::StrCat("bearer ", kAdmin)}).status, 200);
  // The page holds no data: anyone may load it (it asks for the token).
  EXPECT_EQ(view.Page({"/", ""}).status, 200);
}

TEST_F(WebViewTest, X1_OffLoopback_OnlyWithTlsAndAnAdminTokenFile) {
  EXPECT_EQ(WebViewRefusal("127.0.0.1:9470", false, false), "");
  EXPECT_EQ(WebViewRefusal("[::1]:9470", false, false), "");
  EXPECT_EQ(WebViewRefusal("10.0.0.5:9470", true, true), "");
  EXPECT_TRUE(absl::StrContains(WebViewRefusal("0.0.0.0:9470", false, true), "without TLS"));
  EXPECT_TRUE(
      absl::StrContains(WebViewRefusal("10.0.0.5:9470", true, false), "--admin_token_file"));
  // A view that is off answers 403 with the reason, even to the admin token.
  const std::string why = WebViewRefusal("0.0.0.0:9470", false, true);
  const WebView view = View(TokenPolicy(), why);
  for (const HttpResponse& res :
       {view.Page({"/", ""}), view.State({"/api/state", absl::StrCat("Bearer ", kAdmin)})}) {
    EXPECT_EQ(res.status, 403);
    EXPECT_TRUE(absl::StrContains(res.body, why)) << res.body;
  }
}

TEST_F(WebViewTest, Page_IsTheBuiltInFile_LoadingNothingFromElsewhere) {
  const HttpResponse res = View(OpenPolicy()).Page({"/", ""});
  ASSERT_EQ(res.status, 200);
  EXPECT_EQ(res.content_type, "text/html; charset=utf-8");
  EXPECT_TRUE(absl::StrContains(res.body, "<title>repvar</title>"));
  EXPECT_TRUE(absl::StrContains(res.body, "api/state"));
  EXPECT_TRUE(absl::StrContains(Header(res, "Content-Security-Policy"), "default-src 'none'"));
  EXPECT_EQ(Header(res, "X-Frame-Options"), "DENY");
  // Data reaches the page as text only.
  EXPECT_FALSE(absl::StrContains(res.body, "innerHTML"));
}

}  // namespace
}  // namespace repvar::server

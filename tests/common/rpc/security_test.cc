// SPDX-License-Identifier: Apache-2.0
// Contract X1's table (common/rpc/security.h) as AccessPolicy decides it: no
// sockets; each refusal next to the same call admitted.
#include "common/rpc/security.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/base/random.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;
using Code = absl::StatusCode;

const std::string kWorker = "worker-token-0123456789";
const std::string kTrainer = "trainer-token-0123456789";
const std::string kAdmin = "admin-token-0123456789";

AccessPolicy Policy(bool tls, bool admin_file = true) {
  AccessPolicy::Tokens t;
  t.worker = TokenSet::Of({kWorker});
  t.trainer = TokenSet::Of({kTrainer});
  if (admin_file) t.admin = TokenSet::Of({kAdmin});
  return AccessPolicy(tls, std::move(t));
}

CallerCredentials Call(absl::string_view method, std::optional<absl::string_view> token,
                       std::optional<absl::string_view> cert = std::nullopt) {
  return CallerCredentials{method, token, cert};
}

constexpr absl::string_view kHeartbeat = "/repvar.v1.CoordinatorWorkers/Heartbeat";
constexpr absl::string_view kCreate = "/repvar.v1.CoordinatorTrainers/CreateVariables";
constexpr absl::string_view kStepWrite = "/repvar.v1.WorkerSteps/StepWrite";
constexpr absl::string_view kDelete = "/repvar.v1.CoordinatorAdmin/DeleteVariable";
constexpr absl::string_view kDrop = "/repvar.v1.WorkerReplicas/DropVariable";

TEST(AccessPolicy, X1_Trainers_NeedTheTrainerOrAdminToken) {
  const AccessPolicy p = Policy(true);
  for (absl::string_view m : {kCreate, kStepWrite}) {
    EXPECT_THAT(p.Authorize(Call(m, std::nullopt)), StatusIs(Code::kUnauthenticated)) << m;
    EXPECT_THAT(p.Authorize(Call(m, "not-a-token-of-this-cluster")),
                StatusIs(Code::kUnauthenticated));
    EXPECT_THAT(p.Authorize(Call(m, kWorker, "/job:w/task:0")), StatusIs(Code::kPermissionDenied));
    EXPECT_EQ(p.Authorize(Call(m, kTrainer))->role, Role::kTrainer);
    EXPECT_EQ(p.Authorize(Call(m, kAdmin))->role, Role::kAdmin);
  }
}

TEST(AccessPolicy, X1_AdminService_OnlyTheAdminToken) {
  const AccessPolicy p = Policy(true);
  EXPECT_THAT(p.Authorize(Call(kDelete, kTrainer)), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(p.Authorize(Call(kDelete, kWorker, "coordinator")),
              StatusIs(Code::kPermissionDenied));
  EXPECT_EQ(p.Authorize(Call(kDelete, kAdmin))->role, Role::kAdmin);
  // Without an admin file nobody is admin.
  EXPECT_THAT(Policy(true, false).Authorize(Call(kDelete, kAdmin)),
              StatusIs(Code::kUnauthenticated));
}

TEST(AccessPolicy, X1_Workers_NeedTokenAndTaskCertificate_UnderTls) {
  const AccessPolicy p = Policy(true);
  EXPECT_THAT(p.Authorize(Call(kHeartbeat, kWorker)), StatusIs(Code::kUnauthenticated));
  EXPECT_THAT(p.Authorize(Call(kHeartbeat, std::nullopt, "/job:w/task:0")),
              StatusIs(Code::kUnauthenticated));
  EXPECT_THAT(p.Authorize(Call(kHeartbeat, kWorker, "trainer")), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(p.Authorize(Call(kHeartbeat, kTrainer, "/job:w/task:0")),
              StatusIs(Code::kPermissionDenied));
  absl::StatusOr<Admission> ok = p.Authorize(Call(kHeartbeat, kWorker, "/job:w/task:0"));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->role, Role::kWorker);
  EXPECT_EQ(ok->task, "/job:w/task:0");
}

TEST(AccessPolicy, X1_WorkerReplicas_OnlyTheCoordinatorsCertificate) {
  const AccessPolicy p = Policy(true);
  EXPECT_THAT(p.Authorize(Call(kDrop, kWorker, "/job:w/task:1")),
              StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(p.Authorize(Call(kDrop, kAdmin, "coordinator")), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(p.Authorize(Call(kDrop, kWorker)), StatusIs(Code::kUnauthenticated));
  EXPECT_EQ(p.Authorize(Call(kDrop, kWorker, "coordinator"))->role, Role::kCoordinator);
}

TEST(AccessPolicy, X1_HealthForAnyone_ReflectionForAnyRole_UnknownServicesForNobody) {
  const AccessPolicy p = Policy(true);
  EXPECT_TRUE(p.Authorize(Call("/grpc.health.v1.Health/Check", std::nullopt)).ok());
  const absl::string_view reflection =
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  EXPECT_THAT(p.Authorize(Call(reflection, std::nullopt)), StatusIs(Code::kUnauthenticated));
  EXPECT_TRUE(p.Authorize(Call(reflection, kTrainer)).ok());
  EXPECT_THAT(p.Authorize(Call("/other.Service/Method", kAdmin)),
              StatusIs(Code::kPermissionDenied));
}

TEST(AccessPolicy, X1_LocalWithoutTokenFiles_Open_WithAny_EveryRoleNeedsItsToken) {
  const AccessPolicy open(false, {});
  EXPECT_EQ(open.Authorize(Call(kHeartbeat, std::nullopt))->task, "*");
  EXPECT_TRUE(open.Authorize(Call(kDelete, std::nullopt)).ok());
  // A trainer file and no admin file: the admin role admits nobody, so a
  // caller without a token is not let in through it.
  AccessPolicy::Tokens t;
  t.trainer = TokenSet::Of({kTrainer});
  const AccessPolicy local(false, std::move(t));
  EXPECT_THAT(local.Authorize(Call(kCreate, std::nullopt)), StatusIs(Code::kUnauthenticated));
  EXPECT_THAT(local.Authorize(Call(kDelete, kTrainer)), StatusIs(Code::kPermissionDenied));
  EXPECT_THAT(local.Authorize(Call(kHeartbeat, std::nullopt)), StatusIs(Code::kUnauthenticated));
  EXPECT_TRUE(local.Authorize(Call(kCreate, kTrainer)).ok());
  // Workers on loopback without TLS are who they say: any task.
  EXPECT_EQ(Policy(false).Authorize(Call(kHeartbeat, kWorker))->task, "*");
}

TEST(AccessPolicy, X1_ReplaceTokens_RotatesAcceptedTokens_RolesStayAsTheyWere) {
  AccessPolicy p = Policy(true);
  const std::string fresh = "fresh-trainer-token-0123";
  EXPECT_THAT(p.Authorize(Call(kCreate, fresh)), StatusIs(Code::kUnauthenticated));
  AccessPolicy::Tokens t;
  t.worker = TokenSet::Of({kWorker});
  t.trainer = TokenSet::Of({fresh, kTrainer});
  t.admin = TokenSet::Of({kAdmin});
  ASSERT_TRUE(p.ReplaceTokens(t).ok());
  EXPECT_TRUE(p.Authorize(Call(kCreate, fresh)).ok());
  EXPECT_TRUE(p.Authorize(Call(kCreate, kTrainer)).ok());
  t.admin.reset();  // a role losing its file: refused, nothing changes
  EXPECT_THAT(p.ReplaceTokens(t), StatusIs(Code::kFailedPrecondition));
  EXPECT_TRUE(p.Authorize(Call(kDelete, kAdmin)).ok());
}

TEST(TokenSet, Load_SkipsCommentsAndBlanks_RefusesShortOrNone) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/tokens";
  std::ofstream(path) << "# rotated 2026-12\n\n  new-token-0123456789  \nold-token-0123456789\n";
  auto set = TokenSet::Load(path);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->first(), "new-token-0123456789");
  EXPECT_TRUE(set->Contains(TokenSet::DigestOf("old-token-0123456789")));
  EXPECT_FALSE(set->Contains(TokenSet::DigestOf("old-token-012345678")));
  EXPECT_FALSE(set->Contains(TokenSet::DigestOf("")));
  std::ofstream(path) << "short\n";
  EXPECT_THAT(TokenSet::Load(path), StatusIs(Code::kInvalidArgument));
  std::ofstream(path) << "# nothing\n";
  EXPECT_THAT(TokenSet::Load(path), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(TokenSet::Load(dir.path() + "/missing"), StatusIs(Code::kInvalidArgument));
}

TEST(SecurityFlags, X1_PlaintextElsewhere_NeedsInsecure_PartialTls_Refused) {
  SecurityFlags flags;
  EXPECT_THAT(LoadDaemonSecurity(flags, "coordinator", "worker_token_file", "", "0.0.0.0:7070"),
              StatusIs(Code::kFailedPrecondition));
  flags.insecure = true;
  auto insecure = LoadDaemonSecurity(flags, "coordinator", "worker_token_file", "", "0.0.0.0:7070");
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(insecure->server.insecure);
  flags.insecure = false;
  auto local = LoadDaemonSecurity(flags, "coordinator", "worker_token_file", "", "127.0.0.1:0");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->server.insecure);
  flags.tls_cert = "/nonexistent.pem";
  EXPECT_THAT(LoadDaemonSecurity(flags, "coordinator", "worker_token_file", "", "127.0.0.1:0"),
              StatusIs(Code::kInvalidArgument));
}

TEST(IncarnationDigest, OneWayNameOfAnIncarnation) {
  const uint64_t a = NewIncarnation();
  EXPECT_EQ(IncarnationDigest(a), IncarnationDigest(a));
  EXPECT_NE(IncarnationDigest(a), IncarnationDigest(a + 1));
  EXPECT_NE(IncarnationDigest(a), a);
}

}  // namespace
}  // namespace repvar

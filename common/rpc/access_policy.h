// SPDX-License-Identifier: Apache-2.0
// Who may call what (contract X1; the table is in security.h): the roles,
// the tokens each accepts, the policy that admits a call before any handler,
// and the gRPC processor that runs it on every call.
#ifndef REPVAR_COMMON_RPC_ACCESS_POLICY_H_
#define REPVAR_COMMON_RPC_ACCESS_POLICY_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/model/task.h"

namespace repvar {

enum class Role : uint8_t { kWorker, kCoordinator, kTrainer, kAdmin };
absl::string_view RoleName(Role role);

// A worker's name in its certificate's CN: "/job:worker/task:3".
std::string TaskCertificateName(const TaskKey& task);
// The coordinator's CN.
inline constexpr absl::string_view kCoordinatorCertificateName = "coordinator";

// The tokens a role accepts, read from a file: one per line, blank lines and
// lines starting with '#' skipped, surrounding spaces trimmed; the first is
// the one a daemon sends (a file may list a new token before the old one
// while both are accepted). Only SHA-256 digests are kept and compared, in
// constant time.
class TokenSet {
 public:
  // Errors: NOT_FOUND/PERMISSION_DENIED (cannot read), INVALID_ARGUMENT (no
  // token, or one shorter than 16 characters). A file others may read is
  // accepted with a warning.
  static absl::StatusOr<TokenSet> Load(const std::string& path);
  static TokenSet Of(const std::vector<std::string>& tokens);  // tests

  using Digest = std::array<unsigned char, 32>;
  static Digest DigestOf(absl::string_view token);  // SHA-256
  bool Contains(const Digest& token) const;
  const std::string& first() const { return first_; }

 private:
  std::vector<std::array<unsigned char, 32>> digests_;
  std::string first_;
};

// What a call presents.
struct CallerCredentials {
  absl::string_view method;                // ":path", "/repvar.v1.CoordinatorWorkers/Heartbeat"
  std::optional<absl::string_view> token;  // from "authorization: Bearer <token>"
  std::optional<absl::string_view> certificate;  // CN of a verified client certificate
};
// Who a call was admitted as.
struct Admission {
  Role role = Role::kTrainer;
  // Worker calls: the task the caller may act as, "*" when any (no TLS).
  std::string task;
};

// The table above, for one listener. Thread-safe.
class AccessPolicy {
 public:
  struct Tokens {
    std::optional<TokenSet> worker;  // also the coordinator's
    std::optional<TokenSet> trainer;
    std::optional<TokenSet> admin;
  };
  AccessPolicy(bool tls, Tokens tokens)
      : tls_(tls), tokens_(std::make_shared<const Tokens>(std::move(tokens))) {}

  // Token rotation (SIGHUP): the accepted tokens become `tokens`, for calls
  // that start after this returns. Which roles have files stays as it was.
  // Errors: FAILED_PRECONDITION (a role gains or loses its file).
  absl::Status ReplaceTokens(Tokens tokens) ABSL_LOCKS_EXCLUDED(mu_);

  // Errors: UNAUTHENTICATED (no or unknown token, no certificate where one
  // is needed), PERMISSION_DENIED (a valid token or certificate of a role
  // that may not call `method`, or an unknown service).
  absl::StatusOr<Admission> Authorize(const CallerCredentials& caller) const;

 private:
  // Whether `token` proves `role` (or no token is needed for it here).
  static bool Proves(const Tokens& tokens, bool open, Role role,
                     const std::optional<TokenSet::Digest>& token);
  std::shared_ptr<const Tokens> tokens() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::ReaderMutexLock lock(&mu_);
    return tokens_;
  }

  const bool tls_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Tokens> tokens_ ABSL_GUARDED_BY(mu_);
};

// For a call admitted as a worker: OK when the caller may act as `task` (its
// certificate names it, or the listener has no certificates to check).
// PERMISSION_DENIED otherwise, naming both tasks.
grpc::Status CheckCallerIsTask(const grpc::ServerContextBase& ctx, const TaskKey& task);

// Runs an AccessPolicy on each call, before any handler: a refused call
// never reaches one (the listener's AuthMetadataProcessor). Non-blocking:
// the check is a few hashes.
class PolicyProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit PolicyProcessor(std::shared_ptr<AccessPolicy> policy) : policy_(std::move(policy)) {}

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata*) override;

 private:
  const std::shared_ptr<AccessPolicy> policy_;
};

// "Bearer ", before a token in the authorization header.
inline constexpr absl::string_view kBearer = "Bearer ";

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_ACCESS_POLICY_H_

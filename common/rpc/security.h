// SPDX-License-Identifier: Apache-2.0
// Who may call what (contract X1): TLS on the listeners, bearer tokens per
// role checked for every method in one place (AccessPolicy, run by the
// server's AuthMetadataProcessor before any handler), a worker's identity
// from its certificate.
//
//   role         proves itself with                        may call
//   worker       worker token, and with TLS a certificate  CoordinatorWorkers, as
//                whose CN is "/job:J/task:T"               its own task only
//   coordinator  worker token (the cluster's shared        WorkerReplicas
//                secret), with TLS a certificate whose
//                CN is "coordinator"
//   trainer      trainer token (a client certificate is    CoordinatorTrainers,
//                optional)                                 WorkerSteps
//   admin        admin token                               what a trainer may, and
//                                                          CoordinatorAdmin
//   anyone                                                 grpc.health.v1.Health
//   any role                                               server reflection
//
// A listener is in one of three modes:
//   TLS          --tls_cert, --tls_key and --tls_ca: clients verify the
//                server; workers and the coordinator present certificates
//                signed by the same CA (mutual TLS). Worker and trainer
//                token files are required; without an admin file nobody is
//                admin.
//   local        plaintext on a loopback address: with token files, each
//                role needs its token (a role without a file admits nobody)
//                and a worker is who it says it is (no certificates say
//                otherwise); with none, nothing is checked (a development
//                cluster).
//   insecure     plaintext on any address, only with --insecure (warned at
//                startup): nothing is checked.
#ifndef REPVAR_COMMON_RPC_SECURITY_H_
#define REPVAR_COMMON_RPC_SECURITY_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/tls_certificate_provider.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/base/daemon.h"
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

// A daemon's certificate, key and CA as gRPC's TLS credentials read them:
// copies in a private directory (mode 0700, removed with this object) that
// gRPC checks every second. Reload (SIGHUP) reads the operator's files and
// replaces the copies only when they make a valid set: a certificate naming
// this daemon, signed by the CA, with its key. New connections then use
// them within a second; established ones keep theirs. Thread-safe.
class ReloadableCertificates {
 public:
  // Errors: INVALID_ARGUMENT (an unreadable file, a set that is not valid),
  // INTERNAL (the private directory).
  static absl::StatusOr<std::shared_ptr<ReloadableCertificates>> Load(std::string cert_file,
                                                                      std::string key_file,
                                                                      std::string ca_file,
                                                                      std::string certificate_name);
  ~ReloadableCertificates();
  ReloadableCertificates(const ReloadableCertificates&) = delete;
  ReloadableCertificates& operator=(const ReloadableCertificates&) = delete;

  // Errors as Load's; the copies then stay as they were.
  absl::Status Reload();
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider() const {
    return provider_;
  }
  // The copies (PEM files; each replaced by a rename): for other listeners
  // of the daemon (HTTPS), read at each handshake.
  std::string cert_path() const { return dir_ + "/cert.pem"; }
  std::string key_path() const { return dir_ + "/key.pem"; }

 private:
  ReloadableCertificates(std::string cert_file, std::string key_file, std::string ca_file,
                         std::string certificate_name, std::string dir)
      : cert_file_(std::move(cert_file)),
        key_file_(std::move(key_file)),
        ca_file_(std::move(ca_file)),
        certificate_name_(std::move(certificate_name)),
        dir_(std::move(dir)) {}

  const std::string cert_file_, key_file_, ca_file_, certificate_name_, dir_;
  absl::Mutex mu_;  // one Reload at a time
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
};

// A daemon's credentials, as its flags give them.
struct ServerSecurity {
  std::string address;                                   // the listen address
  std::shared_ptr<ReloadableCertificates> certificates;  // null: plaintext
  bool insecure = false;
  std::shared_ptr<AccessPolicy> policy;
  bool tls() const { return certificates != nullptr; }
};
// How a process calls the others.
struct ChannelSecurity {
  std::string tls_ca_pem;                 // empty: plaintext
  std::string tls_cert_pem, tls_key_pem;  // optional client certificate
  // A daemon's own (then the three above are unused): its certificate as
  // the client's, reloaded with the listener's.
  std::shared_ptr<ReloadableCertificates> certificates;
  std::string token;  // sent as "authorization: Bearer <token>"; empty: none
};

// The listener's credentials, with the policy's processor attached
// (nothing for insecure).
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const ServerSecurity& security);
// Messages stay below 32 MiB by design (chunks are at most 4 MiB); the limit
// leaves headroom for batched calls.
inline constexpr int kMaxMessageBytes = 64 << 20;
grpc::ChannelArguments DefaultChannelArguments();

// Opens a client channel the same way everywhere (coordinator, workers,
// client library): messages up to kMaxMessageBytes; TLS when `security` has
// a CA; its token on every call. Plaintext with a token goes only to
// loopback addresses (local credentials); elsewhere no token is sent.
std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address,
                                           const ChannelSecurity& security);

// Both, for a daemon, from the shared flags and the file of the worker token
// (the coordinator's --worker_token_file, a worker's --token_file), which
// the daemon also sends on its own calls. Checks that the flags make a mode
// of the table above, and that the daemon's certificate names it
// (`certificate_name`: "coordinator", a worker's TaskCertificateName).
// Errors: INVALID_ARGUMENT (a TLS flag without the others, unreadable or bad
// files, a certificate of another name), FAILED_PRECONDITION (plaintext on a
// non-loopback address without --insecure; TLS without the token files).
struct DaemonSecurity {
  ServerSecurity server;
  ChannelSecurity channel;
};
absl::StatusOr<DaemonSecurity> LoadDaemonSecurity(const SecurityFlags& flags,
                                                  absl::string_view certificate_name,
                                                  const std::string& worker_token_flag,
                                                  const std::string& worker_token_file,
                                                  const std::string& listen_address);

// The CN of a PEM certificate. Errors: INVALID_ARGUMENT (not a certificate).
absl::StatusOr<std::string> CertificateCommonName(const std::string& pem);

// SIGHUP: reads the token files of `flags` and `worker_token_file` again
// and makes them the accepted tokens of the daemon's policy, and reloads its
// certificates (ReloadableCertificates). Each keeps its old files on an
// error (returned, the first one). Logs the outcome. The token a daemon
// sends changes at its next start.
absl::Status ReloadDaemonSecurity(const SecurityFlags& flags, const std::string& worker_token_file,
                                  const DaemonSecurity& security);

// A client's channel security from file paths (any may be empty). Errors:
// INVALID_ARGUMENT naming the file that cannot be read or is empty.
absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const std::string& tls_ca_file,
                                                    const std::string& tls_cert_file,
                                                    const std::string& tls_key_file,
                                                    const std::string& token_file);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_SECURITY_H_

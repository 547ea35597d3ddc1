// SPDX-License-Identifier: Apache-2.0
// How daemons listen and how every process opens its channels: TLS from
// the certificates, the access policy's processor on a listener, a token
// on every call.
#ifndef REPVAR_COMMON_RPC_CREDENTIALS_H_
#define REPVAR_COMMON_RPC_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/access_policy.h"
#include "common/rpc/certificates.h"

namespace repvar {

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
// Channels ping a quiet connection with calls in flight every
// kKeepaliveTime and give it up kKeepaliveTimeout later without an
// answer; servers accept pings that often (kMinPingInterval).
inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(2);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(2);
inline constexpr absl::Duration kMinPingInterval = absl::Seconds(1);
grpc::ChannelArguments DefaultChannelArguments();

// Opens a client channel the same way everywhere (coordinator, workers,
// client library): messages up to kMaxMessageBytes; TLS when `security` has
// a CA; its token on every call. Plaintext with a token goes only to
// loopback addresses (local credentials); elsewhere no token is sent.
std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address,
                                           const ChannelSecurity& security);

// A client's channel security from file paths (any may be empty). Errors:
// INVALID_ARGUMENT naming the file that cannot be read or is empty.
absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const std::string& tls_ca_file,
                                                    const std::string& tls_cert_file,
                                                    const std::string& tls_key_file,
                                                    const std::string& token_file);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_CREDENTIALS_H_

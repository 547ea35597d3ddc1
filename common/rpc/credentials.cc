// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/credentials.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/daemon.h"
#include "common/rpc/secret_file.h"

namespace repvar {
namespace {

// "authorization: Bearer <token>" on every call.
class TokenPlugin : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(std::string token) : header_(absl::StrCat(kBearer, token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<std::string, std::string>* metadata) override {
    metadata->emplace("authorization", header_);
    return grpc::Status::OK;
  }

 private:
  const std::string header_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const ServerSecurity& security) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (security.tls()) {
    // Verified when presented; AccessPolicy requires one where it must.
    grpc::experimental::TlsServerCredentialsOptions options(security.certificates->provider());
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    creds = grpc::experimental::TlsServerCredentials(options);
  } else if (security.insecure) {
    return grpc::InsecureServerCredentials();
  } else {
    // Plaintext that only loopback peers may reach, with the processor.
    creds = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  }
  creds->SetAuthMetadataProcessor(std::make_shared<PolicyProcessor>(security.policy));
  return creds;
}

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // A peer that stops answering (its host gone, a partition, SIGSTOP)
  // fails the calls in flight within kKeepaliveTime + kKeepaliveTimeout
  // instead of at their deadlines (a registration's is minutes).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kKeepaliveTime)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kKeepaliveTimeout)));
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address,
                                           const ChannelSecurity& security) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (security.certificates != nullptr) {
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(security.certificates->provider());
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_verify_server_certs(true);
    creds = grpc::experimental::TlsCredentials(options);
  } else if (!security.tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = security.tls_ca_pem;
    options.pem_cert_chain = security.tls_cert_pem;
    options.pem_private_key = security.tls_key_pem;
    creds = grpc::SslCredentials(options);
  } else if (!security.token.empty() && IsLoopback(address)) {
    creds = grpc::experimental::LocalCredentials(LOCAL_TCP);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  if (!security.token.empty()) {
    creds = grpc::CompositeChannelCredentials(
        creds, grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenPlugin>(security.token)));
  }
  return grpc::CreateCustomChannel(address, creds, DefaultChannelArguments());
}

absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const std::string& tls_ca_file,
                                                    const std::string& tls_cert_file,
                                                    const std::string& tls_key_file,
                                                    const std::string& token_file) {
  ChannelSecurity security;
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError("a client certificate needs both its file and its key's");
  }
  if (!tls_cert_file.empty() && tls_ca_file.empty()) {
    return absl::InvalidArgumentError("a client certificate needs the CA file too");
  }
  for (auto [what, path, out] :
       {std::tuple{"CA file", &tls_ca_file, &security.tls_ca_pem},
        std::tuple{"certificate file", &tls_cert_file, &security.tls_cert_pem},
        std::tuple{"key file", &tls_key_file, &security.tls_key_pem}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> pem = ReadFile(what, *path);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  if (!token_file.empty()) {
    absl::StatusOr<TokenSet> tokens = TokenSet::Load(token_file);
    if (!tokens.ok()) return tokens.status();
    security.token = tokens->first();
  }
  return security;
}

}  // namespace repvar

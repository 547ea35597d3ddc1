// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/security.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace repvar {

namespace {

// The accepted tokens of each role whose file is given.
absl::StatusOr<AccessPolicy::Tokens> LoadTokens(const SecurityFlags& flags,
                                                const std::string& worker_token_file) {
  AccessPolicy::Tokens tokens;
  for (auto [path, set] : {std::pair{&worker_token_file, &tokens.worker},
                           std::pair{&flags.trainer_token_file, &tokens.trainer},
                           std::pair{&flags.admin_token_file, &tokens.admin}}) {
    if (path->empty()) continue;
    absl::StatusOr<TokenSet> loaded = TokenSet::Load(*path);
    if (!loaded.ok()) return loaded.status();
    *set = *std::move(loaded);
  }
  return tokens;
}

}  // namespace

absl::Status ReloadDaemonSecurity(const SecurityFlags& flags, const std::string& worker_token_file,
                                  const DaemonSecurity& security) {
  absl::StatusOr<AccessPolicy::Tokens> tokens = LoadTokens(flags, worker_token_file);
  absl::Status s =
      tokens.ok() ? security.server.policy->ReplaceTokens(*std::move(tokens)) : tokens.status();
  if (s.ok()) {
    spdlog::info("token files reloaded");
  } else {
    spdlog::error("token files not reloaded (the old tokens stay): {}", s.ToString());
  }
  if (security.server.certificates == nullptr) return s;
  absl::Status c = security.server.certificates->Reload();
  if (c.ok()) {
    spdlog::info("certificates reloaded: new connections use them");
  } else {
    spdlog::error("certificates not reloaded (the old ones stay): {}", c.ToString());
  }
  return s.ok() ? c : s;
}

absl::StatusOr<DaemonSecurity> LoadDaemonSecurity(const SecurityFlags& flags,
                                                  absl::string_view certificate_name,
                                                  const std::string& worker_token_flag,
                                                  const std::string& worker_token_file,
                                                  const std::string& listen_address) {
  const int tls_flags = !flags.tls_cert.empty() + !flags.tls_key.empty() + !flags.tls_ca.empty();
  if (tls_flags != 0 && tls_flags != 3) {
    return absl::InvalidArgumentError("give all of --tls_cert, --tls_key and --tls_ca, or none");
  }
  const bool tls = tls_flags == 3;
  if (!tls) {
    absl::Status s = CheckPlaintextAllowed("listen_address", listen_address, flags.insecure);
    if (!s.ok()) return s;
  } else if (worker_token_file.empty() || flags.trainer_token_file.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "with TLS, give --", worker_token_flag,
        " and --trainer_token_file: certificates name workers, tokens say who may call"));
  }
  if (flags.insecure && !tls && !IsLoopback(listen_address)) {
    spdlog::warn("--insecure: no token or certificate is checked on {}", listen_address);
  }
  DaemonSecurity out;
  absl::StatusOr<ChannelSecurity> channel = LoadChannelSecurity("", "", "", worker_token_file);
  if (!channel.ok()) return channel.status();
  out.channel = *std::move(channel);
  if (tls) {
    absl::StatusOr<std::shared_ptr<ReloadableCertificates>> certs = ReloadableCertificates::Load(
        flags.tls_cert, flags.tls_key, flags.tls_ca, std::string(certificate_name));
    if (!certs.ok()) return certs.status();
    out.channel.certificates = *certs;
    out.server.certificates = *std::move(certs);
  }
  absl::StatusOr<AccessPolicy::Tokens> tokens = LoadTokens(flags, worker_token_file);
  if (!tokens.ok()) return tokens.status();
  out.server.address = listen_address;
  out.server.insecure = flags.insecure && !tls && !IsLoopback(listen_address);
  out.server.policy = std::make_shared<AccessPolicy>(tls, *std::move(tokens));
  return out;
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// A daemon's TLS certificates, reloadable while it runs, and the OpenSSL
// parsing they need.
#ifndef REPVAR_COMMON_RPC_CERTIFICATES_H_
#define REPVAR_COMMON_RPC_CERTIFICATES_H_

#include <grpcpp/security/tls_certificate_provider.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace repvar {

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

// The CN of a PEM certificate. Errors: INVALID_ARGUMENT (not a certificate).
absl::StatusOr<std::string> CertificateCommonName(const std::string& pem);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_CERTIFICATES_H_

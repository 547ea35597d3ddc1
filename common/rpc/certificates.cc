// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/certificates.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/daemon.h"
#include "common/rpc/secret_file.h"
#include "spdlog/spdlog.h"

namespace repvar {

namespace {

using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

// The first certificate of a PEM text, or null.
X509Ptr ParseCertificate(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
}

absl::StatusOr<std::string> CommonNameOf(X509* cert) {
  char cn[256] = {};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) < 0) {
    return absl::InvalidArgumentError("the certificate has no CN");
  }
  return std::string(cn);
}

// A certificate naming `name`, signed by a certificate of `ca_pem`, whose
// private key is `key_pem`.
absl::Status CheckCertificateSet(const std::string& cert_pem, const std::string& key_pem,
                                 const std::string& ca_pem, absl::string_view name) {
  X509Ptr cert = ParseCertificate(cert_pem);
  if (cert == nullptr) return absl::InvalidArgumentError("the certificate file holds none");
  absl::StatusOr<std::string> cn = CommonNameOf(cert.get());
  if (!cn.ok() || *cn != name) {
    return absl::InvalidArgumentError(
        absl::StrCat(cn.ok() ? absl::StrCat("the certificate's CN is \"", *cn, "\"")
                             : std::string(cn.status().message()),
                     "; this daemon's must be \"", name, "\""));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), &BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (key == nullptr) return absl::InvalidArgumentError("the key file holds no private key");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError("the key is not the certificate's");
  }
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), &X509_STORE_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> ca_bio(
      BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())), &BIO_free);
  int cas = 0;
  while (X509* ca = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store.get(), ca);
    X509_free(ca);
    ++cas;
  }
  ERR_clear_error();
  if (cas == 0) return absl::InvalidArgumentError("the CA file holds no certificate");
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      &X509_STORE_CTX_free);
  if (X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1 ||
      X509_verify_cert(ctx.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CA does not vouch for the certificate: ",
                     X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()))));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<ReloadableCertificates>> ReloadableCertificates::Load(
    std::string cert_file, std::string key_file, std::string ca_file,
    std::string certificate_name) {
  const char* tmp = getenv("TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/repvar-tls.XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a private directory ", dir));
  }
  std::shared_ptr<ReloadableCertificates> certs(
      new ReloadableCertificates(std::move(cert_file), std::move(key_file), std::move(ca_file),
                                 std::move(certificate_name), std::move(dir)));
  if (absl::Status s = certs->Reload(); !s.ok()) return s;
  // gRPC reads the copies every second (and at once, here).
  certs->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      certs->dir_ + "/key.pem", certs->dir_ + "/cert.pem", certs->dir_ + "/ca.pem", 1);
  return certs;
}

ReloadableCertificates::~ReloadableCertificates() {
  provider_.reset();
  for (const char* f : {"/key.pem", "/cert.pem", "/ca.pem"}) unlink((dir_ + f).c_str());
  rmdir(dir_.c_str());
}

absl::Status ReloadableCertificates::Reload() {
  absl::MutexLock lock(&mu_);
  std::string pems[3];
  const std::pair<const char*, const std::string*> files[3] = {
      {"--tls_cert", &cert_file_}, {"--tls_key", &key_file_}, {"--tls_ca", &ca_file_}};
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> pem = ReadFile(files[i].first, *files[i].second);
    if (!pem.ok()) return pem.status();
    pems[i] = *std::move(pem);
  }
  if (absl::Status s = CheckCertificateSet(pems[0], pems[1], pems[2], certificate_name_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert=", cert_file_, ": ", s.message()));
  }
  // The key first: gRPC takes a certificate and key only when they match,
  // so a read between the renames keeps the old pair for another second.
  for (auto [name, text] : {std::pair{"/key.pem", &pems[1]}, std::pair{"/cert.pem", &pems[0]},
                            std::pair{"/ca.pem", &pems[2]}}) {
    if (absl::Status s = WriteFileAtomically(dir_ + name, *text, 0600); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CertificateCommonName(const std::string& pem) {
  X509Ptr cert = ParseCertificate(pem);
  if (cert == nullptr) return absl::InvalidArgumentError("not a PEM certificate");
  return CommonNameOf(cert.get());
}

}  // namespace repvar

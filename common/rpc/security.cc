// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/security.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/metrics.h"
#include "spdlog/spdlog.h"

namespace repvar {
namespace {

constexpr size_t kMinTokenChars = 16;
constexpr absl::string_view kBearer = "Bearer ";
// Properties the processor adds to an admitted call's AuthContext.
constexpr char kTaskProperty[] = "repvar.task";

absl::StatusOr<std::string> ReadFile(absl::string_view what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty())
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  return text.str();
}

// The service of a method path: "/repvar.v1.CoordinatorWorkers/Heartbeat"
// -> "repvar.v1.CoordinatorWorkers".
absl::string_view ServiceOf(absl::string_view method) {
  absl::ConsumePrefix(&method, "/");
  return method.substr(0, method.find('/'));
}

// Who may call each service (the table in security.h). Unlisted: nobody.
enum class Callers { kAnyone, kAnyRole, kWorkers, kCoordinator, kTrainers, kAdmins };
const std::map<absl::string_view, Callers>& ServiceCallers() {
  static const auto* table = new std::map<absl::string_view, Callers>{
      {"grpc.health.v1.Health", Callers::kAnyone},
      {"grpc.reflection.v1alpha.ServerReflection", Callers::kAnyRole},
      {"repvar.v1.CoordinatorWorkers", Callers::kWorkers},
      {"repvar.v1.WorkerReplicas", Callers::kCoordinator},
      {"repvar.v1.CoordinatorTrainers", Callers::kTrainers},
      {"repvar.v1.WorkerSteps", Callers::kTrainers},
      {"repvar.v1.CoordinatorAdmin", Callers::kAdmins},
  };
  return *table;
}

// Runs AccessPolicy on each call, before any handler: a refused call never
// reaches one. Non-blocking: the check is a few hashes.
class PolicyProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit PolicyProcessor(std::shared_ptr<AccessPolicy> policy) : policy_(std::move(policy)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata*) override {
    CallerCredentials caller;
    std::optional<grpc::string_ref> authorization;
    for (const auto& [key, value] : metadata) {
      if (key == ":path") caller.method = absl::string_view(value.data(), value.size());
      if (key == "authorization") authorization = value;
    }
    if (authorization) {
      absl::string_view header(authorization->data(), authorization->size());
      // A malformed header counts as an unknown token.
      caller.token = absl::ConsumePrefix(&header, kBearer) ? header : absl::string_view("?");
      consumed->emplace("authorization", std::string(authorization->data(), authorization->size()));
    }
    std::vector<grpc::string_ref> cn = context->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (!cn.empty()) caller.certificate = absl::string_view(cn.front().data(), cn.front().size());
    absl::StatusOr<Admission> admitted = policy_->Authorize(caller);
    if (!admitted.ok()) {
      // The method comes from the caller: only known services become a
      // label (no unbounded series), and the log line is cut short.
      const absl::string_view service = ServiceOf(caller.method);
      Metrics::Global()
          .GetCounter("repvar_auth_refused_total",
                      "calls refused by the access policy before any handler, by service and code",
                      {{"service", ServiceCallers().count(service) ? std::string(service)
                                                                   : std::string("unknown")},
                       {"code", admitted.status().code() == absl::StatusCode::kUnauthenticated
                                    ? "UNAUTHENTICATED"
                                    : "PERMISSION_DENIED"}})
          .Add();
      spdlog::warn("refused {}: {}", std::string(caller.method.substr(0, 200)),
                   std::string(admitted.status().message().substr(0, 300)));
      return grpc::Status(static_cast<grpc::StatusCode>(admitted.status().code()),
                          std::string(admitted.status().message()));
    }
    // The context is the connection's, not the call's: a property added on
    // every call would pile up (memory, and every lookup scanning them
    // all). The task a connection may act as is fixed by its certificate
    // (or "*" without TLS), so it is recorded once.
    if (!admitted->task.empty() && context->FindPropertyValues(kTaskProperty).empty()) {
      context->AddProperty(kTaskProperty, admitted->task);
    }
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<AccessPolicy> policy_;
};

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

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kCoordinator:
      return "coordinator";
    case Role::kTrainer:
      return "trainer";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

std::string TaskCertificateName(const TaskKey& task) {
  return absl::StrCat("/job:", task.job, "/task:", task.task);
}

absl::StatusOr<TokenSet> TokenSet::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile("token file", path);
  if (!text.ok()) return text.status();
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    if (line.size() < kMinTokenChars) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": a token of ",
                                                     line.size(), " characters; at least ",
                                                     kMinTokenChars, " are needed"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " holds no token"));
  }
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
    spdlog::warn("token file {} is readable by every user (chmod 600 it)", path);
  }
  return Of(tokens);
}

TokenSet TokenSet::Of(const std::vector<std::string>& tokens) {
  TokenSet set;
  for (const std::string& t : tokens) set.digests_.push_back(DigestOf(t));
  if (!tokens.empty()) set.first_ = tokens.front();
  return set;
}

TokenSet::Digest TokenSet::DigestOf(absl::string_view token) {
  Digest d{};
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  return d;
}

bool TokenSet::Contains(const Digest& token) const {
  bool found = false;
  for (const Digest& known : digests_) {
    found |= CRYPTO_memcmp(known.data(), token.data(), token.size()) == 0;
  }
  return found;
}

bool AccessPolicy::Proves(const Tokens& tokens, bool open, Role role,
                          const std::optional<TokenSet::Digest>& token) {
  const std::optional<TokenSet>& set = role == Role::kWorker || role == Role::kCoordinator
                                           ? tokens.worker
                                       : role == Role::kTrainer ? tokens.trainer
                                                                : tokens.admin;
  // A role with no file admits nobody, unless no role has one (a local
  // development cluster: nothing is checked).
  if (!set.has_value()) return open;
  return token.has_value() && set->Contains(*token);
}

absl::Status AccessPolicy::ReplaceTokens(Tokens tokens) {
  absl::MutexLock lock(&mu_);
  if (tokens.worker.has_value() != tokens_->worker.has_value() ||
      tokens.trainer.has_value() != tokens_->trainer.has_value() ||
      tokens.admin.has_value() != tokens_->admin.has_value()) {
    return absl::FailedPreconditionError(
        "a reload cannot add or remove a role's token file; restart for that");
  }
  tokens_ = std::make_shared<const Tokens>(std::move(tokens));
  return absl::OkStatus();
}

absl::StatusOr<Admission> AccessPolicy::Authorize(const CallerCredentials& caller) const {
  auto it = ServiceCallers().find(ServiceOf(caller.method));
  if (it == ServiceCallers().end()) {
    return absl::PermissionDeniedError(absl::StrCat("no role may call ", caller.method));
  }
  const Callers callers = it->second;
  if (callers == Callers::kAnyone) return Admission{Role::kTrainer, ""};
  const std::shared_ptr<const Tokens> tokens = this->tokens();
  const bool open = !tls_ && !tokens->worker && !tokens->trainer && !tokens->admin;
  // Hashed once, compared with each role's digests.
  std::optional<TokenSet::Digest> token;
  if (caller.token) token = TokenSet::DigestOf(*caller.token);
  const bool admin = Proves(*tokens, open, Role::kAdmin, token);
  const bool trainer = admin || Proves(*tokens, open, Role::kTrainer, token);
  const bool worker = Proves(*tokens, open, Role::kWorker, token);
  if (!admin && !trainer && !worker) {
    return absl::UnauthenticatedError(caller.token ? "the token is not valid here"
                                                   : "no token (\"authorization: Bearer ...\")");
  }
  auto denied = [&](absl::string_view who) {
    return absl::PermissionDeniedError(absl::StrCat(caller.method, " is for ", who));
  };
  switch (callers) {
    case Callers::kAnyone:
    case Callers::kAnyRole:
      return Admission{admin ? Role::kAdmin : trainer ? Role::kTrainer : Role::kWorker, ""};
    case Callers::kTrainers:
      if (!trainer) return denied("trainers and admins");
      return Admission{admin ? Role::kAdmin : Role::kTrainer, ""};
    case Callers::kAdmins:
      if (!admin) return denied("admins");
      return Admission{Role::kAdmin, ""};
    case Callers::kWorkers:
    case Callers::kCoordinator: {
      const bool for_workers = callers == Callers::kWorkers;
      if (!worker) return denied(for_workers ? "workers" : "the coordinator");
      if (!tls_) return Admission{for_workers ? Role::kWorker : Role::kCoordinator, "*"};
      if (!caller.certificate) {
        return absl::UnauthenticatedError(
            absl::StrCat(caller.method, " needs a client certificate of the cluster's CA"));
      }
      const absl::string_view name = *caller.certificate;
      if (!for_workers) {
        if (name != kCoordinatorCertificateName) {
          return denied(absl::StrCat("the coordinator, not \"", name, "\""));
        }
        return Admission{Role::kCoordinator, ""};
      }
      if (!absl::StartsWith(name, "/job:")) {
        return denied(
            absl::StrCat("workers (certificate CN \"/job:J/task:T\"), not \"", name, "\""));
      }
      return Admission{Role::kWorker, std::string(name)};
    }
  }
  return denied("nobody");
}

grpc::Status CheckCallerIsTask(const grpc::ServerContextBase& ctx, const TaskKey& task) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  std::vector<grpc::string_ref> names = auth->FindPropertyValues(kTaskProperty);
  if (names.empty()) {
    // A listener without a processor (--insecure) checks nothing; any other
    // admits worker calls only with a task property.
    if (auth->begin() == auth->end()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not admitted as a worker");
  }
  const absl::string_view name(names.front().data(), names.front().size());
  const std::string claimed = TaskCertificateName(task);
  if (name == "*" || name == claimed) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat("the caller's certificate names ", name, ", not ", claimed));
}

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

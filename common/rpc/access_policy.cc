// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/access_policy.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/metrics.h"
#include "common/rpc/secret_file.h"
#include "spdlog/spdlog.h"

namespace repvar {
namespace {

constexpr size_t kMinTokenChars = 16;
// The property the processor adds to an admitted worker's AuthContext.
constexpr char kTaskProperty[] = "repvar.task";

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

grpc::Status PolicyProcessor::Process(const InputMetadata& metadata, grpc::AuthContext* context,
                                      OutputMetadata* consumed, OutputMetadata*) {
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

}  // namespace repvar

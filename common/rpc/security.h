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

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/daemon.h"
#include "common/rpc/access_policy.h"
#include "common/rpc/certificates.h"
#include "common/rpc/credentials.h"

namespace repvar {

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

// SIGHUP: reads the token files of `flags` and `worker_token_file` again
// and makes them the accepted tokens of the daemon's policy, and reloads its
// certificates (ReloadableCertificates). Each keeps its old files on an
// error (returned, the first one). Logs the outcome. The token a daemon
// sends changes at its next start.
absl::Status ReloadDaemonSecurity(const SecurityFlags& flags, const std::string& worker_token_file,
                                  const DaemonSecurity& security);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_SECURITY_H_

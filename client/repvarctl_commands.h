// SPDX-License-Identifier: Apache-2.0
// repvarctl's commands, one function each: what they ask the cluster and
// what they print (text, or one JSON document with --json). Each returns
// the process's exit code: 0, or 1 after printing the error.
#ifndef REPVAR_CLIENT_REPVARCTL_COMMANDS_H_
#define REPVAR_CLIENT_REPVARCTL_COMMANDS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "repvar/client.h"

namespace repvar::ctl {

// The options every command takes.
struct Options {
  std::string coordinator;  // empty: $REPVAR_COORDINATOR_ADDRESS
  bool json = false;
  std::string tls_ca, tls_cert, tls_key, token_file;  // empty: $REPVAR_TLS_*, $REPVAR_TOKEN_FILE
};

// Prints `s` as the error; returns 1.
int Fail(const absl::Status& s);
void Print(const nlohmann::json& j);

int Topology(Client& c, const Options& o);
int Vars(Client& c, const std::string& collection, const Options& o);
int Read(Client& c, const std::string& name, int max_elements, const Options& o);
// `verb`: assign, assign_add or assign_sub; `value`: comma-separated.
int Assign(Client& c, const std::string& verb, const std::string& name, const std::string& value,
           const Options& o);
int Steps(Client& c, const Options& o);
int Watch(Client& c, int64_t after, int64_t from_step, absl::Duration watch_for, const Options& o);
int Status(Client& c, const Options& o);
int Save(Client& c, const std::string& path, const Options& o);
int Restore(Client& c, const std::string& path, int replicas, const Options& o);
int Drain(Client& c, bool resume, const Options& o);

}  // namespace repvar::ctl

#endif  // REPVAR_CLIENT_REPVARCTL_COMMANDS_H_

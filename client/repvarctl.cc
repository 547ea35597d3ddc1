// SPDX-License-Identifier: Apache-2.0
// repvarctl: look at and poke a repvar cluster (CLI11; `repvarctl --help`,
// `repvarctl COMMAND --help`). Every command prints text, or one JSON
// document with --json (nlohmann::json: int64 exact, NaN and infinities as
// the strings "NaN", "Infinity", "-Infinity"); repvarctl_commands.h has
// them.
#include <map>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/repvarctl_commands.h"
#include "common/base/version.h"
#include "repvar/client.h"
#include "repvar/step.h"

namespace {

namespace ctl = repvar::ctl;
using ctl::Options;

struct DurationValidator : CLI::Validator {
  DurationValidator() : CLI::Validator("DURATION") {
    func_ = [](const std::string& s) {
      absl::Duration d;
      return absl::ParseDuration(s, &d) ? std::string() : "not a duration (e.g. 30s, 2h): " + s;
    };
  }
};

// What the command line asks for: its commands and their arguments.
struct Commands {
  CLI::App* topology = nullptr;
  CLI::App* vars = nullptr;
  CLI::App* read = nullptr;
  std::map<std::string, CLI::App*> writes;  // assign, assign_add, assign_sub
  CLI::App* steps = nullptr;
  CLI::App* watch = nullptr;
  CLI::App* status = nullptr;
  CLI::App* del = nullptr;
  CLI::App* save = nullptr;
  CLI::App* restore = nullptr;
  CLI::App* drain = nullptr;
  CLI::App* resume = nullptr;
  std::string name, collection, value, path, watch_for = "24h";
  int max_elements = 16, replicas = 0;
  int64_t after = repvar::kStepEventsFromNow;
  int64_t from_step = -1;
};

void AddGlobalOptions(CLI::App& app, Options& o) {
  app.set_version_flag("--version",
                       absl::StrCat("repvarctl ", repvar::kVersion, " (commit ", repvar::kGitCommit,
                                    ", ", repvar::kBuildType, " build)"));
  app.require_subcommand(1);
  app.fallthrough();  // the options above also after the command (repvarctl vars --json)
  app.add_option("--coordinator", o.coordinator,
                 "host:port of the coordinator (default: $REPVAR_COORDINATOR_ADDRESS)");
  app.add_flag("--json", o.json, "print one JSON document (watch: one object per line)");
  app.add_option("--tls_ca", o.tls_ca, "CA file: TLS to the coordinator ($REPVAR_TLS_CA)");
  app.add_option("--tls_cert", o.tls_cert, "client certificate ($REPVAR_TLS_CERT)");
  app.add_option("--tls_key", o.tls_key, "its key ($REPVAR_TLS_KEY)");
  app.add_option("--token_file", o.token_file,
                 "file whose first line is the bearer token ($REPVAR_TOKEN_FILE)");
}

void AddReadingCommands(CLI::App& app, Commands& c) {
  c.topology = app.add_subcommand("topology", "tasks, accelerators, the infeed host");
  c.vars = app.add_subcommand("vars", "variables and their replicas");
  c.vars->add_option("collection", c.collection, "only this collection");
  c.read = app.add_subcommand("read", "a variable's committed value");
  c.read->add_option("name", c.name)->required();
  c.read->add_option("--max_elements", c.max_elements, "elements printed (text)");
  c.steps = app.add_subcommand("steps", "the open step's progress, the last resolutions");
  c.watch = app.add_subcommand("watch", "step events as they happen");
  c.watch->add_option("--watch_for", c.watch_for, "how long to stream")->check(DurationValidator());
  auto* after_option = c.watch->add_option("--after", c.after,
                                           "replay events after this seq (0: all the coordinator "
                                           "holds; default: only new ones)");
  c.watch
      ->add_option("--from", c.from_step,
                   "events of step STEP and later that the coordinator still holds, then new ones")
      ->excludes(after_option);
  c.status = app.add_subcommand("status", "the whole cluster (admin)");
}

void AddChangingCommands(CLI::App& app, Commands& c) {
  for (const char* verb : {"assign", "assign_add", "assign_sub"}) {
    auto* w = app.add_subcommand(verb, absl::StrCat(verb,
                                                    " NAME --value=v1,v2,...: to every "
                                                    "replica (one value fills)"));
    w->add_option("name", c.name)->required();
    w->add_option("--value", c.value, "comma-separated values, row-major")->required();
    c.writes[verb] = w;
  }
  c.del = app.add_subcommand("delete", "delete a variable (admin)");
  c.del->add_option("name", c.name)->required();
  c.save = app.add_subcommand("save", "a consistent cut into a .safetensors file");
  c.save->add_option("file", c.path)->required();
  c.restore = app.add_subcommand("restore", "a .safetensors file back into the cluster");
  c.restore->add_option("file", c.path)->required();
  c.restore->add_option("--replicas", c.replicas,
                        "replicas of the variables it creates (0: as saved in the file)");
  c.drain = app.add_subcommand("drain", "refuse new changes before maintenance (admin)");
  c.resume = app.add_subcommand("resume", "serve changes again (admin)");
}

int Run(repvar::Client& client, Commands& c, const Options& o) {
  if (*c.topology) return ctl::Topology(client, o);
  if (*c.vars) return ctl::Vars(client, c.collection, o);
  if (*c.read) return ctl::Read(client, c.name, c.max_elements, o);
  for (const auto& [verb, sub] : c.writes) {
    if (*sub) return ctl::Assign(client, verb, c.name, c.value, o);
  }
  if (*c.steps) return ctl::Steps(client, o);
  if (*c.watch) {
    absl::Duration d;
    (void)absl::ParseDuration(c.watch_for, &d);
    if (c.from_step >= 0) c.after = 0;  // replay what is held, skip the steps before
    return ctl::Watch(client, c.after, c.from_step, d, o);
  }
  if (*c.status) return ctl::Status(client, o);
  if (*c.del) {
    absl::Status s = client.DeleteVariable(c.name);
    if (!s.ok()) return ctl::Fail(s);
    if (o.json) ctl::Print({{"deleted", c.name}});
    return 0;
  }
  if (*c.save) return ctl::Save(client, c.path, o);
  if (*c.restore) return ctl::Restore(client, c.path, c.replicas, o);
  if (*c.drain || *c.resume) return ctl::Drain(client, c.resume->parsed(), o);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "repvarctl: look at and poke a repvar cluster. Security from the flags or "
      "$REPVAR_TLS_CA, $REPVAR_TLS_CERT, $REPVAR_TLS_KEY, $REPVAR_TOKEN_FILE.",
      "repvarctl"};
  Options o;
  Commands commands;
  AddGlobalOptions(app, o);
  AddReadingCommands(app, commands);
  AddChangingCommands(app, commands);
  CLI11_PARSE(app, argc, argv);
  repvar::ClientOptions copts{.coordinator_address = o.coordinator, .deadline = absl::Seconds(30)};
  copts.tls_ca_file = o.tls_ca;
  copts.tls_cert_file = o.tls_cert;
  copts.tls_key_file = o.tls_key;
  copts.token_file = o.token_file;
  auto client = repvar::Client::Connect(copts);
  if (!client.ok()) return ctl::Fail(client.status());
  return Run(**client, commands, o);
}

// SPDX-License-Identifier: Apache-2.0
// repvarctl: look at and poke a repvar cluster (CLI11; `repvarctl --help`,
// `repvarctl COMMAND --help`). Every command prints text, or one JSON
// document with --json (nlohmann::json: int64 exact, NaN and infinities as
// the strings "NaN", "Infinity", "-Infinity").
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/base/version.h"
#include "common/tensor/element_math.h"
#include "common/tensor/tensor.h"
#include "nlohmann/json.hpp"
#include "repvar/client.h"
#include "repvar/step.h"

namespace {

using json = nlohmann::json;

struct Options {
  std::string coordinator;  // empty: $REPVAR_COORDINATOR_ADDRESS
  bool json = false;
  std::string tls_ca, tls_cert, tls_key, token_file;  // empty: $REPVAR_TLS_*, $REPVAR_TOKEN_FILE
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

void Print(const json& j) { std::cout << j.dump() << "\n"; }

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

// A double as JSON allows it: NaN and the infinities as the strings "NaN",
// "Infinity", "-Infinity" (JSON has no such numbers).
json NumberJson(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return d;
}

// A tensor's first `limit` elements: integers exactly, floats as numbers
// (NumberJson).
json Elements(const repvar::TensorValue& v, size_t limit = SIZE_MAX) {
  json out = json::array();
  const size_t n = std::min(limit, v.bytes.size() / repvar::ItemSize(v.dtype));
  switch (v.dtype) {
    case repvar::DType::kInt32:
      for (int32_t x : v.as<int32_t>().first(n)) out.push_back(x);
      return out;
    case repvar::DType::kInt64:
      for (int64_t x : v.as<int64_t>().first(n)) out.push_back(x);
      return out;
    default:
      break;
  }
  // LoadElement reads a Tensor: one of just the elements shown.
  const size_t bytes = n * repvar::ItemSize(v.dtype);
  repvar::Tensor t;
  t.spec = repvar::TensorSpec{v.dtype, {static_cast<int64_t>(n)}};
  auto buf = repvar::Buffer::Allocate(bytes);
  if (!buf.ok()) return out;
  t.bytes = *std::move(buf);
  if (bytes != 0) std::memcpy(t.bytes.data(), v.bytes.data(), bytes);
  for (size_t i = 0; i < n; ++i)
    out.push_back(NumberJson(repvar::LoadElement(t, static_cast<int64_t>(i))));
  return out;
}

std::string ElementsText(const repvar::TensorValue& v, size_t limit) {
  const json shown = Elements(v, limit);
  std::vector<std::string> parts;
  for (const json& e : shown) {
    parts.push_back(e.is_number_float() ? absl::StrFormat("%.9g", e.get<double>())
                    : e.is_string()     ? e.get<std::string>()
                                        : e.dump());
  }
  const size_t n = v.bytes.size() / repvar::ItemSize(v.dtype);
  if (n > limit) parts.push_back(absl::StrCat("... (", n, " elements)"));
  return absl::StrJoin(parts, ", ");
}

int Topology(repvar::Client& c, const Options& o) {
  auto t = c.GetTopology();
  if (!t.ok()) return Fail(t.status());
  if (o.json) {
    json j{{"version", t->version},
           {"tasks", json::array()},
           {"accelerators", json::array()},
           {"infeed_host", nullptr},
           {"missing_tasks", t->missing_tasks}};
    for (const auto& task : t->tasks) {
      j["tasks"].push_back({{"job", task.job},
                            {"task", task.task},
                            {"address", task.address},
                            {"devices", task.devices}});
    }
    for (const auto& a : t->accelerators) {
      j["accelerators"].push_back({{"ordinal", a.ordinal}, {"device", a.device}});
    }
    if (t->infeed_host) {
      j["infeed_host"] = {{"job", t->infeed_host->job},
                          {"task", t->infeed_host->task},
                          {"address", t->infeed_host->address},
                          {"cpu_device", t->infeed_host->cpu_device}};
    }
    Print(j);
    return 0;
  }
  std::cout << "topology version " << t->version << ", " << t->tasks.size() << " task(s), "
            << t->accelerators.size() << " accelerator(s)\n";
  for (const auto& task : t->tasks) {
    std::cout << "  " << task.job << ":" << task.task << " at " << task.address << " ("
              << task.devices.size() << " devices)\n";
  }
  for (const auto& a : t->accelerators) {
    std::cout << "  ordinal " << a.ordinal << "  " << a.device << "\n";
  }
  if (t->infeed_host) {
    std::cout << "infeed host: " << t->infeed_host->job << ":" << t->infeed_host->task << " at "
              << t->infeed_host->address << ", enqueue/dequeue on " << t->infeed_host->cpu_device
              << "\n";
  } else {
    std::cout << "infeed host: none (no accelerators registered)\n";
  }
  if (!t->missing_tasks.empty()) {
    std::cout << "missing: " << absl::StrJoin(t->missing_tasks, ", ") << "\n";
  }
  return 0;
}

json VariableJson(const repvar::VariableInfo& v) {
  json reps = json::array();
  for (const auto& r : v.replicas) {
    reps.push_back({{"name", r.name},
                    {"device", r.device},
                    {"version", r.version},
                    {"state", repvar::ReplicaStateName(r.state)}});
  }
  return {
      {"name", v.spec.name},          {"dtype", repvar::DTypeName(v.spec.dtype)},
      {"shape", v.spec.shape},        {"version", v.version},
      {"initialized", v.initialized}, {"aggregation", repvar::AggregationName(v.spec.aggregation)},
      {"collections", v.collections}, {"replicas", reps}};
}

int Vars(repvar::Client& c, const std::string& collection, const Options& o) {
  auto vars = c.ListVariables(collection);
  if (!vars.ok()) return Fail(vars.status());
  if (o.json) {
    json j = json::array();
    for (const auto& v : *vars) j.push_back(VariableJson(v));
    Print(j);
    return 0;
  }
  if (vars->empty()) std::cout << "no variables\n";
  for (const auto& v : *vars) {
    std::cout << v.spec.name << "  " << repvar::DTypeName(v.spec.dtype) << Shape(v.spec.shape)
              << "  version " << v.version << (v.initialized ? "" : " (uninitialized)") << "  "
              << v.replicas.size() << " replica(s), aggregation "
              << repvar::AggregationName(v.spec.aggregation) << "\n";
    for (const auto& r : v.replicas) {
      std::cout << "    " << r.name << " on " << r.device << "  v" << r.version << "  "
                << repvar::ReplicaStateName(r.state) << "\n";
    }
  }
  return 0;
}

int Read(repvar::Client& c, const std::string& name, int max_elements, const Options& o) {
  auto v = c.Read(name);
  if (!v.ok()) return Fail(v.status());
  const std::string checksum = absl::StrFormat("%016x", v->checksum);
  if (o.json) {
    Print({{"name", name},
           {"version", v->version},
           {"dtype", repvar::DTypeName(v->dtype)},
           {"shape", v->shape},
           {"checksum", checksum},
           {"values", Elements(*v)}});
    return 0;
  }
  std::cout << name << " version " << v->version << " " << repvar::DTypeName(v->dtype)
            << Shape(v->shape) << " checksum " << checksum << "\n  ["
            << ElementsText(*v, static_cast<size_t>(std::max(0, max_elements))) << "]\n";
  return 0;
}

// `text`: comma-separated values, one per element (or one to fill), parsed
// in the variable's dtype (int64 exactly).
absl::StatusOr<repvar::Tensor> ParseValue(const repvar::VariableInfo& info,
                                          const std::string& text) {
  repvar::TensorSpec spec{info.spec.dtype, info.spec.shape};
  auto t = repvar::Tensor::Zeros(spec);
  if (!t.ok()) return t.status();
  std::vector<std::string> parts = absl::StrSplit(text, absl::ByChar(','), absl::SkipWhitespace());
  auto n = spec.NumElements();
  if (!n.ok()) return n.status();
  if (static_cast<int64_t>(parts.size()) != *n && parts.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(info.spec.name, " has ", *n,
                                                   " elements; --value gives ", parts.size(),
                                                   " (or give one to fill)"));
  }
  for (int64_t i = 0; i < *n; ++i) {
    const std::string p(absl::StripAsciiWhitespace(parts.size() == 1 ? parts[0] : parts[i]));
    if (spec.dtype == repvar::DType::kInt64 || spec.dtype == repvar::DType::kInt32) {
      int64_t x;
      if (!absl::SimpleAtoi(p, &x)) return absl::InvalidArgumentError("not an integer: " + p);
      if (spec.dtype == repvar::DType::kInt32) {
        if (x < INT32_MIN || x > INT32_MAX) {
          return absl::InvalidArgumentError("out of int32 range: " + p);
        }
        const int32_t y = static_cast<int32_t>(x);
        std::memcpy(t->bytes.data() + i * 4, &y, 4);
      } else {
        std::memcpy(t->bytes.data() + i * 8, &x, 8);
      }
      continue;
    }
    double d;
    if (!absl::SimpleAtod(p, &d)) return absl::InvalidArgumentError("not a number: " + p);
    repvar::StoreElement(*t, i, d);
  }
  return t;
}

int Assign(repvar::Client& c, const std::string& verb, const std::string& name,
           const std::string& value, const Options& o) {
  auto info = c.GetVariable(name);
  if (!info.ok()) return Fail(info.status());
  auto t = ParseValue(*info, value);
  if (!t.ok()) return Fail(t.status());
  auto bytes = t->bytes.span();
  absl::StatusOr<repvar::WriteAck> ack = verb == "assign_add"   ? c.AssignAdd(name, bytes)
                                         : verb == "assign_sub" ? c.AssignSub(name, bytes)
                                                                : c.Assign(name, bytes);
  if (!ack.ok()) return Fail(ack.status());
  if (o.json) {
    Print({{"name", name}, {"version", ack->version}});
  } else {
    std::cout << name << " is now version " << ack->version << " on every live replica\n";
  }
  return 0;
}

json StepsJson(const repvar::StepsSummary& st) {
  json j{{"last_committed_step", st.last_committed_step},
         {"open", nullptr},
         {"recent", json::array()}};
  if (st.open) {
    json participants = json::array();
    for (const auto& p : st.open->participants) {
      participants.push_back({{"task", p.task},
                              {"reported", p.reported},
                              {"finished", p.finished},
                              {"last_activity", p.last_activity}});
    }
    j["open"] = {{"step", st.open->step},
                 {"epoch", st.open->epoch},
                 {"barrier_timeout_ms", absl::ToInt64Milliseconds(st.open->barrier_timeout)},
                 {"variables", st.open->variables},
                 {"participants", participants}};
  }
  for (const auto& r : st.recent) {
    j["recent"].push_back({{"step", r.step},
                           {"epoch", r.epoch},
                           {"committed", r.committed},
                           {"error", r.error},
                           {"variables_changed", r.variables_changed},
                           {"divergences_repaired", r.divergences_repaired}});
  }
  return j;
}

// The open step's progress per participant and the last resolutions.
int Steps(repvar::Client& c, const Options& o) {
  if (!o.json) {
    auto lines = repvar::DescribeSteps(c);
    if (!lines.ok()) return Fail(lines.status());
    for (const std::string& l : *lines) std::printf("%s\n", l.c_str());
    return 0;
  }
  auto st = repvar::GetStepsSummary(c);
  if (!st.ok()) return Fail(st.status());
  Print(StepsJson(*st));
  return 0;
}

// Step events as they happen (from now on, after --after, or of --from's
// step on), until
// --watch_for ends: a line each, or a JSON object per line with --json.
int Watch(repvar::Client& c, int64_t after, int64_t from_step, absl::Duration watch_for,
          const Options& o) {
  static const char* kKinds[] = {"?", "BEGUN", "REPORTED", "STRAGGLERS", "AGGREGATING", "RESOLVED"};
  absl::Status s = repvar::WatchSteps(c, after, watch_for, [&](const repvar::StepEventInfo& e) {
    if (e.step < from_step) return true;
    const char* kind = kKinds[static_cast<int>(e.kind)];
    const bool resolved = e.kind == repvar::StepEventInfo::Kind::kResolved;
    if (o.json) {
      json j{{"seq", e.seq},
             {"kind", kind},
             {"step", e.step},
             {"epoch", e.epoch},
             {"time", absl::FormatTime(absl::RFC3339_full, absl::Now(), absl::UTCTimeZone())}};
      if (!e.task.empty()) j["task"] = e.task;
      if (!e.missing.empty()) j["missing"] = e.missing;
      if (resolved) j["committed"] = e.committed;
      if (resolved && !e.committed) j["error"] = e.error;
      Print(j);
    } else {
      std::printf("%s seq %lld step %lld (epoch %llu) %s", absl::FormatTime(absl::Now()).c_str(),
                  static_cast<long long>(e.seq), static_cast<long long>(e.step),
                  static_cast<unsigned long long>(e.epoch), kind);
      if (!e.task.empty()) std::printf(" %s", e.task.c_str());
      if (!e.missing.empty()) {
        std::printf(" waiting for: %s", absl::StrJoin(e.missing, ", ").c_str());
      }
      if (resolved) std::printf(" %s", e.committed ? "committed" : e.error.c_str());
      std::printf("\n");
    }
    std::fflush(stdout);
    return true;
  });
  return s.ok() ? 0 : Fail(s);
}

// The operator's view (CoordinatorAdmin.GetClusterStatus): tasks, every
// variable with its replicas' states, the steps.
int Status(repvar::Client& c, const Options& o) {
  auto st = c.GetClusterStatus();
  if (!st.ok()) return Fail(st.status());
  std::map<std::string, int> states;
  for (const auto& v : st->variables) {
    for (const auto& r : v.replicas) ++states[repvar::ReplicaStateName(r.state)];
  }
  if (o.json) {
    json tasks = json::array(), vars = json::array();
    for (const auto& t : st->topology.tasks) {
      tasks.push_back(
          {{"job", t.job}, {"task", t.task}, {"address", t.address}, {"devices", t.devices}});
    }
    for (const auto& v : st->variables) vars.push_back(VariableJson(v));
    json curves = json::array();
    for (const auto& curve : st->scalars) {
      json values = json::array();
      for (double v : curve.values) values.push_back(NumberJson(v));
      curves.push_back({{"name", curve.name}, {"steps", curve.steps}, {"values", values}});
    }
    json infeed = nullptr;
    if (st->topology.infeed_host) {
      infeed = {{"job", st->topology.infeed_host->job},
                {"task", st->topology.infeed_host->task},
                {"cpu_device", st->topology.infeed_host->cpu_device}};
    }
    Print({{"topology_version", st->topology.version},
           {"tasks", tasks},
           {"infeed_host", infeed},
           {"missing_tasks", st->topology.missing_tasks},
           {"accelerators", st->topology.accelerators.size()},
           {"variables", vars},
           {"replicas_by_state", states},
           {"draining", st->draining},
           {"divergences_repaired", st->divergences_repaired},
           {"steps", StepsJson(st->steps_summary)},
           {"scalars", curves}});
    return 0;
  }
  std::cout << "topology version " << st->topology.version << ", " << st->topology.tasks.size()
            << " live task(s), " << st->topology.accelerators.size() << " accelerator(s)\n";
  const auto& infeed = st->topology.infeed_host;
  for (const auto& t : st->topology.tasks) {
    const bool is_infeed = infeed && infeed->job == t.job && infeed->task == t.task;
    std::cout << "  " << t.job << ":" << t.task << " at " << t.address << ", " << t.devices.size()
              << " device(s)" << (is_infeed ? "  <- infeed host" : "") << "\n";
  }
  for (const auto& m : st->topology.missing_tasks) std::cout << "  missing " << m << "\n";
  std::cout << st->variables.size() << " variable(s); replicas:";
  for (const auto& [state, n] : states) std::cout << " " << n << " " << state;
  std::cout << "\n";
  if (st->draining) std::cout << "DRAINING: new changes are refused until resumed\n";
  int64_t repaired = 0;
  for (const auto& [in, n] : st->divergences_repaired) repaired += n;
  if (repaired > 0) {
    std::cout << repaired << " diverged replica(s) repaired since the coordinator started\n";
  }
  for (const std::string& line : st->steps) std::cout << line << "\n";
  for (const auto& curve : st->scalars) {
    if (curve.steps.empty()) continue;
    std::cout << absl::StrFormat("%s at step %d: %g\n", curve.name, curve.steps.back(),
                                 curve.values.back());
  }
  return 0;
}

// A progress line on stderr, redrawn in place on a terminal (nothing
// otherwise: the summary on stdout says what was done).
class ProgressBar {
 public:
  explicit ProgressBar(const char* verb) : verb_(verb), tty_(::isatty(2) == 1) {}
  void Show(const repvar::CheckpointProgress& p) {
    if (!tty_) return;
    const double pct = p.bytes_total == 0 ? 100.0 : 100.0 * p.bytes_done / p.bytes_total;
    std::fprintf(stderr, "\r%s %5.1f%%  %d/%d variables  %.1f/%.1f MiB  %-40.40s", verb_, pct,
                 p.variables_done, p.variables_total, p.bytes_done / 1048576.0,
                 p.bytes_total / 1048576.0, p.variable.c_str());
    std::fflush(stderr);
  }
  void Done() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  const char* const verb_;
  const bool tty_;
};

int Save(repvar::Client& c, const std::string& path, const Options& o) {
  ProgressBar bar("save");
  auto r = c.SaveCheckpoint(path, [&](const repvar::CheckpointProgress& p) { bar.Show(p); });
  bar.Done();
  if (!r.ok()) return Fail(r.status());
  if (o.json) {
    Print({{"file", path},
           {"variables", r->variables},
           {"bytes", r->bytes},
           {"last_committed_step", r->last_committed_step},
           {"uninitialized", r->uninitialized}});
    return 0;
  }
  std::printf("saved %d variable(s), %llu bytes, after step %lld, to %s\n", r->variables,
              static_cast<unsigned long long>(r->bytes),
              static_cast<long long>(r->last_committed_step), path.c_str());
  if (!r->uninitialized.empty()) {
    std::printf("not saved (uninitialized): %s\n", absl::StrJoin(r->uninitialized, ", ").c_str());
  }
  return 0;
}

int Restore(repvar::Client& c, const std::string& path, int replicas, const Options& o) {
  ProgressBar bar("restore");
  auto r = c.RestoreCheckpoint(
      path, {.replicas = replicas,
             .progress = [&](const repvar::CheckpointProgress& p) { bar.Show(p); }});
  bar.Done();
  if (!r.ok()) return Fail(r.status());
  if (o.json) {
    Print({{"file", path},
           {"variables", r->variables},
           {"created", r->created},
           {"bytes", r->bytes}});
  } else {
    std::printf("restored %d variable(s) (%d created), %llu bytes, from %s\n", r->variables,
                r->created, static_cast<unsigned long long>(r->bytes), path.c_str());
  }
  return 0;
}

int Drain(repvar::Client& c, bool resume, const Options& o) {
  auto state = c.Drain(resume);
  if (!state.ok()) return Fail(state.status());
  if (o.json) {
    Print({{"draining", state->draining}, {"open_step", state->open_step}});
    return 0;
  }
  std::printf("%s", state->draining ? "draining: new changes are refused" : "serving");
  if (state->open_step != 0) {
    std::printf("; step %lld is still open", static_cast<long long>(state->open_step));
  }
  std::printf("\n");
  return 0;
}

// A CLI11 validator for absl durations ("30s", "1h").
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
  if (*c.topology) return Topology(client, o);
  if (*c.vars) return Vars(client, c.collection, o);
  if (*c.read) return Read(client, c.name, c.max_elements, o);
  for (const auto& [verb, sub] : c.writes) {
    if (*sub) return Assign(client, verb, c.name, c.value, o);
  }
  if (*c.steps) return Steps(client, o);
  if (*c.watch) {
    absl::Duration d;
    (void)absl::ParseDuration(c.watch_for, &d);
    if (c.from_step >= 0) c.after = 0;  // replay what is held, skip the steps before
    return Watch(client, c.after, c.from_step, d, o);
  }
  if (*c.status) return Status(client, o);
  if (*c.del) {
    absl::Status s = client.DeleteVariable(c.name);
    if (!s.ok()) return Fail(s);
    if (o.json) Print({{"deleted", c.name}});
    return 0;
  }
  if (*c.save) return Save(client, c.path, o);
  if (*c.restore) return Restore(client, c.path, c.replicas, o);
  if (*c.drain || *c.resume) return Drain(client, c.resume->parsed(), o);
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
  if (!client.ok()) return Fail(client.status());
  return Run(**client, commands, o);
}

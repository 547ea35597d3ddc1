// SPDX-License-Identifier: Apache-2.0
#include "client/repvarctl_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

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

namespace repvar::ctl {
namespace {

using json = nlohmann::json;

// A double as JSON allows it: NaN and the infinities as the strings "NaN",
// "Infinity", "-Infinity" (JSON has no such numbers).
json NumberJson(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return d;
}

// A tensor's first `limit` elements: integers exactly, floats as numbers
// (NumberJson).
json Elements(const TensorValue& v, size_t limit = SIZE_MAX) {
  json out = json::array();
  const size_t n = std::min(limit, v.bytes.size() / ItemSize(v.dtype));
  switch (v.dtype) {
    case DType::kInt32:
      for (int32_t x : v.as<int32_t>().first(n)) out.push_back(x);
      return out;
    case DType::kInt64:
      for (int64_t x : v.as<int64_t>().first(n)) out.push_back(x);
      return out;
    default:
      break;
  }
  // LoadElement reads a Tensor: one of just the elements shown.
  const size_t bytes = n * ItemSize(v.dtype);
  Tensor t;
  t.spec = TensorSpec{v.dtype, {static_cast<int64_t>(n)}};
  auto buf = Buffer::Allocate(bytes);
  if (!buf.ok()) return out;
  t.bytes = *std::move(buf);
  if (bytes != 0) std::memcpy(t.bytes.data(), v.bytes.data(), bytes);
  for (size_t i = 0; i < n; ++i) out.push_back(NumberJson(LoadElement(t, static_cast<int64_t>(i))));
  return out;
}

std::string ElementsText(const TensorValue& v, size_t limit) {
  const json shown = Elements(v, limit);
  std::vector<std::string> parts;
  for (const json& e : shown) {
    parts.push_back(e.is_number_float() ? absl::StrFormat("%.9g", e.get<double>())
                    : e.is_string()     ? e.get<std::string>()
                                        : e.dump());
  }
  const size_t n = v.bytes.size() / ItemSize(v.dtype);
  if (n > limit) parts.push_back(absl::StrCat("... (", n, " elements)"));
  return absl::StrJoin(parts, ", ");
}

json VariableJson(const VariableInfo& v) {
  json reps = json::array();
  for (const auto& r : v.replicas) {
    reps.push_back({{"name", r.name},
                    {"device", r.device},
                    {"version", r.version},
                    {"state", ReplicaStateName(r.state)}});
  }
  return {{"name", v.spec.name},          {"dtype", DTypeName(v.spec.dtype)},
          {"shape", v.spec.shape},        {"version", v.version},
          {"initialized", v.initialized}, {"aggregation", AggregationName(v.spec.aggregation)},
          {"collections", v.collections}, {"replicas", reps}};
}

// `text`: comma-separated values, one per element (or one to fill), parsed
// in the variable's dtype (int64 exactly).
absl::StatusOr<Tensor> ParseValue(const VariableInfo& info, const std::string& text) {
  TensorSpec spec{info.spec.dtype, info.spec.shape};
  auto t = Tensor::Zeros(spec);
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
    if (spec.dtype == DType::kInt64 || spec.dtype == DType::kInt32) {
      int64_t x;
      if (!absl::SimpleAtoi(p, &x)) return absl::InvalidArgumentError("not an integer: " + p);
      if (spec.dtype == DType::kInt32) {
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
    StoreElement(*t, i, d);
  }
  return t;
}

json StepsJson(const StepsSummary& st) {
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

// A progress line on stderr, redrawn in place on a terminal (nothing
// otherwise: the summary on stdout says what was done).
class ProgressBar {
 public:
  explicit ProgressBar(const char* verb) : verb_(verb), tty_(::isatty(2) == 1) {}
  void Show(const CheckpointProgress& p) {
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

}  // namespace

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

void Print(const json& j) { std::cout << j.dump() << "\n"; }

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

int Topology(Client& c, const Options& o) {
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

int Vars(Client& c, const std::string& collection, const Options& o) {
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
    std::cout << v.spec.name << "  " << DTypeName(v.spec.dtype) << Shape(v.spec.shape)
              << "  version " << v.version << (v.initialized ? "" : " (uninitialized)") << "  "
              << v.replicas.size() << " replica(s), aggregation "
              << AggregationName(v.spec.aggregation) << "\n";
    for (const auto& r : v.replicas) {
      std::cout << "    " << r.name << " on " << r.device << "  v" << r.version << "  "
                << ReplicaStateName(r.state) << "\n";
    }
  }
  return 0;
}

int Read(Client& c, const std::string& name, int max_elements, const Options& o) {
  auto v = c.Read(name);
  if (!v.ok()) return Fail(v.status());
  const std::string checksum = absl::StrFormat("%016x", v->checksum);
  if (o.json) {
    Print({{"name", name},
           {"version", v->version},
           {"dtype", DTypeName(v->dtype)},
           {"shape", v->shape},
           {"checksum", checksum},
           {"values", Elements(*v)}});
    return 0;
  }
  std::cout << name << " version " << v->version << " " << DTypeName(v->dtype) << Shape(v->shape)
            << " checksum " << checksum << "\n  ["
            << ElementsText(*v, static_cast<size_t>(std::max(0, max_elements))) << "]\n";
  return 0;
}

int Assign(Client& c, const std::string& verb, const std::string& name, const std::string& value,
           const Options& o) {
  auto info = c.GetVariable(name);
  if (!info.ok()) return Fail(info.status());
  auto t = ParseValue(*info, value);
  if (!t.ok()) return Fail(t.status());
  auto bytes = t->bytes.span();
  absl::StatusOr<WriteAck> ack = verb == "assign_add"   ? c.AssignAdd(name, bytes)
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

// The open step's progress per participant and the last resolutions.
int Steps(Client& c, const Options& o) {
  if (!o.json) {
    auto lines = DescribeSteps(c);
    if (!lines.ok()) return Fail(lines.status());
    for (const std::string& l : *lines) std::printf("%s\n", l.c_str());
    return 0;
  }
  auto st = GetStepsSummary(c);
  if (!st.ok()) return Fail(st.status());
  Print(StepsJson(*st));
  return 0;
}

// Step events as they happen (from now on, after --after, or of --from's
// step on), until
// --watch_for ends: a line each, or a JSON object per line with --json.
int Watch(Client& c, int64_t after, int64_t from_step, absl::Duration watch_for, const Options& o) {
  static const char* kKinds[] = {"?", "BEGUN", "REPORTED", "STRAGGLERS", "AGGREGATING", "RESOLVED"};
  absl::Status s = WatchSteps(c, after, watch_for, [&](const StepEventInfo& e) {
    if (e.step < from_step) return true;
    const char* kind = kKinds[static_cast<int>(e.kind)];
    const bool resolved = e.kind == StepEventInfo::Kind::kResolved;
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
int Status(Client& c, const Options& o) {
  auto st = c.GetClusterStatus();
  if (!st.ok()) return Fail(st.status());
  std::map<std::string, int> states;
  for (const auto& v : st->variables) {
    for (const auto& r : v.replicas) ++states[ReplicaStateName(r.state)];
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

int Save(Client& c, const std::string& path, const Options& o) {
  ProgressBar bar("save");
  auto r = c.SaveCheckpoint(path, [&](const CheckpointProgress& p) { bar.Show(p); });
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

int Restore(Client& c, const std::string& path, int replicas, const Options& o) {
  ProgressBar bar("restore");
  auto r = c.RestoreCheckpoint(
      path, {.replicas = replicas, .progress = [&](const CheckpointProgress& p) { bar.Show(p); }});
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

int Drain(Client& c, bool resume, const Options& o) {
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

}  // namespace repvar::ctl

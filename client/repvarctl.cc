// SPDX-License-Identifier: Apache-2.0
// repvarctl: look at and poke a repvar cluster.
//   repvarctl [--coordinator=host:port] [--json] topology
//   repvarctl vars [COLLECTION]
//   repvarctl read NAME
//   repvarctl assign NAME --value=1,2,3   (also assign_add, assign_sub)
//   repvarctl status                      (the admin service: the whole cluster)
//   repvarctl delete NAME                 (the admin service)
//   repvarctl save FILE                   a consistent cut into a .safetensors file
//   repvarctl restore FILE [--replicas=N] the file's values back into the cluster
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/tensor/element_math.h"
#include "common/tensor/tensor.h"
#include "repvar/client.h"
#include "repvar/step.h"

ABSL_FLAG(std::string, coordinator, "", "host:port (default: $REPVAR_COORDINATOR_ADDRESS)");
ABSL_FLAG(bool, json, false, "print JSON for scripts");
ABSL_FLAG(absl::Duration, watch_for, absl::Hours(24), "how long `watch` streams");
ABSL_FLAG(std::string, value, "", "comma-separated values for assign, row-major");
ABSL_FLAG(int32_t, max_elements, 16, "elements printed by read (text mode)");
ABSL_FLAG(int32_t, replicas, 0,
          "restore: replicas of the variables it creates (0: as saved in the file)");

namespace {

std::string Q(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

int Topology(repvar::Client& c, bool json) {
  auto t = c.GetTopology();
  if (!t.ok()) return Fail(t.status());
  if (json) {
    std::vector<std::string> tasks, accs;
    for (const auto& task : t->tasks) {
      std::vector<std::string> devs;
      for (const auto& d : task.devices) devs.push_back(Q(d));
      tasks.push_back(absl::StrCat("{\"job\":", Q(task.job), ",\"task\":", task.task,
                                   ",\"address\":", Q(task.address), ",\"devices\":[",
                                   absl::StrJoin(devs, ","), "]}"));
    }
    for (const auto& a : t->accelerators) {
      accs.push_back(absl::StrCat("{\"ordinal\":", a.ordinal, ",\"device\":", Q(a.device), "}"));
    }
    std::string infeed = "null";
    if (t->infeed_host) {
      infeed = absl::StrCat("{\"job\":", Q(t->infeed_host->job), ",\"task\":", t->infeed_host->task,
                            ",\"address\":", Q(t->infeed_host->address),
                            ",\"cpu_device\":", Q(t->infeed_host->cpu_device), "}");
    }
    std::vector<std::string> missing;
    for (const auto& m : t->missing_tasks) missing.push_back(Q(m));
    std::cout << "{\"version\":" << t->version << ",\"tasks\":[" << absl::StrJoin(tasks, ",")
              << "],\"accelerators\":[" << absl::StrJoin(accs, ",")
              << "],\"infeed_host\":" << infeed << ",\"missing_tasks\":["
              << absl::StrJoin(missing, ",") << "]}\n";
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

int Vars(repvar::Client& c, const std::string& collection, bool json) {
  auto vars = c.ListVariables(collection);
  if (!vars.ok()) return Fail(vars.status());
  if (json) {
    std::vector<std::string> out;
    for (const auto& v : *vars) {
      std::vector<std::string> reps;
      for (const auto& r : v.replicas) {
        reps.push_back(absl::StrCat("{\"name\":", Q(r.name), ",\"device\":", Q(r.device),
                                    ",\"version\":", r.version,
                                    ",\"state\":", Q(repvar::ReplicaStateName(r.state)), "}"));
      }
      std::vector<std::string> cols;
      for (const auto& col : v.collections) cols.push_back(Q(col));
      out.push_back(absl::StrCat(
          "{\"name\":", Q(v.spec.name), ",\"dtype\":", Q(repvar::DTypeName(v.spec.dtype)),
          ",\"shape\":", Shape(v.spec.shape), ",\"version\":", v.version,
          ",\"initialized\":", v.initialized ? "true" : "false",
          ",\"aggregation\":", Q(repvar::AggregationName(v.spec.aggregation)), ",\"collections\":[",
          absl::StrJoin(cols, ","), "],\"replicas\":[", absl::StrJoin(reps, ","), "]}"));
    }
    std::cout << "[" << absl::StrJoin(out, ",") << "]\n";
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

std::string FormatValues(const repvar::TensorValue& v, size_t limit) {
  repvar::Tensor t;
  t.spec = repvar::TensorSpec{v.dtype, v.shape};
  auto buf = repvar::Buffer::Allocate(v.bytes.size());
  if (!buf.ok()) return "?";
  t.bytes = *std::move(buf);
  if (!v.bytes.empty()) std::memcpy(t.bytes.data(), v.bytes.data(), v.bytes.size());
  size_t n = v.bytes.size() / repvar::ItemSize(v.dtype);
  std::vector<std::string> parts;
  for (size_t i = 0; i < n && i < limit; ++i) {
    parts.push_back(absl::StrFormat("%.9g", repvar::LoadElement(t, static_cast<int64_t>(i))));
  }
  if (n > limit) parts.push_back(absl::StrCat("... (", n, " elements)"));
  return absl::StrJoin(parts, ", ");
}

int Read(repvar::Client& c, const std::string& name, bool json) {
  auto v = c.Read(name);
  if (!v.ok()) return Fail(v.status());
  if (json) {
    std::cout << "{\"name\":" << Q(name) << ",\"version\":" << v->version
              << ",\"dtype\":" << Q(repvar::DTypeName(v->dtype)) << ",\"shape\":" << Shape(v->shape)
              << ",\"checksum\":\"" << absl::StrFormat("%016x", v->checksum) << "\",\"values\":["
              << FormatValues(*v, SIZE_MAX) << "]}\n";
    return 0;
  }
  std::cout << name << " version " << v->version << " " << repvar::DTypeName(v->dtype)
            << Shape(v->shape) << " checksum " << absl::StrFormat("%016x", v->checksum) << "\n  ["
            << FormatValues(*v, static_cast<size_t>(absl::GetFlag(FLAGS_max_elements))) << "]\n";
  return 0;
}

int Assign(repvar::Client& c, const std::string& verb, const std::string& name, bool json) {
  auto info = c.GetVariable(name);
  if (!info.ok()) return Fail(info.status());
  repvar::TensorSpec spec{info->spec.dtype, info->spec.shape};
  auto t = repvar::Tensor::Zeros(spec);
  if (!t.ok()) return Fail(t.status());
  std::vector<std::string> parts =
      absl::StrSplit(absl::GetFlag(FLAGS_value), absl::ByChar(','), absl::SkipWhitespace());
  auto n = spec.NumElements();
  if (!n.ok()) return Fail(n.status());
  if (static_cast<int64_t>(parts.size()) != *n && parts.size() != 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        name, " has ", *n, " elements; --value gives ", parts.size(), " (or give one to fill)")));
  }
  for (int64_t i = 0; i < *n; ++i) {
    double d;
    const std::string& p = parts.size() == 1 ? parts[0] : parts[i];
    if (!absl::SimpleAtod(p, &d)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("not a number: ", p)));
    }
    repvar::StoreElement(*t, i, d);
  }
  auto bytes = t->bytes.span();
  absl::StatusOr<repvar::WriteAck> ack = verb == "assign_add"   ? c.AssignAdd(name, bytes)
                                         : verb == "assign_sub" ? c.AssignSub(name, bytes)
                                                                : c.Assign(name, bytes);
  if (!ack.ok()) return Fail(ack.status());
  if (json) {
    std::cout << "{\"name\":" << Q(name) << ",\"version\":" << ack->version << "}\n";
  } else {
    std::cout << name << " is now version " << ack->version << " on every live replica\n";
  }
  return 0;
}

// The open step's progress per participant and the last resolutions.
int Steps(repvar::Client& c) {
  auto lines = repvar::DescribeSteps(c);
  if (!lines.ok()) return Fail(lines.status());
  for (const std::string& l : *lines) std::printf("%s\n", l.c_str());
  return 0;
}

// Step events as they happen (stragglers, failures), until --watch_for ends.
int Watch(repvar::Client& c) {
  absl::Status s =
      repvar::WatchSteps(c, 0, absl::GetFlag(FLAGS_watch_for), [](const repvar::StepEventInfo& e) {
        static const char* kKinds[] = {"?",          "BEGUN",       "REPORTED",
                                       "STRAGGLERS", "AGGREGATING", "RESOLVED"};
        std::printf("%s step %lld (epoch %llu) %s", absl::FormatTime(absl::Now()).c_str(),
                    static_cast<long long>(e.step), static_cast<unsigned long long>(e.epoch),
                    kKinds[static_cast<int>(e.kind)]);
        if (!e.task.empty()) std::printf(" %s", e.task.c_str());
        if (!e.missing.empty())
          std::printf(" waiting for: %s", absl::StrJoin(e.missing, ", ").c_str());
        if (e.kind == repvar::StepEventInfo::Kind::kResolved) {
          std::printf(" %s", e.committed ? "committed" : e.error.c_str());
        }
        std::printf("\n");
        std::fflush(stdout);
        return true;
      });
  if (!s.ok()) return Fail(s);
  return 0;
}

}  // namespace

// The operator's view (CoordinatorAdmin.GetClusterStatus): tasks, every
// variable with its replicas' states, the steps.
int Status(repvar::Client& c) {
  auto st = c.GetClusterStatus();
  if (!st.ok()) return Fail(st.status());
  std::cout << "topology version " << st->topology.version << ", " << st->topology.tasks.size()
            << " live task(s), " << st->topology.accelerators.size() << " accelerator(s)\n";
  for (const auto& t : st->topology.tasks) {
    std::cout << "  " << t.job << ":" << t.task << " at " << t.address << ", " << t.devices.size()
              << " device(s)\n";
  }
  for (const auto& m : st->topology.missing_tasks) std::cout << "  missing " << m << "\n";
  std::map<std::string, int> states;
  for (const auto& v : st->variables) {
    for (const auto& r : v.replicas) ++states[repvar::ReplicaStateName(r.state)];
  }
  std::cout << st->variables.size() << " variable(s); replicas:";
  for (const auto& [state, n] : states) std::cout << " " << n << " " << state;
  std::cout << "\n";
  for (const std::string& line : st->steps) std::cout << line << "\n";
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

int Save(repvar::Client& c, const std::string& path, bool json) {
  ProgressBar bar("save");
  auto r = c.SaveCheckpoint(path, [&](const repvar::CheckpointProgress& p) { bar.Show(p); });
  bar.Done();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("{\"file\":%s,\"variables\":%d,\"bytes\":%llu,\"last_committed_step\":%lld}\n",
                Q(path).c_str(), r->variables, static_cast<unsigned long long>(r->bytes),
                static_cast<long long>(r->last_committed_step));
  } else {
    std::printf("saved %d variable(s), %llu bytes, after step %lld, to %s\n", r->variables,
                static_cast<unsigned long long>(r->bytes),
                static_cast<long long>(r->last_committed_step), path.c_str());
    if (!r->uninitialized.empty()) {
      std::printf("not saved (uninitialized): %s\n", absl::StrJoin(r->uninitialized, ", ").c_str());
    }
  }
  return 0;
}

int Restore(repvar::Client& c, const std::string& path, bool json) {
  ProgressBar bar("restore");
  auto r = c.RestoreCheckpoint(
      path, {.replicas = absl::GetFlag(FLAGS_replicas),
             .progress = [&](const repvar::CheckpointProgress& p) { bar.Show(p); }});
  bar.Done();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("{\"file\":%s,\"variables\":%d,\"created\":%d,\"bytes\":%llu}\n", Q(path).c_str(),
                r->variables, r->created, static_cast<unsigned long long>(r->bytes));
  } else {
    std::printf("restored %d variable(s) (%d created), %llu bytes, from %s\n", r->variables,
                r->created, static_cast<unsigned long long>(r->bytes), path.c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "repvarctl [--coordinator=H:P] [--json] topology | vars [COLLECTION] | read NAME | "
      "assign|assign_add|assign_sub NAME --value=v1,v2,... | steps | watch [--watch_for=D] | "
      "status | delete NAME | save FILE | restore FILE [--replicas=N] | drain | resume. "
      "Security from $REPVAR_TLS_CA, $REPVAR_TLS_CERT, $REPVAR_TLS_KEY, $REPVAR_TOKEN_FILE");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  auto client = repvar::Client::Connect(
      {.coordinator_address = absl::GetFlag(FLAGS_coordinator), .deadline = absl::Seconds(30)});
  if (!client.ok()) return Fail(client.status());
  const bool json = absl::GetFlag(FLAGS_json);
  const std::string cmd = args[1];
  if (cmd == "topology") return Topology(**client, json);
  if (cmd == "vars") return Vars(**client, args.size() > 2 ? args[2] : "", json);
  if (cmd == "read" && args.size() == 3) return Read(**client, args[2], json);
  if (cmd == "steps") return Steps(**client);
  if (cmd == "watch") return Watch(**client);
  if (cmd == "status") return Status(**client);
  if (cmd == "delete" && args.size() == 3) {
    absl::Status s = (*client)->DeleteVariable(args[2]);
    return s.ok() ? 0 : Fail(s);
  }
  if ((cmd == "drain" || cmd == "resume") && args.size() == 2) {
    auto state = (*client)->Drain(cmd == "resume");
    if (!state.ok()) return Fail(state.status());
    std::printf("%s", state->draining ? "draining: new changes are refused" : "serving");
    if (state->open_step != 0) {
      std::printf("; step %lld is still open", static_cast<long long>(state->open_step));
    }
    std::printf("\n");
    return 0;
  }
  if (cmd == "save" && args.size() == 3) return Save(**client, args[2], json);
  if (cmd == "restore" && args.size() == 3) return Restore(**client, args[2], json);
  if ((cmd == "assign" || cmd == "assign_add" || cmd == "assign_sub") && args.size() == 3) {
    return Assign(**client, cmd, args[2], json);
  }
  std::fprintf(stderr, "unknown command; %s\n", absl::ProgramUsageMessage().data());
  return 2;
}

// SPDX-License-Identifier: Apache-2.0
// repvar-sim: runs the cluster simulator (docs/simulator.md) over a range
// of seeds, each in a forked child so that one seed's leaked threads and
// state never touch the next, and ends with
//
//   sim: N seeds, F failures, digest HEX
//
// HEX mixes every seed's digest in seed order, so two runs of the same
// seeds on the same commit print the same line. `--seed=S --verbose`
// replays one seed with its history on stderr. `--scale` measures the
// coordinator at a thousand hosts instead (sim/scale.h) and prints bench
// lines.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/seeded_bug.h"
#include "sim/scale.h"
#include "sim/world.h"
#include "spdlog/spdlog.h"

namespace {

using repvar::sim::SeedResult;
using repvar::sim::World;
using repvar::sim::WorldOptions;

// What a child writes back: one line, "ok digest steps" or
// "FAIL digest steps invariant\tdetail".
std::string Encode(const SeedResult& r) {
  return absl::StrFormat("%s %016x %d %s\t%s\n", r.ok ? "ok" : "FAIL", r.digest, r.steps,
                         r.invariant, r.detail);
}

SeedResult Decode(uint64_t seed, const std::string& line, int wait_status) {
  SeedResult r;
  r.seed = seed;
  std::vector<std::string> head = absl::StrSplit(line.substr(0, line.find('\t')), ' ');
  if (head.size() < 3 || !WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    r.ok = false;
    r.invariant = "crashed";
    r.detail = WIFSIGNALED(wait_status)
                   ? absl::StrCat("the simulation died of signal ", WTERMSIG(wait_status))
                   : absl::StrCat("the simulation exited with ", WEXITSTATUS(wait_status));
    return r;
  }
  r.ok = head[0] == "ok";
  r.digest = std::strtoull(head[1].c_str(), nullptr, 16);
  r.steps = std::strtoull(head[2].c_str(), nullptr, 10);
  if (!r.ok) {
    r.invariant = head.size() > 3 ? head[3] : "";
    for (size_t i = 4; i < head.size(); ++i) absl::StrAppend(&r.invariant, " ", head[i]);
    const size_t tab = line.find('\t');
    r.detail = tab == std::string::npos ? "" : line.substr(tab + 1);
    while (!r.detail.empty() && r.detail.back() == '\n') r.detail.pop_back();
  }
  return r;
}

struct Child {
  uint64_t seed;
  pid_t pid;
  int fd;
  std::string out;
};

// Forks a child that runs `work` and writes what it returns to a pipe; the
// child exits without running destructors (a world's leaked threads are
// never joined).
Child Fork(uint64_t seed, const std::function<std::string()>& work) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid == 0) {
    close(fds[0]);
    const std::string line = work();
    if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(3);
    _exit(0);
  }
  close(fds[1]);
  return Child{seed, pid, fds[0], {}};
}

// Reads the child's output to its end and reaps it: its wait status.
int Reap(Child& c) {
  char buf[4096];
  ssize_t n;
  while ((n = read(c.fd, buf, sizeof(buf))) > 0) c.out.append(buf, static_cast<size_t>(n));
  close(c.fd);
  int status = 0;
  waitpid(c.pid, &status, 0);
  return status;
}

// Forks one seed; the child runs it and writes its result to a pipe.
Child Launch(const WorldOptions& base, uint64_t seed) {
  return Fork(seed, [&] {
    WorldOptions o = base;
    o.seed = seed;
    return Encode(World(o).Run());
  });
}

SeedResult Collect(Child& c) {
  const int status = Reap(c);
  return Decode(c.seed, c.out, status);
}

// Runs `options` in a forked child, so that each size starts from a fresh
// heap and its resident growth is its own.
absl::StatusOr<repvar::sim::ScaleResult> ScaleInChild(const repvar::sim::ScaleOptions& options) {
  using repvar::sim::ScaleResult;
  Child c = Fork(0, [&] {
    absl::StatusOr<ScaleResult> r = repvar::sim::RunScale(options);
    return r.ok()
               ? absl::StrFormat("ok %.17g %.17g %.17g %.17g %.17g %.17g %.17g", r->register_cpu_s,
                                 r->create_init_cpu_s, r->heartbeat_round_cpu_s, r->step_cpu_ms,
                                 r->bytes_per_host_step, r->rss_mib, r->heap_mib)
               : absl::StrCat("error ", r.status().ToString());
  });
  Reap(c);
  ScaleResult r;
  if (std::sscanf(c.out.c_str(), "ok %lg %lg %lg %lg %lg %lg %lg", &r.register_cpu_s,
                  &r.create_init_cpu_s, &r.heartbeat_round_cpu_s, &r.step_cpu_ms,
                  &r.bytes_per_host_step, &r.rss_mib, &r.heap_mib) == 7) {
    return r;
  }
  return absl::InternalError(c.out.empty() ? "the scale run died" : c.out);
}

std::string SizeName(const repvar::sim::ScaleOptions& o) {
  return absl::StrCat(o.hosts, "h_",
                      o.variables % 1000 == 0 ? absl::StrCat(o.variables / 1000, "kv")
                                              : absl::StrCat(o.variables, "v"));
}

// The three sizes the lines compare: as asked, a tenth of the variables,
// a tenth of the hosts. Prints each size's figures, then the bench lines
// (../shared/BENCHMARKS.md's format: X in the unit the goal is in).
int RunScaleLines(const repvar::sim::ScaleOptions& asked) {
  using repvar::sim::ScaleOptions;
  ScaleOptions fewer_variables = asked;
  fewer_variables.variables = std::max(1, asked.variables / 10);
  ScaleOptions fewer_hosts = asked;
  fewer_hosts.hosts = std::max(1, asked.hosts / 10);
  std::vector<repvar::sim::ScaleResult> results;
  for (const ScaleOptions& o : {asked, fewer_variables, fewer_hosts}) {
    absl::StatusOr<repvar::sim::ScaleResult> r = ScaleInChild(o);
    if (!r.ok()) {
      std::printf("sim_scale %s FAILED: %s\n", SizeName(o).c_str(), r.status().ToString().c_str());
      return 1;
    }
    std::printf(
        "sim_scale hosts=%d accelerators=%d variables=%d register_cpu_s=%.3f "
        "create_init_cpu_s=%.3f heartbeat_core_pct=%.3f step_cpu_ms=%.3f "
        "bytes_per_host_step=%.0f rss_mib=%.1f heap_mib=%.1f\n",
        o.hosts, o.accelerators, o.variables, r->register_cpu_s, r->create_init_cpu_s,
        r->heartbeat_round_cpu_s * 100, r->step_cpu_ms, r->bytes_per_host_step, r->rss_mib,
        r->heap_mib);
    std::fflush(stdout);
    results.push_back(*r);
  }
  const std::string size = SizeName(asked);
  std::printf("sim_step_cpu_%s ratio=%.3f goal<=10\n", size.c_str(), results[0].step_cpu_ms);
  std::printf("sim_rss_%s ratio=%.1f goal<=256\n", size.c_str(), results[0].rss_mib);
  std::printf("sim_bytes_per_host_step ratio=%.0f goal<=1024\n", results[0].bytes_per_host_step);
  std::printf("sim_cpu_flat_in_variables ratio=%.3f goal<=1.2\n",
              results[0].step_cpu_ms / results[1].step_cpu_ms);
  std::printf("sim_cpu_linear_in_hosts ratio=%.3f goal<=12\n",
              results[0].step_cpu_ms / results[2].step_cpu_ms);
  return 0;
}

uint64_t MixDigest(uint64_t acc, uint64_t seed_digest) {
  acc ^= seed_digest + 0x9e3779b97f4a7c15 + (acc << 6) + (acc >> 2);
  return acc * 0xff51afd7ed558ccd;
}

// Every flag, and where each lands.
struct Flags {
  uint64_t seeds = 1;
  uint64_t first_seed = 1;
  int jobs = 2;
  WorldOptions world;
  int variables = 0;  // 0: each mode's default
  bool scale = false;
  repvar::sim::ScaleOptions scale_options;
  bool stop_at_failure = false;
  std::string bug = "none";
};

void AddFlags(CLI::App& app, Flags& f) {
  // A flag given twice takes its last value (tests/sim.sh sets defaults
  // that its caller's flags override).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  WorldOptions& o = f.world;
  app.add_option("--seeds", f.seeds, "how many seeds to run")->check(CLI::Range(1, 1'000'000'000));
  app.add_option("--first_seed", f.first_seed, "the first seed");
  app.add_option("--jobs", f.jobs, "seeds run at once")->check(CLI::Range(1, 256));
  app.add_option("--workers", o.workers, "worker hosts")->check(CLI::Range(1, 64));
  app.add_option("--devices_per_worker", o.devices_per_worker)->check(CLI::Range(1, 16));
  app.add_option("--clients", o.clients, "client hosts")->check(CLI::Range(1, 16));
  app.add_option("--variables", f.variables,
                 "variables (the simulation's up to 1,000; --scale's, each MEAN with a replica "
                 "on every accelerator)")
      ->check(CLI::Range(1, 1000000));
  app.add_flag("--scale", f.scale,
               "measure the coordinator at scale (sim/scale.h) and print bench lines instead");
  app.add_option("--hosts", f.scale_options.hosts, "--scale: worker hosts")
      ->check(CLI::Range(10, 100000));
  app.add_option("--accelerators", f.scale_options.accelerators, "--scale: per host")
      ->check(CLI::Range(1, 64));
  app.add_option("--scale_steps", f.scale_options.steps, "--scale: steps measured")
      ->check(CLI::Range(1, 1000));
  app.add_option("--ops_per_client", o.ops_per_client)->check(CLI::Range(0, 100000));
  app.add_option("--steps", o.steps, "replicated steps per seed (0: no trainers)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--step_variables", o.step_variables,
                 "the trainers' variables, of each aggregation in turn")
      ->check(CLI::Range(1, 1000));
  app.add_option("--faults", o.faults, "the nemesis's faults per seed")->check(CLI::Range(0, 1000));
  app.add_option("--local_reads", o.local_reads,
                 "workers keep local read tables and clients read from them: 1 on, 0 off, "
                 "-1 decided by each seed")
      ->check(CLI::Range(-1, 1));
  app.add_flag("--verbose", o.verbose, "print every seed's history on stderr");
  app.add_flag("--stop_at_failure", f.stop_at_failure,
               "launch no seed after the first failure (the line counts the seeds run)");
  app.add_option("--seeded_bug", f.bug,
                 "re-inject a past bug (common/base/seeded_bug.h) to show the seeds find it")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(repvar::kSeededBugNames),
                                                     std::end(repvar::kSeededBugNames))));
}

// Runs the seeds, in forked children `jobs` at a time, and prints the line.
int RunSeeds(const Flags& f) {
  const WorldOptions& o = f.world;
  const uint64_t seeds = f.seeds;
  const uint64_t first_seed = f.first_seed;
  const int jobs = f.jobs;
  const bool stop_at_failure = f.stop_at_failure;
  const std::string& bug = f.bug;
  // The cores' own log lines carry wall-clock stamps: shown when replaying,
  // never part of a digest.
  spdlog::set_level(o.verbose ? spdlog::level::info : spdlog::level::off);
  for (size_t i = 0; i < std::size(repvar::kSeededBugNames); ++i) {
    if (repvar::kSeededBugNames[i] == bug) repvar::SeedBug(static_cast<repvar::SeededBug>(i));
  }

  std::map<uint64_t, SeedResult> done;
  std::map<uint64_t, Child> running;
  uint64_t next = first_seed;
  const uint64_t end = first_seed + seeds;
  bool failed = false;
  while (next < end || !running.empty()) {
    while (next < end && !(stop_at_failure && failed) && static_cast<int>(running.size()) < jobs) {
      Child c = Launch(o, next);
      running.emplace(next++, std::move(c));
    }
    if (running.empty()) break;  // stopped at a failure
    // Collect the oldest: results come back in seed order.
    auto it = running.begin();
    SeedResult r = Collect(it->second);
    running.erase(it);
    if (!r.ok) {
      failed = true;
      std::printf("seed %llu FAILED: %s: %s\n", static_cast<unsigned long long>(r.seed),
                  r.invariant.c_str(), r.detail.c_str());
      std::fflush(stdout);
    }
    done.emplace(r.seed, std::move(r));
  }
  uint64_t digest = 0;
  uint64_t failures = 0;
  for (const auto& [seed, r] : done) {
    digest = MixDigest(digest, r.digest);
    failures += r.ok ? 0 : 1;
  }
  std::printf("sim: %llu seeds, %llu failures, digest %016llx\n",
              static_cast<unsigned long long>(done.size()),
              static_cast<unsigned long long>(failures), static_cast<unsigned long long>(digest));
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"repvar-sim: the cluster simulator"};
  Flags f;
  AddFlags(app, f);
  CLI11_PARSE(app, argc, argv);
  if (f.scale) {
    if (f.variables != 0) f.scale_options.variables = f.variables;
    return RunScaleLines(f.scale_options);
  }
  if (f.variables > 1000) {
    std::fprintf(stderr, "--variables: at most 1,000 without --scale\n");
    return 2;
  }
  if (f.variables != 0) f.world.variables = f.variables;
  return RunSeeds(f);
}

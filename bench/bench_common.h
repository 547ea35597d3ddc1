// SPDX-License-Identifier: Apache-2.0
// What repvar_bench's figures share: timing, clusters of real daemons on
// 127.0.0.1 and clients of them.
#ifndef REPVAR_BENCH_BENCH_COMMON_H_
#define REPVAR_BENCH_BENCH_COMMON_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <semaphore>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/harness.h"
#include "repvar/client.h"
#include "repvar/step.h"
#include "tests/testing/cluster.h"

namespace repvar::bench {

using Clock = std::chrono::steady_clock;

inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

[[noreturn]] inline void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

inline std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) out.push_back(std::stoi(std::string(p)));
  return out;
}

// `mapping_cache_bytes`: see ClientOptions (a client that stands in for
// several trainer processes keeps the mappings of all their workers).
inline std::unique_ptr<repvar::Client> Connect(const repvar::testing::TestCluster& cluster,
                                               size_t mapping_cache_bytes = size_t{1} << 30) {
  repvar::ClientOptions options{.coordinator_address = cluster.address(),
                                .deadline = absl::Seconds(120)};
  options.mapping_cache_bytes = mapping_cache_bytes;
  if (cluster.tls()) {
    options.tls_ca_file = cluster.cert("ca.pem");
    options.token_file = cluster.cert("admin.token");
  }
  auto c = repvar::Client::Connect(options);
  if (!c.ok()) Die("connect", c.status());
  auto t = (*c)->WaitForTopology(absl::Seconds(30));
  if (!t.ok()) Die("topology", t.status());
  return *std::move(c);
}

// 1,000 float32[16] variables "<prefix>0".."<prefix>999" initialized to
// ones, with `replicas` replicas each: their specs and their names.
inline std::pair<std::vector<repvar::VariableSpec>, std::vector<std::string>> SmallVariables(
    const std::string& prefix, int replicas) {
  std::vector<repvar::VariableSpec> specs;
  std::vector<std::string> names;
  for (int i = 0; i < 1000; ++i) {
    names.push_back(absl::StrCat(prefix, i));
    specs.push_back({.name = names.back(),
                     .dtype = repvar::DType::kFloat32,
                     .shape = {16},
                     .replica_count = replicas,
                     .initializer = repvar::InitializerSpec::Ones()});
  }
  return {specs, names};
}

// `workers` worker processes with one virtual TPU each, so replicas = workers.
inline repvar::testing::ClusterOptions OneTpuPerWorker(int workers) {
  return {.tpu_workers = workers,
          .tpu_per_worker = 1,
          .cpu_host = false,
          .heartbeat_timeout = absl::Seconds(30)};
}

// Times `call(i)` for i in [0, n), in ms each; a failure stops the bench.
template <typename Call>
std::vector<double> TimeEach(int n, const char* what, Call call) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    absl::Status s = call(i);
    ms.push_back(Ms(t0, Clock::now()));
    if (!s.ok()) Die(what, s);
  }
  return ms;
}

// The figures of bench_steps.cc and bench_durability.cc.
void MeanStep(int mib, int workers, int iters);
void LocalAccess(int mib, int iters);
void StepsPerSecond(int workers, int vars, int steps, int written, bool write_path);
void DurableOps(int ops);
void SecurityCost(int ops, int iters);
void RestartTime();
void MemoryHeld();
void CheckpointTimes(int iters);

}  // namespace repvar::bench

#endif  // REPVAR_BENCH_BENCH_COMMON_H_

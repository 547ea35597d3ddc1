// SPDX-License-Identifier: Apache-2.0
// repvar's side of bench/run.sh: starts real clusters (coordinator and N
// worker processes on 127.0.0.1) and times, through the C++ client,
//   - broadcast assign of 1/64/256 MiB to N replicas on N worker processes,
//   - read and assign_add of a 16-float variable with 8 replicas (p50/p99),
//   - batched create/initialize/read of 1,000 small variables against one
//     single-variable call.
// Prints one `key=value` line per figure for bench/run.sh to compare.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "repvar/client.h"
#include "tests/testing/cluster.h"

ABSL_FLAG(std::string, workers, "2,4,8", "worker process counts for the broadcast figures");
ABSL_FLAG(std::string, mib, "1,64,256", "tensor sizes in MiB");
ABSL_FLAG(int32_t, iters, 5, "timed repetitions per size (median reported)");
ABSL_FLAG(int32_t, small_ops, 2000, "operations for the small-op latency figures");
ABSL_FLAG(int32_t, small_workers, 8, "worker processes (= replicas) for the small-op figures");

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) out.push_back(std::stoi(std::string(p)));
  return out;
}

std::unique_ptr<repvar::Client> Connect(const repvar::testing::TestCluster& cluster) {
  auto c = repvar::Client::Connect(
      {.coordinator_address = cluster.address(), .deadline = absl::Seconds(120)});
  if (!c.ok()) Die("connect", c.status());
  auto t = (*c)->WaitForTopology(absl::Seconds(30));
  if (!t.ok()) Die("topology", t.status());
  return *std::move(c);
}

// `workers` worker processes with one virtual TPU each, so replicas = workers.
repvar::testing::ClusterOptions OneTpuPerWorker(int workers) {
  return {.tpu_workers = workers,
          .tpu_per_worker = 1,
          .cpu_host = false,
          .heartbeat_timeout = absl::Seconds(30)};
}

void Broadcasts(int workers, const std::vector<int>& mibs, int iters) {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(workers));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  for (int mib : mibs) {
    std::string name = absl::StrCat("bcast_", mib);
    int64_t n = int64_t{mib} << 18;
    auto v = c->CreateVariable(
        {.name = name, .dtype = repvar::DType::kFloat32, .shape = {n}, .replica_count = workers});
    if (!v.ok()) Die("create", v.status());
    std::vector<float> data(n, 1.25f);
    std::vector<double> t;
    for (int i = 0; i < iters + 1; ++i) {
      data[0] = static_cast<float>(i);
      auto t0 = Clock::now();
      auto ack = c->Assign(name, std::span<const float>(data));
      auto t1 = Clock::now();
      if (!ack.ok()) Die("assign", ack.status());
      if (i > 0) t.push_back(Ms(t0, t1));  // the first round warms pools
    }
    std::printf("repvar_bcast workers=%d mib=%d assign_ms=%.2f\n", workers, mib,
                Percentile(t, 0.5));
    std::fflush(stdout);
  }
}

void SmallOps(int ops, int workers) {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(workers));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  auto v = c->CreateVariable(
      {.name = "small", .dtype = repvar::DType::kFloat32, .shape = {16}, .replica_count = workers});
  if (!v.ok()) Die("create", v.status());
  std::vector<float> ones(16, 1.0f);
  if (auto a = c->Assign("small", std::span<const float>(ones)); !a.ok()) Die("assign", a.status());
  std::vector<double> reads, adds;
  // Separate loops, as redis-benchmark runs GET and INCR.
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    auto r = c->Read("small");
    reads.push_back(Ms(t0, Clock::now()) * 1000);
    if (!r.ok()) Die("read", r.status());
  }
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    auto a = c->AssignAdd("small", std::span<const float>(ones));
    adds.push_back(Ms(t0, Clock::now()) * 1000);
    if (!a.ok()) Die("assign_add", a.status());
  }
  std::printf(
      "repvar_small workers=%d read_p50_us=%.1f read_p99_us=%.1f assign_add_p50_us=%.1f "
      "assign_add_p99_us=%.1f\n",
      workers, Percentile(reads, 0.5), Percentile(reads, 0.99), Percentile(adds, 0.5),
      Percentile(adds, 0.99));

  // Batched calls over 1,000 variables against one single-variable call.
  std::vector<double> single;
  for (int i = 0; i < 200; ++i) {
    auto t0 = Clock::now();
    auto s = c->CreateVariable({.name = absl::StrCat("single/", i),
                                .dtype = repvar::DType::kFloat32,
                                .shape = {16},
                                .replica_count = workers,
                                .initializer = repvar::InitializerSpec::Zeros()});
    single.push_back(Ms(t0, Clock::now()));
    if (!s.ok()) Die("create", s.status());
  }
  std::vector<repvar::VariableSpec> specs;
  std::vector<std::string> names;
  for (int i = 0; i < 1000; ++i) {
    names.push_back(absl::StrCat("batch/", i));
    specs.push_back({.name = names.back(),
                     .dtype = repvar::DType::kFloat32,
                     .shape = {16},
                     .replica_count = workers,
                     .initializer = repvar::InitializerSpec::Ones()});
  }
  auto t0 = Clock::now();
  auto created = c->CreateVariables(specs);
  auto t1 = Clock::now();
  auto inited = c->Initialize(names);
  auto t2 = Clock::now();
  auto read = c->ReadBatch(names);
  auto t3 = Clock::now();
  if (!created.ok()) Die("batch create", created.status());
  if (!inited.ok()) Die("batch initialize", inited.status());
  if (!read.ok()) Die("batch read", read.status());
  std::printf(
      "repvar_batch single_create_ms=%.3f create1000_ms=%.2f initialize1000_ms=%.2f "
      "read1000_ms=%.2f\n",
      Percentile(single, 0.5), Ms(t0, t1), Ms(t1, t2), Ms(t2, t3));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto mibs = Ints(absl::GetFlag(FLAGS_mib));
  if (!absl::GetFlag(FLAGS_workers).empty()) {
    for (int w : Ints(absl::GetFlag(FLAGS_workers)))
      Broadcasts(w, mibs, absl::GetFlag(FLAGS_iters));
  }
  SmallOps(absl::GetFlag(FLAGS_small_ops), absl::GetFlag(FLAGS_small_workers));
  return 0;
}

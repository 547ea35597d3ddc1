// SPDX-License-Identifier: Apache-2.0
// repvar_bench's durability figures: durable small writes beside etcd's,
// the cost of TLS and tokens, restart to serving, memory with 1 GiB held,
// and checkpoints.
#include "bench/bench_common.h"

namespace repvar::bench {

// Durable writes: a 16-float assign to one replica with the
// coordinator on a data dir (synced before the answer), p50/p99 from one
// client, then assigns per second from 1, 8 and 64 concurrent clients
// (concurrent records share RocksDB's group commit). Compare with etcd put
// on the same disk (bench/peers/etcd_put.py).
// p50 of `ops` assigns of 16 floats to one replica, one client.
double AssignP50(repvar::Client& c, const std::string& name, int ops, double* p99) {
  std::vector<float> value(16, 1.0f);
  std::vector<double> t;
  for (int i = 0; i < ops; ++i) {
    value[0] = static_cast<float>(i);
    auto t0 = Clock::now();
    auto a = c.Assign(name, std::span<const float>(value));
    t.push_back(Ms(t0, Clock::now()) * 1000);
    if (!a.ok()) Die("assign", a.status());
  }
  if (p99 != nullptr) *p99 = Percentile(t, 0.99);
  return Percentile(t, 0.5);
}

// The CPU and context switches of a one-worker cluster's daemons: on this
// VM a small call's latency moves with its neighbours, its CPU much less.
struct DaemonLoad {
  double coordinator_cpu = 0, worker_cpu = 0;
  long coordinator_switches = 0, worker_switches = 0;
  DaemonLoad operator-(const DaemonLoad& o) const {
    return {coordinator_cpu - o.coordinator_cpu, worker_cpu - o.worker_cpu,
            coordinator_switches - o.coordinator_switches, worker_switches - o.worker_switches};
  }
  // Per call, as the key=value fields of a result line.
  std::string PerCall(int calls) const {
    return absl::StrFormat(
        "coordinator_cpu_us=%.1f coordinator_switches=%.2f worker_cpu_us=%.1f "
        "worker_switches=%.2f",
        coordinator_cpu * 1e6 / calls, static_cast<double>(coordinator_switches) / calls,
        worker_cpu * 1e6 / calls, static_cast<double>(worker_switches) / calls);
  }
};

DaemonLoad LoadOf(repvar::testing::TestCluster& cluster) {
  const pid_t coordinator = cluster.coordinator().pid();
  const pid_t worker = cluster.worker(0).pid();
  return {CpuSeconds(coordinator), CpuSeconds(worker), repvar::bench::ContextSwitches(coordinator),
          repvar::bench::ContextSwitches(worker)};
}

void DurableOps(int ops) {
  {
    // The same path without the state log's sync (--ephemeral): what the
    // round trip and the fan-out cost, so the rest is the sync.
    repvar::testing::ClusterOptions options = OneTpuPerWorker(1);
    options.durable = false;
    repvar::testing::TestCluster cluster(options);
    if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
    auto c = Connect(cluster);
    auto v = c->CreateVariable(
        {.name = "volatile", .dtype = repvar::DType::kFloat32, .shape = {16}, .replica_count = 1});
    if (!v.ok()) Die("create", v.status());
    const DaemonLoad before = LoadOf(cluster);
    const double p50 = AssignP50(*c, "volatile", ops, nullptr);
    std::printf("repvar_ephemeral clients=1 assign_p50_us=%.1f %s\n", p50,
                (LoadOf(cluster) - before).PerCall(ops).c_str());
  }
  repvar::testing::TestCluster cluster(OneTpuPerWorker(1));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  auto v = c->CreateVariable(
      {.name = "durable", .dtype = repvar::DType::kFloat32, .shape = {16}, .replica_count = 1});
  if (!v.ok()) Die("create", v.status());
  double p99 = 0;
  const DaemonLoad before = LoadOf(cluster);
  const double p50 = AssignP50(*c, "durable", ops, &p99);
  std::printf("repvar_durable clients=1 assign_p50_us=%.1f assign_p99_us=%.1f %s\n", p50, p99,
              (LoadOf(cluster) - before).PerCall(ops).c_str());
  for (int clients : {1, 8, 64}) {
    // One variable per client: writes to one variable are serialized (C4).
    for (int k = 0; k < clients; ++k) {
      auto w = c->CreateVariable({.name = absl::StrCat("durable/", clients, "/", k),
                                  .dtype = repvar::DType::kFloat32,
                                  .shape = {16},
                                  .replica_count = 1});
      if (!w.ok()) Die("create", w.status());
    }
    const int each = std::max(20, ops / clients);
    std::vector<std::thread> threads;
    auto t0 = Clock::now();
    for (int k = 0; k < clients; ++k) {
      threads.emplace_back([&, k] {
        auto own = Connect(cluster);
        std::vector<float> x(16, 2.0f);
        for (int i = 0; i < each; ++i) {
          auto a =
              own->Assign(absl::StrCat("durable/", clients, "/", k), std::span<const float>(x));
          if (!a.ok()) Die("durable assign", a.status());
        }
      });
    }
    for (std::thread& th : threads) th.join();
    const double seconds = Ms(t0, Clock::now()) / 1000;
    std::printf("repvar_durable_rate clients=%d assigns_per_s=%.0f\n", clients,
                clients * each / seconds);
  }
}

// What TLS and tokens cost (X1): the same small read, durable small write
// and 64 MiB write to 2 workers on a plaintext cluster and on one serving
// TLS with tokens, side by side.
void SecurityCost(int ops, int iters) {
  for (bool tls : {false, true}) {
    repvar::testing::ClusterOptions options = OneTpuPerWorker(2);
    options.tls = tls;
    repvar::testing::TestCluster cluster(options);
    if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
    auto c = Connect(cluster);
    auto v = c->CreateVariables(
        {{.name = "small", .dtype = repvar::DType::kFloat32, .shape = {16}, .replica_count = 2},
         {.name = "big",
          .dtype = repvar::DType::kFloat32,
          .shape = {int64_t{16} << 20},
          .replica_count = 2}});
    if (!v.ok()) Die("create", v.status());
    const double assign_p50 = AssignP50(*c, "small", ops, nullptr);
    std::vector<double> reads;
    for (int i = 0; i < ops; ++i) {
      auto t0 = Clock::now();
      auto r = c->Read("small");
      reads.push_back(Ms(t0, Clock::now()) * 1000);
      if (!r.ok()) Die("read", r.status());
    }
    const std::vector<float> big(size_t{16} << 20, 1.0f);
    std::vector<double> writes;
    for (int i = 0; i < iters + 1; ++i) {
      auto t0 = Clock::now();
      auto a = c->Assign("big", std::span<const float>(big));
      if (!a.ok()) Die("assign big", a.status());
      if (i > 0) writes.push_back(Ms(t0, Clock::now()));  // the first builds the gloo group
    }
    std::printf(
        "repvar_security mode=%s read_p50_us=%.1f durable_assign_p50_us=%.1f "
        "assign_64mib_to_2_ms=%.1f\n",
        tls ? "tls_tokens" : "plaintext", Percentile(reads, 0.5), assign_p50,
        Percentile(writes, 0.5));
    std::fflush(stdout);
  }
}

// Restart to serving: a coordinator holding 10,000 small variables
// and 1 GiB of values (4 x 256 MiB) is killed (SIGKILL) and started again
// on its data dir; timed from the kill until a read of a recovered variable
// answers.
void RestartTime() {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(1));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  for (int batch = 0; batch < 10; ++batch) {
    auto [specs, names] = SmallVariables(absl::StrCat("restart/", batch, "/"), 1);
    if (auto v = c->CreateVariables(specs); !v.ok()) Die("create", v.status());
    if (auto v = c->Initialize(names); !v.ok()) Die("initialize", v.status());
  }
  std::vector<float> big(int64_t{1} << 26, 0.5f);  // 256 MiB
  for (int i = 0; i < 4; ++i) {
    const std::string name = absl::StrCat("restart/big", i);
    auto v = c->CreateVariable(
        {.name = name, .dtype = repvar::DType::kFloat32, .shape = {1 << 26}, .replica_count = 1});
    if (!v.ok()) Die("create", v.status());
    big[0] = static_cast<float>(i);
    if (auto a = c->Assign(name, std::span<const float>(big)); !a.ok()) Die("assign", a.status());
  }
  auto t0 = Clock::now();
  if (auto s = cluster.RestartCoordinator(SIGKILL); !s.ok()) Die("restart", s);
  double serving_ms = 0;
  for (int attempt = 0; attempt < 6000; ++attempt) {
    if (c->Read("restart/9/999").ok()) {
      serving_ms = Ms(t0, Clock::now());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (serving_ms == 0) Die("restart", absl::DeadlineExceededError("not serving after 30 s"));
  std::printf("repvar_restart variables=10004 value_mib=1024 serving_ms=%.0f\n", serving_ms);
}

// The memory line of /proc/<pid>/status named `key` ("VmRSS", "RssAnon",
// "RssFile"), in MiB.
double StatusMib(int pid, const std::string& key) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::atol(line.c_str() + key.size() + 1) / 1024.0;
  }
  return 0;
}

// Memory with 1 GiB held (the coordinator's copy of a value on disk,
// RSS <= 64 MiB + metadata; each worker <= 1.2 x held +
// 64 MiB): 4 x 256 MiB assigned to 2 replicas on 2 workers (each worker
// holds 1 GiB), then the coordinator's and the workers' RSS right after
// the writes and once buffers released by the writes went back (> 10 s).
// Anonymous memory and mapped file pages (page cache, reclaimable) apart.
void MemoryHeld() {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(2));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  std::vector<float> values(int64_t{1} << 26, 0.5f);  // 256 MiB
  for (int i = 0; i < 4; ++i) {
    const std::string name = absl::StrCat("held/", i);
    auto v = c->CreateVariable(
        {.name = name, .dtype = repvar::DType::kFloat32, .shape = {1 << 26}, .replica_count = 2});
    if (!v.ok()) Die("create", v.status());
    values[0] = static_cast<float>(i);
    if (auto a = c->Assign(name, std::span<const float>(values)); !a.ok())
      Die("assign", a.status());
  }
  auto report = [&](const char* when) {
    const int pid = cluster.coordinator().pid();
    std::printf(
        "repvar_coordinator_rss held_mib=1024 when=%s rss_mib=%.0f anon_mib=%.0f file_mib=%.0f\n",
        when, StatusMib(pid, "VmRSS"), StatusMib(pid, "RssAnon"), StatusMib(pid, "RssFile"));
    for (int w = 0; w < 2; ++w) {
      const int wpid = cluster.worker(w).pid();
      std::printf(
          "repvar_worker_rss held_mib=1024 when=%s worker=%d rss_mib=%.0f anon_mib=%.0f "
          "shmem_mib=%.0f\n",
          when, w, StatusMib(wpid, "VmRSS"), StatusMib(wpid, "RssAnon"),
          StatusMib(wpid, "RssShmem"));
    }
  };
  report("after_writes");
  std::this_thread::sleep_for(std::chrono::seconds(14));
  report("idle_14s");
  // A read of every value: the coordinator serves it from its files.
  for (int i = 0; i < 4; ++i) {
    if (auto r = c->Read(absl::StrCat("held/", i)); !r.ok()) Die("read", r.status());
  }
  report("after_reads");
}

// Checkpoints: repvarctl save / restore of 4 x 64 MiB, next to
// the same bytes written to a file and fsynced by hand (the disk's part).
void CheckpointTimes(int iters) {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(2));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  const std::vector<float> values(16 << 20, 0.5f);  // 64 MiB
  for (int i = 0; i < 4; ++i) {
    const std::string name = absl::StrCat("ckpt/", i);
    auto v = c->CreateVariable(
        {.name = name, .dtype = repvar::DType::kFloat32, .shape = {16 << 20}, .replica_count = 2});
    if (!v.ok()) Die("create", v.status());
    if (auto a = c->Assign(name, std::span<const float>(values)); !a.ok())
      Die("assign", a.status());
  }
  const std::string path = cluster.dir() + "/bench.safetensors";
  std::vector<double> save, restore, plain;
  for (int it = 0; it < iters; ++it) {
    auto t0 = Clock::now();
    if (auto r = c->SaveCheckpoint(path); !r.ok()) Die("save", r.status());
    save.push_back(Ms(t0, Clock::now()));
    t0 = Clock::now();
    if (auto r = c->RestoreCheckpoint(path); !r.ok()) Die("restore", r.status());
    restore.push_back(Ms(t0, Clock::now()));
    t0 = Clock::now();
    {
      std::FILE* f = std::fopen((cluster.dir() + "/plain.bin").c_str(), "wb");
      for (int i = 0; i < 4; ++i) std::fwrite(values.data(), sizeof(float), values.size(), f);
      std::fflush(f);
      ::fsync(::fileno(f));
      std::fclose(f);
    }
    plain.push_back(Ms(t0, Clock::now()));
  }
  std::printf("repvar_checkpoint mib=256 save_ms=%.0f restore_ms=%.0f plain_write_fsync_ms=%.0f\n",
              Percentile(save, 0.5), Percentile(restore, 0.5), Percentile(plain, 0.5));
}

}  // namespace repvar::bench

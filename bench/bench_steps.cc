// SPDX-License-Identifier: Apache-2.0
// repvar_bench's step figures: a MEAN step of a large variable, a trainer's
// in-place access to its host's replicas, and steps per second with many
// workers and small variables.
#include "bench/bench_common.h"

namespace repvar::bench {

struct StepPhases {
  double begin_ms = 0, write_ms = 0, commit_ms = 0;
};

// One step with the trainers of `trainers` (one per worker): `write` fills
// each trainer's local replicas, then every trainer commits. Returns the time
// of each phase (commit: from the first commit to the last answer), in ms.
// With `write` null (the report path) the trainers are not woken for it.
template <typename Write>
StepPhases TimedStep(repvar::Client& c, int64_t step, Trainers& trainers, Write write) {
  StepPhases phases;
  std::vector<std::unique_ptr<repvar::StepScope>> scopes(trainers.size());
  auto b0 = Clock::now();
  trainers.Run([&](int w) {  // every trainer begins, as trainers do: concurrently
    auto s = repvar::StepScope::Begin(
        c, step, {.worker = absl::StrCat("tpu_worker:", w), .barrier_timeout = absl::Seconds(300)});
    if (!s.ok()) Die("begin step", s.status());
    scopes[w] = *std::move(s);
  });
  phases.begin_ms = Ms(b0, Clock::now());
  if constexpr (!std::is_same_v<Write, std::nullptr_t>) {
    auto w0 = Clock::now();
    trainers.Run([&](int w) {
      if (absl::Status st = write(w, *scopes[w]); !st.ok()) Die("step write", st);
    });
    phases.write_ms = Ms(w0, Clock::now());
  }
  auto t0 = Clock::now();
  trainers.Run([&](int w) {
    auto r = scopes[w]->Commit();
    if (!r.ok()) Die("commit", r.status());
  });
  phases.commit_ms = Ms(t0, Clock::now());
  return phases;
}

// The resolution time of a MEAN step over one large variable, every replica
// changed (the reduction is a gloo ring allreduce among the workers).
void MeanStep(int mib, int workers, int iters) {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(workers));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  // One client for the `workers` trainers, which as processes would each
  // keep their own worker's buffers mapped (1 GiB by default): room for the
  // 2-3 buffers each worker lends in turn.
  auto c = Connect(cluster, size_t{4} * static_cast<size_t>(workers) * (size_t{1} << 20) * mib);
  int64_t n = int64_t{mib} << 18;
  repvar::VariableSpec spec{
      .name = "mean", .dtype = repvar::DType::kFloat32, .shape = {n}, .replica_count = workers};
  spec.aggregation = repvar::Aggregation::kMean;
  spec.initializer = repvar::InitializerSpec::Zeros();
  if (auto v = c->CreateVariable(spec); !v.ok()) Die("create", v.status());
  if (auto v = c->Initialize({"mean"}); !v.ok()) Die("initialize", v.status());
  std::vector<std::vector<float>> local(workers, std::vector<float>(n));
  Trainers trainers(workers);
  for (int w = 0; w < workers; ++w) std::fill(local[w].begin(), local[w].end(), float(w));
  std::vector<double> t, wrote, warmup;
  // The first step builds the gloo group; the first few fill the workers'
  // buffer pools (the accumulator, the step's results while the committed
  // values are still held) and the trainers' mappings of the buffers their
  // workers lend in turn (a copy into a buffer not mapped before takes
  // 420-640 ms here, 12-51 ms once mapped; bench/README.md). Timed: the
  // steps after them, as the gloo peer times its rounds after one that warms
  // connections and pages. Printed beside: the first step and the slowest
  // of the others not timed.
  constexpr int kWarmup = 4;
  for (int i = 0; i < iters + kWarmup; ++i) {
    StepPhases p = TimedStep(*c, i + 1, trainers, [&](int w, repvar::StepScope& s) {
      local[w][0] = static_cast<float>(i);
      return s.Write<float>("mean", w, std::span<const float>(local[w]));
    });
    if (i < kWarmup) {
      warmup.push_back(p.commit_ms);
      continue;
    }
    t.push_back(p.commit_ms);
    wrote.push_back(p.write_ms);
  }
  // The write phase beside the commit: a step costs both.
  std::printf(
      "repvar_mean_step workers=%d mib=%d commit_ms=%.2f write_ms=%.2f first_ms=%.2f "
      "warming_max_ms=%.2f\n",
      workers, mib, Percentile(t, 0.5), Percentile(wrote, 0.5), warmup[0],
      *std::max_element(warmup.begin() + 1, warmup.end()));
  std::fflush(stdout);
}

// In-step local access (S2): a trainer reads and writes its host's replica of
// a `mib` MiB variable, against a warm memcpy of the same bytes in this
// process: in place through a shared mapping of the worker's buffer (read:
// map the step's view as the step begins and copy the bytes out; write: map,
// copy the bytes in, publish; read back: the same read right after the
// publish, which waits for the worker's hash of it), and through
// StepScope's Write, Read (into a fresh vector) and ReadInto (into a buffer
// kept across steps), which take the same mapping at this size; Read and
// ReadInto of a 768 KiB variable, below the mapping's threshold, through
// the worker's socket; and 100 small variables read one by one (Read: a
// stream each) and in one ReadBatch.
void LocalAccess(int mib, int iters) {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(1));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  int64_t n = int64_t{mib} << 18;
  repvar::VariableSpec spec{
      .name = "local", .dtype = repvar::DType::kFloat32, .shape = {n}, .replica_count = 1};
  spec.aggregation = repvar::Aggregation::kMean;
  spec.initializer = repvar::InitializerSpec::Ones();
  if (auto v = c->CreateVariable(spec); !v.ok()) Die("create", v.status());
  // Below the mapping's threshold: read through the worker's socket.
  constexpr int64_t kSocketKib = 768;
  repvar::VariableSpec near = spec;
  near.name = "near";
  near.shape = {kSocketKib << 8};
  if (auto v = c->CreateVariable(near); !v.ok()) Die("create", v.status());
  // Small variables (16 floats), read one by one (a StepRead stream each)
  // and in one ReadBatch (one StepReadSmall call).
  constexpr int kSmallVars = 100;
  std::vector<std::string> names = {"local", "near"};
  std::vector<repvar::StepScope::LocalRead> small_reads;
  for (int k = 0; k < kSmallVars; ++k) {
    repvar::VariableSpec small = spec;
    small.name = absl::StrCat("small", k);
    small.shape = {16};
    if (auto v = c->CreateVariable(small); !v.ok()) Die("create", v.status());
    names.push_back(small.name);
    small_reads.push_back({small.name, 0});
  }
  if (auto v = c->Initialize(names); !v.ok()) Die("initialize", v.status());
  std::vector<float> src(n, 2.0f), dst(n), near_dst(kSocketKib << 8);
  std::vector<double> copy, map_reads, map_writes, readbacks, reads, read_intos, writes,
      socket_reads, socket_read_intos, small_each, small_batch;
  const size_t bytes = n * sizeof(float);
  for (int i = 0; i < iters + 1; ++i) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    copy.push_back(Ms(t0, Clock::now()));
    auto scope = repvar::StepScope::Begin(*c, i + 1, {.worker = "tpu_worker:0"});
    if (!scope.ok()) Die("begin", scope.status());
    repvar::StepScope& s = **scope;
    src[0] = static_cast<float>(i);
    // Read the step's view as a step begins (the committed value), write the
    // new value in place, then read it back (which waits for the worker's
    // hash of the publish).
    auto read_into = [&](const char* what) {
      auto r = s.Map("local", 0, repvar::MapMode::kRead);
      if (!r.ok()) Die(what, r.status());
      std::memcpy(dst.data(), (*r)->bytes().data(), bytes);
    };
    auto t0r = Clock::now();
    read_into("map for read");
    auto t1 = Clock::now();
    auto w = s.Map("local", 0, repvar::MapMode::kWrite);
    if (!w.ok()) Die("map for write", w.status());
    std::memcpy((*w)->bytes().data(), src.data(), bytes);
    if (auto st = s.Publish(*std::move(w)); !st.ok()) Die("publish", st);
    auto t2 = Clock::now();
    read_into("map for read back");
    auto t3 = Clock::now();
    // The same through StepScope's Write and Read.
    auto t4 = Clock::now();
    if (auto st = s.WriteBatch({{"local", 0, std::as_bytes(std::span<const float>(src))}});
        !st.ok()) {
      Die("write", st);
    }
    auto t5 = Clock::now();
    if (auto v = s.Read("local", 0); !v.ok()) Die("read", v.status());
    auto t6 = Clock::now();
    // Into a buffer kept across steps (a framework's parameter storage).
    if (auto v = s.ReadInto("local", 0, std::as_writable_bytes(std::span(dst))); !v.ok()) {
      Die("read into", v.status());
    }
    auto t7 = Clock::now();
    if (auto v = s.Read("near", 0); !v.ok()) Die("socket read", v.status());
    auto t8 = Clock::now();
    if (auto v = s.ReadInto("near", 0, std::as_writable_bytes(std::span(near_dst))); !v.ok()) {
      Die("socket read into", v.status());
    }
    auto t9 = Clock::now();
    for (const auto& r : small_reads) {
      if (auto v = s.Read(r.name, 0); !v.ok()) Die("small read", v.status());
    }
    auto t10 = Clock::now();
    if (auto v = s.ReadBatch(small_reads); !v.ok()) Die("small read batch", v.status());
    auto t11 = Clock::now();
    if (auto res = s.Commit(); !res.ok()) Die("commit", res.status());
    if (i > 0) {  // the first round fills the pools
      map_reads.push_back(Ms(t0r, t1));
      map_writes.push_back(Ms(t1, t2));
      readbacks.push_back(Ms(t2, t3));
      writes.push_back(Ms(t4, t5));
      reads.push_back(Ms(t5, t6));
      read_intos.push_back(Ms(t6, t7));
      socket_reads.push_back(Ms(t7, t8));
      socket_read_intos.push_back(Ms(t8, t9));
      small_each.push_back(Ms(t9, t10));
      small_batch.push_back(Ms(t10, t11));
    }
  }
  std::printf(
      "repvar_local mib=%d mapped_write_ms=%.2f mapped_read_ms=%.2f mapped_readback_ms=%.2f "
      "write_ms=%.2f read_ms=%.2f read_into_ms=%.2f memcpy_ms=%.2f socket_kib=%lld "
      "socket_read_ms=%.3f socket_read_into_ms=%.3f small_reads=%d small_read_each_ms=%.3f "
      "small_read_batch_ms=%.3f\n",
      mib, Percentile(map_writes, 0.5), Percentile(map_reads, 0.5), Percentile(readbacks, 0.5),
      Percentile(writes, 0.5), Percentile(reads, 0.5), Percentile(read_intos, 0.5),
      Percentile(copy, 0.5), static_cast<long long>(kSocketKib), Percentile(socket_reads, 0.5),
      Percentile(socket_read_intos, 0.5), kSmallVars, Percentile(small_each, 0.5),
      Percentile(small_batch, 0.5));
  std::fflush(stdout);
}

// Steps per second: `workers` workers, `vars` small MEAN variables (16
// floats) with a replica on every worker, every replica written every step;
// plus the coordinator's CPU share over the timed steps.
void StepsPerSecond(int workers, int vars, int steps, int step_written, bool write_path) {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(workers));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  std::vector<repvar::VariableSpec> specs;
  std::vector<std::string> names;
  for (int i = 0; i < vars; ++i) {
    names.push_back(absl::StrCat("v", i));
    repvar::VariableSpec s{.name = names.back(), .dtype = repvar::DType::kFloat32, .shape = {16}};
    s.replica_count = workers;
    s.aggregation = repvar::Aggregation::kMean;
    s.initializer = repvar::InitializerSpec::Zeros();
    specs.push_back(std::move(s));
  }
  if (auto v = c->CreateVariables(specs); !v.ok()) Die("create", v.status());
  if (auto v = c->Initialize(names); !v.ok()) Die("initialize", v.status());
  const int written = step_written < 0 ? vars : std::min(vars, step_written);
  // Each trainer's values differ from the others' and from the last step's,
  // so that every written variable changes and is reduced (the same value
  // every step would leave the committed one as it is: nothing to reduce).
  std::vector<std::vector<float>> values(workers);
  auto write = [&](int w, repvar::StepScope& s) {
    values[w].assign(16, static_cast<float>(s.step() * workers + w));
    std::vector<repvar::StepScope::LocalWrite> batch;
    for (int i = 0; i < written; ++i) {
      batch.push_back({names[i], w, std::as_bytes(std::span<const float>(values[w]))});
    }
    return s.WriteBatch(batch);
  };
  Trainers trainers(workers);
  TimedStep(*c, 1, trainers, write);  // warm-up: builds the gloo group
  int64_t next = 2;
  // Two figures: every replica of every variable written (fused MEAN
  // allreduce of 1,000 variables), and the bare step path (begin, one report
  // per worker, resolution) with nothing written.
  for (bool writes : {true, false}) {
    if (writes && !write_path) continue;
    const double cpu0 = CpuSeconds(cluster.coordinator().pid());
    auto t0 = Clock::now();
    std::vector<double> begin, wrote, commit;
    for (int i = 0; i < steps; ++i) {
      StepPhases p = writes ? TimedStep(*c, next++, trainers, write)
                            : TimedStep(*c, next++, trainers, nullptr);
      begin.push_back(p.begin_ms);
      wrote.push_back(p.write_ms);
      commit.push_back(p.commit_ms);
    }
    const double wall = Ms(t0, Clock::now()) / 1000;
    const double cpu = CpuSeconds(cluster.coordinator().pid()) - cpu0;
    std::printf(
        "repvar_steps workers=%d vars=%d writes=%d written=%d steps_per_s=%.2f "
        "coordinator_cpu_ms_per_step=%.2f coordinator_cpu_share=%.3f begin_ms=%.1f write_ms=%.1f "
        "commit_ms=%.1f\n",
        workers, vars, writes ? 1 : 0, writes ? written : 0, steps / wall, cpu * 1000 / steps,
        cpu / wall, Percentile(begin, 0.5), Percentile(wrote, 0.5), Percentile(commit, 0.5));
    std::fflush(stdout);
  }
}

}  // namespace repvar::bench

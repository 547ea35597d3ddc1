// SPDX-License-Identifier: Apache-2.0
// repvar's side of bench/run.sh: starts real clusters (coordinator and N
// worker processes on 127.0.0.1) and times, through the C++ client,
//   - broadcast assign of 1/64/256 MiB to N replicas on N worker processes,
//   - read and assign_add of a 16-float variable with 8 replicas (p50/p99),
//     and gRPC's own floor on the same coordinator: grpc.health.v1 Check, a
//     unary call whose handler does nothing,
//   - batched create/initialize/read of 1,000 small variables against one
//     single-variable call.
// Prints one `key=value` line per figure for bench/run.sh to compare.
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

ABSL_FLAG(std::string, workers, "2,4,8", "worker process counts for the broadcast figures");
ABSL_FLAG(std::string, mib, "1,64,256", "tensor sizes in MiB");
ABSL_FLAG(int32_t, iters, 5, "timed repetitions per size (median reported)");
ABSL_FLAG(int32_t, bcast_warmup, 6,
          "untimed assigns of each broadcast variable before the timed ones: the first "
          "ones fill the daemons' pools and the state log's recycled blob files (the "
          "first is reported as first_ms)");
ABSL_FLAG(int32_t, small_ops, 2000, "operations for the small-op latency figures");
ABSL_FLAG(bool, only_durable, false, "run only the durable-write figures");
ABSL_FLAG(bool, only_checkpoint, false, "run only the checkpoint figures");
ABSL_FLAG(bool, only_memory, false, "run only the memory (RSS) figures");
ABSL_FLAG(int32_t, small_workers, 8, "worker processes (= replicas) for the small-op figures");
ABSL_FLAG(int32_t, step_workers, 32, "worker processes for the steps-per-second figure");
ABSL_FLAG(int32_t, step_vars, 1000, "small variables in the steps-per-second figure");
ABSL_FLAG(int32_t, step_written, -1,
          "of those, how many each trainer writes on the write path (-1: all)");
ABSL_FLAG(int32_t, steps, 20, "timed steps for the steps-per-second figure");
ABSL_FLAG(int32_t, mean_mib, 64, "size of the MEAN step variable");
ABSL_FLAG(int32_t, mean_replicas, 8, "replicas (= workers) of the MEAN step variable");
ABSL_FLAG(bool, only_steps, false, "run only the step figures");
ABSL_FLAG(bool, only_local, false, "run only the in-step local access figures (mean_mib MiB)");
ABSL_FLAG(bool, step_write_path, true,
          "time the step path with every replica written, before the report path");
ABSL_FLAG(bool, only_security, false, "run only the TLS-and-tokens cost figures");
ABSL_FLAG(bool, only_small, false, "run only the small-op and batch figures");
ABSL_FLAG(bool, only_bcast, false, "run only the broadcast and point-to-point figures");
ABSL_FLAG(int32_t, p2p_mib, 256, "size of the point-to-point figure (assign to 1 replica + read)");
ABSL_FLAG(int32_t, batch_rounds, 7,
          "rounds of the batched figures (1,000 fresh variables each; median reported)");

namespace {

using Clock = std::chrono::steady_clock;
using repvar::bench::CpuSeconds;
using repvar::bench::Trainers;

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

// `mapping_cache_bytes`: see ClientOptions (a client that stands in for
// several trainer processes keeps the mappings of all their workers).
std::unique_ptr<repvar::Client> Connect(const repvar::testing::TestCluster& cluster,
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
std::pair<std::vector<repvar::VariableSpec>, std::vector<std::string>> SmallVariables(
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
repvar::testing::ClusterOptions OneTpuPerWorker(int workers) {
  return {.tpu_workers = workers,
          .tpu_per_worker = 1,
          .cpu_host = false,
          .heartbeat_timeout = absl::Seconds(30)};
}

// Assigns `data` (its first element stamped with `round`, so that every
// round writes a new value) to `name`; the time it took, in ms.
double TimedAssign(repvar::Client& c, const std::string& name, std::vector<float>& data,
                   int round) {
  data[0] = static_cast<float>(round);
  auto t0 = Clock::now();
  auto ack = c.Assign(name, std::span<const float>(data));
  const double ms = Ms(t0, Clock::now());
  if (!ack.ok()) Die("assign", ack.status());
  return ms;
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
    double first_ms = 0;
    const int warmup = std::max(1, absl::GetFlag(FLAGS_bcast_warmup));
    for (int i = 0; i < warmup + iters; ++i) {
      const double ms = TimedAssign(*c, name, data, i);
      if (i == 0) first_ms = ms;
      if (i >= warmup) t.push_back(ms);
    }
    std::printf("repvar_bcast workers=%d mib=%d assign_ms=%.2f first_ms=%.2f\n", workers, mib,
                Percentile(t, 0.5), first_ms);
    std::fflush(stdout);
  }
}

// Point to point: `mib` MiB assigned to a variable with one replica on one
// worker, then read back whole, by Read (into a fresh vector) and by
// ReadInto (a buffer kept from round to round, which the total counts); the
// peer is the same bytes over one loopback TCP connection and back between
// resident buffers (bench/peers/tcp_stream.cc).
void PointToPoint(int mib, int iters) {
  repvar::testing::TestCluster cluster(OneTpuPerWorker(1));
  if (auto s = cluster.Start(); !s.ok()) Die("cluster", s);
  auto c = Connect(cluster);
  const std::string name = "p2p";
  const int64_t n = int64_t{mib} << 18;
  auto v = c->CreateVariable(
      {.name = name, .dtype = repvar::DType::kFloat32, .shape = {n}, .replica_count = 1});
  if (!v.ok()) Die("create", v.status());
  std::vector<float> data(n, 1.25f);
  std::vector<float> into(n);  // ReadInto's buffer, the same every round
  std::vector<double> assign, read, read_into, total;
  const int warmup = std::max(1, absl::GetFlag(FLAGS_bcast_warmup));
  for (int i = 0; i < warmup + iters; ++i) {
    const double assign_ms = TimedAssign(*c, name, data, i);
    // Read (a fresh vector) and ReadInto (the same buffer every round), in
    // turns first, so that neither always finds the other's warm caches.
    auto check = [&](const char* what, const absl::Status& s, std::span<const std::byte> back) {
      if (!s.ok()) Die(what, s);
      if (back.size() != data.size() * sizeof(float) ||
          std::memcmp(back.data(), data.data(), back.size()) != 0) {
        Die(what, absl::DataLossError("the value read back differs from the value assigned"));
      }
    };
    auto timed_read = [&] {
      auto t0 = Clock::now();
      auto back = c->Read(name);
      const double ms = Ms(t0, Clock::now());
      check("read", back.status(), back.ok() ? std::span(back->bytes) : std::span<std::byte>());
      return ms;
    };
    auto timed_read_into = [&] {
      const auto out = std::as_writable_bytes(std::span<float>(into));
      auto t0 = Clock::now();
      auto info = c->ReadInto(name, out);
      const double ms = Ms(t0, Clock::now());
      check("read into", info.status(), out);
      return ms;
    };
    double read_ms = 0, read_into_ms = 0;
    if (i % 2 == 0) {
      read_ms = timed_read();
      read_into_ms = timed_read_into();
    } else {
      read_into_ms = timed_read_into();
      read_ms = timed_read();
    }
    if (i < warmup) continue;
    assign.push_back(assign_ms);
    read.push_back(read_ms);
    read_into.push_back(read_into_ms);
    // The peer moves the bytes between resident buffers it keeps: the like
    // of it here is ReadInto a kept buffer.
    total.push_back(assign_ms + read_into_ms);
  }
  std::printf("repvar_p2p mib=%d assign_ms=%.2f read_ms=%.2f read_into_ms=%.2f total_ms=%.2f\n",
              mib, Percentile(assign, 0.5), Percentile(read, 0.5), Percentile(read_into, 0.5),
              Percentile(total, 0.5));
  std::fflush(stdout);
}

// The broadcast figures for every --workers count and --mib size, then the
// point-to-point one.
void EveryBroadcast() {
  if (!absl::GetFlag(FLAGS_workers).empty()) {
    for (int w : Ints(absl::GetFlag(FLAGS_workers))) {
      Broadcasts(w, Ints(absl::GetFlag(FLAGS_mib)), absl::GetFlag(FLAGS_iters));
    }
  }
  if (absl::GetFlag(FLAGS_p2p_mib) > 0) {
    PointToPoint(absl::GetFlag(FLAGS_p2p_mib), absl::GetFlag(FLAGS_iters));
  }
}

// p50 of `ops` grpc.health.v1 Check calls to `address` (plaintext), each a
// unary call waited for as the client's own blocking calls wait: what any
// call to that server costs before the handler does anything.
double GrpcFloorP50Us(const std::string& address, int ops) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  // HealthCheckRequest{service: "liveness"}, serialized by hand (field 1).
  const std::string request = std::string("\x0a\x08", 2) + "liveness";
  grpc::Slice slice(request);
  const grpc::ByteBuffer liveness(&slice, 1);
  std::vector<double> us;
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    grpc::ClientContext ctx;
    auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", liveness, &cq);
    call->StartCall();
    grpc::ByteBuffer resp;
    grpc::Status status;
    call->Finish(&resp, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok) || !ok || !status.ok()) {
      Die("health check", absl::UnavailableError(status.error_message()));
    }
    us.push_back(Ms(t0, Clock::now()) * 1000);
  }
  return Percentile(us, 0.5);
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
  const double floor = cluster.tls() ? 0 : GrpcFloorP50Us(cluster.address(), ops);
  std::printf(
      "repvar_small workers=%d read_p50_us=%.1f read_p99_us=%.1f assign_add_p50_us=%.1f "
      "assign_add_p99_us=%.1f grpc_unary_floor_p50_us=%.1f\n",
      workers, Percentile(reads, 0.5), Percentile(reads, 0.99), Percentile(adds, 0.5),
      Percentile(adds, 0.99), floor);

  // Batched calls over 1,000 variables against one single-variable call.
  // Both creates answer without the replicas (VariableDetail::kBasic); the
  // batch's full answer is timed too.
  const std::vector<double> single = TimeEach(200, "create", [&](int i) {
    return c
        ->CreateVariables({{.name = absl::StrCat("single/", i),
                            .dtype = repvar::DType::kFloat32,
                            .shape = {16},
                            .replica_count = workers,
                            .initializer = repvar::InitializerSpec::Zeros()}},
                          repvar::VariableDetail::kBasic)
        .status();
  });
  // A single initialize and a single read of each, the unit of the batch
  // of the same kind.
  const std::vector<double> single_inits = TimeEach(200, "initialize", [&](int i) {
    return c->Initialize({absl::StrCat("single/", i)}).status();
  });
  // The unit of each batch is timed as its batch is: a read of 1,000 in a
  // row as the 200 single reads are (each the first read of its variable,
  // right after the one before), and apart from it, right after its
  // variable's initialize, as each round also reads its batch. On this VM a
  // call that follows calls of another kind (an initialize, an assign, even
  // a read after those) takes 2-5 times one in a row of its own kind: its
  // code and data are out of the caches. The single read and the batch
  // alike.
  const std::vector<double> single_reads =
      TimeEach(200, "read", [&](int i) { return c->Read(absl::StrCat("single/", i)).status(); });
  std::vector<double> single_reads_after_init;
  for (int i = 0; i < 100; ++i) {
    const std::string name = absl::StrCat("fresh/", i);
    auto created = c->CreateVariables({{.name = name,
                                        .dtype = repvar::DType::kFloat32,
                                        .shape = {16},
                                        .replica_count = workers,
                                        .initializer = repvar::InitializerSpec::Zeros()}},
                                      repvar::VariableDetail::kBasic);
    if (!created.ok()) Die("create", created.status());
    if (auto s = c->Initialize({name}); !s.ok()) Die("initialize", s.status());
    auto t0 = Clock::now();
    auto r = c->Read(name);
    single_reads_after_init.push_back(Ms(t0, Clock::now()));
    if (!r.ok()) Die("read", r.status());
  }
  // Each round creates, initializes and reads 1,000 fresh variables, and
  // initializes the 1,000 of its full create for the reads in a row below.
  std::vector<double> creates, creates_full, inits, reads_after_init;
  std::vector<std::vector<std::string>> full_batches;
  for (int round = 0; round < absl::GetFlag(FLAGS_batch_rounds); ++round) {
    auto [full_specs, full_names] = SmallVariables(absl::StrCat("full/", round, "/"), workers);
    auto f0 = Clock::now();
    auto full = c->CreateVariables(full_specs, repvar::VariableDetail::kFull);
    creates_full.push_back(Ms(f0, Clock::now()));
    if (!full.ok()) Die("batch create", full.status());
    auto [specs, names] = SmallVariables(absl::StrCat("batch/", round, "/"), workers);
    auto t0 = Clock::now();
    auto created = c->CreateVariables(specs, repvar::VariableDetail::kBasic);
    auto t1 = Clock::now();
    auto inited = c->Initialize(names);
    auto t2 = Clock::now();
    auto read = c->ReadBatch(names);
    auto t3 = Clock::now();
    if (!created.ok()) Die("batch create", created.status());
    if (!inited.ok()) Die("batch initialize", inited.status());
    if (!read.ok()) Die("batch read", read.status());
    creates.push_back(Ms(t0, t1));
    inits.push_back(Ms(t1, t2));
    reads_after_init.push_back(Ms(t2, t3));
    if (auto s = c->Initialize(full_names); !s.ok()) Die("batch initialize", s.status());
    full_batches.push_back(std::move(full_names));
  }
  const std::vector<double> batch_reads =
      TimeEach(static_cast<int>(full_batches.size()), "batch read",
               [&](int i) { return c->ReadBatch(full_batches[static_cast<size_t>(i)]).status(); });
  std::printf(
      "repvar_batch single_create_ms=%.3f single_initialize_ms=%.3f single_read_ms=%.3f "
      "create1000_ms=%.2f initialize1000_ms=%.2f read1000_ms=%.2f create1000_full_ms=%.2f "
      "single_read_after_init_ms=%.3f read1000_after_init_ms=%.2f\n",
      Percentile(single, 0.5), Percentile(single_inits, 0.5), Percentile(single_reads, 0.5),
      Percentile(creates, 0.5), Percentile(inits, 0.5), Percentile(batch_reads, 0.5),
      Percentile(creates_full, 0.5), Percentile(single_reads_after_init, 0.5),
      Percentile(reads_after_init, 0.5));
}

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
void StepsPerSecond(int workers, int vars, int steps) {
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
  const int written = absl::GetFlag(FLAGS_step_written) < 0
                          ? vars
                          : std::min(vars, absl::GetFlag(FLAGS_step_written));
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
    if (writes && !absl::GetFlag(FLAGS_step_write_path)) continue;
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

}  // namespace

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

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_only_memory)) {
    MemoryHeld();
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_checkpoint)) {
    CheckpointTimes(absl::GetFlag(FLAGS_iters));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_security)) {
    SecurityCost(absl::GetFlag(FLAGS_small_ops), absl::GetFlag(FLAGS_iters));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_small)) {
    SmallOps(absl::GetFlag(FLAGS_small_ops), absl::GetFlag(FLAGS_small_workers));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_durable)) {
    DurableOps(absl::GetFlag(FLAGS_small_ops));
    RestartTime();
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_local)) {
    LocalAccess(absl::GetFlag(FLAGS_mean_mib), absl::GetFlag(FLAGS_iters));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_bcast)) {
    EveryBroadcast();
    return 0;
  }
  if (absl::GetFlag(FLAGS_mean_mib) > 0) {
    LocalAccess(absl::GetFlag(FLAGS_mean_mib), absl::GetFlag(FLAGS_iters));
    MeanStep(absl::GetFlag(FLAGS_mean_mib), absl::GetFlag(FLAGS_mean_replicas),
             absl::GetFlag(FLAGS_iters));
  }
  StepsPerSecond(absl::GetFlag(FLAGS_step_workers), absl::GetFlag(FLAGS_step_vars),
                 absl::GetFlag(FLAGS_steps));
  if (absl::GetFlag(FLAGS_only_steps)) return 0;
  EveryBroadcast();
  SmallOps(absl::GetFlag(FLAGS_small_ops), absl::GetFlag(FLAGS_small_workers));
  DurableOps(absl::GetFlag(FLAGS_small_ops));
  RestartTime();
  return 0;
}

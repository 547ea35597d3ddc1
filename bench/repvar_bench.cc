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
// The step and durability figures are in bench_steps.cc and
// bench_durability.cc.
#include "bench/bench_common.h"

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

namespace repvar::bench {
namespace {

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

// Reads of "small" served from tpu_worker:0's local read table (C8), once
// its worker confirmed the value; each read must be served there.
std::vector<double> LocalReads(repvar::Client& c, int ops) {
  if (auto s = c.UseLocalReads("tpu_worker:0"); !s.ok()) Die("local reads", s);
  for (int i = 0; i < 400 && c.local_read_stats().served == 0; ++i) {
    if (auto r = c.Read("small"); !r.ok()) Die("read", r.status());
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const uint64_t before = c.local_read_stats().served;
  std::vector<double> us;
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    auto r = c.Read("small");
    us.push_back(Ms(t0, Clock::now()) * 1000);
    if (!r.ok()) Die("local read", r.status());
  }
  if (c.local_read_stats().served - before != static_cast<uint64_t>(ops)) {
    Die("local read", absl::InternalError("some reads were not served locally"));
  }
  return us;
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
  const std::vector<double> local = LocalReads(*c, ops);
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    auto a = c->AssignAdd("small", std::span<const float>(ones));
    adds.push_back(Ms(t0, Clock::now()) * 1000);
    if (!a.ok()) Die("assign_add", a.status());
  }
  const double floor = cluster.tls() ? 0 : GrpcFloorP50Us(cluster.address(), ops);
  std::printf(
      "repvar_small workers=%d read_p50_us=%.1f read_p99_us=%.1f assign_add_p50_us=%.1f "
      "assign_add_p99_us=%.1f grpc_unary_floor_p50_us=%.1f local_read_p50_us=%.2f "
      "local_read_p99_us=%.2f\n",
      workers, Percentile(reads, 0.5), Percentile(reads, 0.99), Percentile(adds, 0.5),
      Percentile(adds, 0.99), floor, Percentile(local, 0.5), Percentile(local, 0.99));

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

}  // namespace
}  // namespace repvar::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_only_memory)) {
    repvar::bench::MemoryHeld();
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_checkpoint)) {
    repvar::bench::CheckpointTimes(absl::GetFlag(FLAGS_iters));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_security)) {
    repvar::bench::SecurityCost(absl::GetFlag(FLAGS_small_ops), absl::GetFlag(FLAGS_iters));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_small)) {
    repvar::bench::SmallOps(absl::GetFlag(FLAGS_small_ops), absl::GetFlag(FLAGS_small_workers));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_durable)) {
    repvar::bench::DurableOps(absl::GetFlag(FLAGS_small_ops));
    repvar::bench::RestartTime();
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_local)) {
    repvar::bench::LocalAccess(absl::GetFlag(FLAGS_mean_mib), absl::GetFlag(FLAGS_iters));
    return 0;
  }
  if (absl::GetFlag(FLAGS_only_bcast)) {
    repvar::bench::EveryBroadcast();
    return 0;
  }
  if (absl::GetFlag(FLAGS_mean_mib) > 0) {
    repvar::bench::LocalAccess(absl::GetFlag(FLAGS_mean_mib), absl::GetFlag(FLAGS_iters));
    repvar::bench::MeanStep(absl::GetFlag(FLAGS_mean_mib), absl::GetFlag(FLAGS_mean_replicas),
                            absl::GetFlag(FLAGS_iters));
  }
  repvar::bench::StepsPerSecond(absl::GetFlag(FLAGS_step_workers), absl::GetFlag(FLAGS_step_vars),
                                absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_step_written),
                                absl::GetFlag(FLAGS_step_write_path));
  if (absl::GetFlag(FLAGS_only_steps)) return 0;
  repvar::bench::EveryBroadcast();
  repvar::bench::SmallOps(absl::GetFlag(FLAGS_small_ops), absl::GetFlag(FLAGS_small_workers));
  repvar::bench::DurableOps(absl::GetFlag(FLAGS_small_ops));
  repvar::bench::RestartTime();
  return 0;
}

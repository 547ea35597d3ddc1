// SPDX-License-Identifier: Apache-2.0
// Replicated steps (S1-S5, F1) against real processes: a coordinator and
// three TPU hosts with two devices each (6 replicas: 0,1 on tpu_worker:0;
// 2,3 on :1; 4,5 on :2) plus a CPU-only host. One trainer per host, each in
// its own thread, as a data-parallel job runs them. Exact checks use
// integer-valued floats.
#include "repvar/step.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_util.h"
#include "common/tensor/tensor.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::Scaled;
using ::repvar::testing::StatusIs;

constexpr int kHosts = 3;
using Vec = std::array<float, 4>;

std::string Host(int h) { return absl::StrCat("tpu_worker:", h); }

class StepTest : public testing::StartedCluster {
 protected:
  StepTest()
      : StartedCluster([] {
          testing::ClusterOptions o;
          o.metrics = true;  // WorkerCalls
          return o;
        }()) {}

  // How many calls of `method` ("StepRead") of WorkerSteps tpu_worker:`host`
  // has answered OK, from its /metrics (0 before the first).
  double WorkerCalls(int host, const std::string& method) {
    const std::string daemon = absl::StrCat("tpu_worker-", host);
    int port = 0;
    for (absl::Time until = absl::Now() + Scaled(absl::Seconds(10));
         (port = cluster_.metrics_port(daemon)) == 0 && absl::Now() < until;) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    httplib::Client http("127.0.0.1", port);
    auto res = http.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200) << daemon;
    if (!res) return -1;
    const std::string series = absl::StrCat(
        R"(repvar_rpc_requests_total{method="/repvar.v1.WorkerSteps/)", method, R"(",code="OK"} )");
    const size_t at = res->body.find(series);
    double n = 0;
    if (at != std::string::npos) {
      const size_t end = res->body.find('\n', at);
      EXPECT_TRUE(
          absl::SimpleAtod(res->body.substr(at + series.size(), end - at - series.size()), &n));
    }
    return n;
  }

  // A float32[4] variable with 6 replicas, initialized to `init`.
  void Create(const std::string& name, Aggregation agg, Vec init = {1, 2, 3, 4}) {
    VariableSpec s{.name = name, .dtype = DType::kFloat32, .shape = {4}};
    s.replica_count = 6;
    s.aggregation = agg;
    s.initializer = InitializerSpec::Value(std::span<const float>(init));
    ASSERT_OK(client_->CreateVariable(s));
    ASSERT_OK(client_->Initialize({name}));
  }

  // A `dtype`[n] variable with 6 replicas, initialized to zeros.
  void CreateZeros(const std::string& name, DType dtype, int64_t n, Aggregation agg) {
    VariableSpec s{.name = name, .dtype = dtype, .shape = {n}};
    s.replica_count = 6;
    s.aggregation = agg;
    s.initializer = InitializerSpec::Zeros();
    ASSERT_OK(client_->CreateVariable(s));
    ASSERT_OK(client_->Initialize({name}));
  }

  StepOptions Options(int host, absl::Duration timeout = absl::Seconds(20)) {
    return StepOptions{.worker = Host(host), .barrier_timeout = Scaled(timeout)};
  }

  // One trainer per host (through `stepping_` when set, else `client_`):
  // begins `step`, lets `body` write, commits; all hosts commit
  // concurrently. Returns each host's commit result.
  template <typename Body>
  std::vector<absl::StatusOr<StepResult>> RunStep(int64_t step, Body body,
                                                  absl::Duration timeout = absl::Seconds(20),
                                                  int hosts = kHosts) {
    std::vector<absl::StatusOr<StepResult>> out(hosts, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int h = 0; h < hosts; ++h) {
      threads.emplace_back([&, h] {
        auto scope = StepScope::Begin(stepping_ != nullptr ? *stepping_ : *client_, step,
                                      Options(h, timeout));
        if (!scope.ok()) {
          out[h] = scope.status();
          return;
        }
        if (absl::Status s = body(h, **scope); !s.ok()) {
          out[h] = s;
          return;
        }
        out[h] = (*scope)->Commit();
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // Checksums of every replica of `name` as the first `hosts` workers hold them.
  std::map<int32_t, std::pair<int64_t, uint64_t>> Replicas(const std::string& name,
                                                           int hosts = kHosts) {
    std::map<int32_t, std::pair<int64_t, uint64_t>> out;
    for (int h = 0; h < hosts; ++h) {
      v1::GetReplicaStatusResponse status = testing::WorkerStatus(cluster_.worker_address(h));
      for (const v1::LocalReplica& r : status.replicas()) {
        if (r.name() == name) out[r.replica()] = {r.version(), r.checksum()};
      }
    }
    return out;
  }

  uint64_t Incarnation(int host) {
    return testing::WorkerIncarnation(cluster_.worker_address(host));
  }

  // Restarts tpu_worker:`host` after a kill and waits until its new
  // incarnation is registered and every replica of `var` is up to date,
  // the new process's included: until the coordinator has resynced it, the
  // records can still show the killed process's replicas up to date.
  void RestartAndResync(int host, const std::string& var) {
    const uint64_t old = Incarnation(host);
    ASSERT_OK(cluster_.RestartWorker(host));
    absl::Time deadline = absl::Now() + Scaled(absl::Seconds(20));
    while (absl::Now() < deadline) {
      const v1::GetReplicaStatusResponse held =
          testing::WorkerStatus(cluster_.worker_address(host));
      auto v = client_->GetVariable(var);
      bool ready = held.incarnation() != 0 && held.incarnation() != old && v.ok();
      bool resynced = false;
      for (const v1::LocalReplica& r : held.replicas()) {
        resynced = resynced || (r.name() == var && v.ok() && r.version() == v->version);
      }
      ready = ready && resynced;
      for (const ReplicaInfo& r : v.ok() ? v->replicas : std::vector<ReplicaInfo>{}) {
        ready = ready && r.state == ReplicaState::kUpToDate;
      }
      if (ready) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "tpu_worker:" << host << " did not come back with " << var << " resynced";
  }

  Client* stepping_ = nullptr;

  Vec ReadVec(const std::string& name) {
    auto v = client_->Read(name);
    EXPECT_OK(v);
    Vec out{};
    if (v.ok()) std::memcpy(out.data(), v->bytes.data(), sizeof(out));
    return out;
  }
};

// Writes `v` to every local replica of `name`.
absl::Status WriteAll(StepScope& s, const std::string& name, std::function<Vec(int32_t)> v) {
  auto local = s.LocalReplicas(name);
  if (!local.ok()) return local.status();
  for (int32_t r : *local) {
    Vec x = v(r);
    if (absl::Status st = s.Write<float>(name, r, std::span<const float>(x)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

TEST_F(StepTest, S1_BeginStep_IdempotentFixesParticipants_CommittedIdsIncrease) {
  Create("w", Aggregation::kMean);
  auto a = StepScope::Begin(*client_, 1, Options(0));
  ASSERT_OK(a);
  auto b = StepScope::Begin(*client_, 1, Options(1));
  ASSERT_OK(b);
  EXPECT_EQ((*a)->epoch(), (*b)->epoch());  // the same opening of step 1
  EXPECT_THAT(StepScope::Begin(*client_, 2, Options(2)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1"));
  auto local = (*b)->LocalReplicas("w");
  ASSERT_OK(local);
  EXPECT_EQ(*local, (std::vector<int32_t>{2, 3}));
  ASSERT_OK((*a)->Abort("test"));
  b->reset();

  // An aborted id may be reused, under a new epoch.
  auto results = RunStep(1, [](int, StepScope&) { return absl::OkStatus(); });
  for (auto& r : results) ASSERT_OK(r);
  EXPECT_GT(results[0]->epoch, (*a)->epoch());
  // Committed ids strictly increase.
  EXPECT_THAT(StepScope::Begin(*client_, 1, Options(0)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not above"));
  for (auto& r : RunStep(5, [](int, StepScope&) { return absl::OkStatus(); })) ASSERT_OK(r);
}

TEST_F(StepTest, S2_MappedInPlace_ReadUpdateWrite_OnlyPublishedWritesCount) {
  Create("w", Aggregation::kMean, {4, 4, 4, 4});
  auto before = Replicas("w");
  auto scope = StepScope::Begin(*client_, 1, Options(0));
  ASSERT_OK(scope);
  StepScope& s = **scope;
  // Read: the worker's view, mapped read-only.
  auto r0 = s.Map("w", 0, MapMode::kRead);
  ASSERT_OK(r0);
  EXPECT_EQ((*r0)->as<float>()[0], 4.0f);
  EXPECT_EQ((*r0)->version(), 1);
  // Update in place and publish: replica 0 becomes 8.
  auto u0 = s.Map("w", 0, MapMode::kUpdate);
  ASSERT_OK(u0);
  for (float& x : (*u0)->as<float>()) x *= 2;
  ASSERT_OK(s.Publish(*std::move(u0)));
  EXPECT_EQ((*r0)->as<float>()[0], 4.0f);  // an earlier read lease is a snapshot
  auto seen = s.Read("w", 0);
  ASSERT_OK(seen);
  EXPECT_EQ(seen->as<float>()[0], 8.0f);
  // A write mapping that is never published changes nothing.
  {
    auto w1 = s.Map("w", 1, MapMode::kWrite);
    ASSERT_OK(w1);
    for (float& x : (*w1)->as<float>()) x = 100;
  }
  EXPECT_EQ(s.Read("w", 1)->as<float>()[0], 4.0f);
  EXPECT_THAT(s.Map("w", 2, MapMode::kWrite).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(Replicas("w"), before);  // nothing committed yet
  r0->reset();
  // The other hosts write nothing; the mean of deltas is (8 - 4) / 6.
  std::vector<std::thread> others;
  for (int h : {1, 2}) {
    others.emplace_back([&, h] {
      auto other = StepScope::Begin(*client_, 1, Options(h));
      ASSERT_OK(other);
      EXPECT_OK((*other)->Commit());
    });
  }
  auto result = s.Commit();
  for (std::thread& t : others) t.join();
  ASSERT_OK(result);
  EXPECT_EQ(ReadVec("w")[0], 4.0f + 4.0f / 6.0f);
}

TEST_F(StepTest, S2_LargeWritesAndReadsGoThroughTheMapping_BytesAndChecksumsExact) {
  const int64_t n = 1 << 19;  // 2 MiB of float32: above the mapping threshold
  CreateZeros("big", DType::kFloat32, n, Aggregation::kOnlyFirstReplica);
  std::vector<float> value(n);
  for (int64_t i = 0; i < n; ++i) value[i] = static_cast<float>(i % 1000) * 0.5f;
  auto results = RunStep(1, [&](int h, StepScope& s) {
    if (h != 0) return absl::OkStatus();
    if (absl::Status st = s.Write<float>("big", 0, std::span<const float>(value)); !st.ok()) {
      return st;
    }
    auto back = s.Read("big", 0);
    if (!back.ok()) return back.status();
    if (back->bytes != std::vector<std::byte>(
                           reinterpret_cast<const std::byte*>(value.data()),
                           reinterpret_cast<const std::byte*>(value.data()) + n * sizeof(float)) ||
        back->checksum != Checksum(std::as_bytes(std::span<const float>(value)))) {
      return absl::DataLossError("the mapped round trip changed the bytes or their checksum");
    }
    return absl::OkStatus();
  });
  for (auto& r : results) ASSERT_OK(r);
  auto read = client_->Read("big");
  ASSERT_OK(read);
  EXPECT_EQ(read->checksum, Checksum(std::as_bytes(std::span<const float>(value))));
  std::set<uint64_t> sums;
  for (const auto& [i, vc] : Replicas("big")) sums.insert(vc.second);
  EXPECT_EQ(sums, (std::set<uint64_t>{read->checksum}));  // replica 0's value everywhere
}

// StepScope::ReadBatch gives each value as Read does, in the order asked:
// the small ones from the worker in StepReadSmall calls (5,000 reads of
// 16 bytes and 64 KiB: more than one call holds), the larger ones mapped
// (2 MiB) or streamed (256 KiB); this step's writes and the committed
// zeros alike. The worker's own count of its calls shows the batches and
// the stream (and a small Read alone as one call). An unknown variable and
// a replica not on this host are refused as Read refuses them.
TEST_F(StepTest, S2_ReadBatch_EachAsReadGivesIt_TheSmallOnesInBatches) {
  const std::vector<std::pair<std::string, int64_t>> vars = {
      {"mapped", 1 << 19}, {"streamed", 1 << 16}, {"inline", 1 << 14}, {"small", 4}, {"other", 4}};
  for (const auto& [name, n] : vars) CreateZeros(name, DType::kFloat32, n, Aggregation::kMean);
  auto results = RunStep(1, [&](int h, StepScope& s) -> absl::Status {
    if (h != 0) return absl::OkStatus();
    for (const char* name : {"streamed", "small"}) {
      std::vector<float> value(name == std::string("small") ? 4 : 1 << 16);
      for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<float>(i % 31) + 0.5f;
      REPVAR_RETURN_IF_ERROR(s.Write<float>(name, 0, std::span<const float>(value)));
    }
    std::vector<StepScope::LocalRead> reads;
    for (const auto& [name, n] : vars) reads.push_back({name, 0});
    for (int i = 0; i < 5000; ++i) reads.push_back({i % 2 ? "small" : "other", 0});
    reads.push_back({"inline", 0});
    const double streams = WorkerCalls(0, "StepRead"), smalls = WorkerCalls(0, "StepReadSmall");
    auto batch = s.ReadBatch(reads);
    if (!batch.ok()) return batch.status();
    // The 256 KiB one streamed; the 5,002 small ones in two calls.
    EXPECT_EQ(WorkerCalls(0, "StepRead") - streams, 1);
    EXPECT_EQ(WorkerCalls(0, "StepReadSmall") - smalls, 2);
    // A small one read alone: one call, not a stream.
    REPVAR_RETURN_IF_ERROR(s.Read("small", 0).status());
    EXPECT_EQ(WorkerCalls(0, "StepRead") - streams, 1);
    EXPECT_EQ(WorkerCalls(0, "StepReadSmall") - smalls, 3);
    EXPECT_EQ(batch->size(), reads.size());
    for (size_t i = 0; i < reads.size() && i < batch->size(); ++i) {
      auto one = s.Read(reads[i].name, 0);
      if (!one.ok()) return one.status();
      const TensorValue& got = (*batch)[i];
      if (got.bytes != one->bytes || got.version != one->version || got.checksum != one->checksum ||
          got.dtype != one->dtype || got.shape != one->shape) {
        return absl::DataLossError(absl::StrCat("read ", i, " (", reads[i].name, ") differs"));
      }
    }
    EXPECT_NE((*batch)[3].bytes, (*batch)[4].bytes) << "this step's write, the committed zeros";
    auto none = s.ReadBatch({});
    EXPECT_TRUE(none.ok() && none->empty());
    EXPECT_THAT(s.ReadBatch({{"small", 0}, {"absent", 0}}),
                StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(s.ReadBatch({{"small", 0}, {"small", 2}}), StatusIs(absl::StatusCode::kNotFound));
    return absl::OkStatus();
  });
  for (auto& r : results) ASSERT_OK(r);
}

// StepScope::ReadInto gives the step's view, as Read does, in the caller's
// buffer: through the worker's mapped buffer (2 MiB) and through its socket
// (256 KiB, streamed; 16 bytes); the committed value before this step's
// write, the write after it. A buffer of another size is refused untouched.
TEST_F(StepTest, S2_ReadInto_TheStepsViewInTheCallersBuffer_MappedAndThroughTheSocket) {
  const std::vector<std::pair<std::string, int64_t>> vars = {
      {"mapped", 1 << 19}, {"streamed", 1 << 16}, {"small", 4}};
  for (const auto& [name, n] : vars) CreateZeros(name, DType::kFloat32, n, Aggregation::kMean);
  // Chunks of 16 KiB: the 256 KiB value comes in 16 of them.
  ClientOptions options = ClientOptionsFor("admin.token");
  options.chunk_bytes = 16 << 10;
  auto small_chunks = Client::Connect(options);
  ASSERT_OK(small_chunks);
  stepping_ = small_chunks->get();
  auto results = RunStep(1, [&](int h, StepScope& s) -> absl::Status {
    if (h != 0) return absl::OkStatus();
    for (const auto& [name, n] : vars) {
      std::vector<float> out(n, -1.0f);
      auto before = s.ReadInto(name, 0, std::as_writable_bytes(std::span(out)));
      if (!before.ok()) return before.status();
      if (out != std::vector<float>(n, 0.0f) || before->version != 1 ||
          before->shape != std::vector<int64_t>{n} ||
          before->checksum != Checksum(std::as_bytes(std::span(out)))) {
        return absl::DataLossError(absl::StrCat(name, ": not the committed zeros"));
      }
      std::vector<float> value(n);
      for (int64_t i = 0; i < n; ++i) value[i] = static_cast<float>(i % 977) + 0.25f;
      if (absl::Status st = s.Write<float>(name, 0, std::span<const float>(value)); !st.ok()) {
        return st;
      }
      auto after = s.ReadInto(name, 0, std::as_writable_bytes(std::span(out)));
      if (!after.ok()) return after.status();
      auto read = s.Read(name, 0);
      if (!read.ok()) return read.status();
      if (out != value || after->checksum != Checksum(std::as_bytes(std::span(value))) ||
          after->checksum != read->checksum || read->bytes.size() != out.size() * 4 ||
          std::memcmp(read->bytes.data(), out.data(), read->bytes.size()) != 0) {
        return absl::DataLossError(absl::StrCat(name, ": not this step's write"));
      }
      std::vector<float> wrong(n + 1, -2.0f);
      EXPECT_THAT(s.ReadInto(name, 0, std::as_writable_bytes(std::span(wrong))),
                  StatusIs(absl::StatusCode::kInvalidArgument, "buffer"))
          << name;
      EXPECT_EQ(wrong, std::vector<float>(n + 1, -2.0f)) << name;
    }
    EXPECT_THAT(s.ReadInto("absent", 0, {}), StatusIs(absl::StatusCode::kFailedPrecondition));
    std::vector<float> out(4);
    EXPECT_THAT(s.ReadInto("small", 2, std::as_writable_bytes(std::span(out))),
                StatusIs(absl::StatusCode::kNotFound));
    return absl::OkStatus();
  });
  for (auto& r : results) ASSERT_OK(r);
}

// The client keeps its mappings of the worker's buffers between leases
// (MappingCache), and the worker lends the same buffers again: the buffer a
// step wrote becomes the value, the value it replaced the next write lease.
// Each step must still read the last committed bytes and commit its own.
TEST_F(StepTest, S2_MappedWritesStepAfterStep_KeptMappingsCarryEachStepsBytes) {
  const int64_t n = 1 << 19;  // 2 MiB: the worker lends shared buffers
  CreateZeros("kept", DType::kFloat32, n, Aggregation::kOnlyFirstReplica);
  for (int step = 1; step <= 5; ++step) {
    auto results = RunStep(step, [&](int h, StepScope& s) {
      if (h != 0) return absl::OkStatus();
      auto before = s.Map("kept", 0, MapMode::kRead);
      if (!before.ok()) return before.status();
      for (float x : {(*before)->as<float>()[0], (*before)->as<float>()[n - 1]}) {
        if (x != static_cast<float>(step - 1)) {
          return absl::DataLossError(absl::StrCat("step ", step, " read ", x));
        }
      }
      before->reset();
      auto w = s.Map("kept", 0, MapMode::kWrite);
      if (!w.ok()) return w.status();
      for (float& x : (*w)->as<float>()) x = static_cast<float>(step);
      return s.Publish(*std::move(w));
    });
    for (auto& r : results) ASSERT_OK(r);
    std::vector<float> expect(n, static_cast<float>(step));
    auto read = client_->Read("kept");
    ASSERT_OK(read);
    EXPECT_EQ(read->checksum, Checksum(std::as_bytes(std::span<const float>(expect))))
        << "step " << step;
  }
}

TEST_F(StepTest, S2_InStepWritesAreLocalCopies_AbortLeavesReplicasAsCommitted) {
  Create("w", Aggregation::kNone);
  auto before = Replicas("w");
  ASSERT_EQ(before.size(), 6u);
  {
    auto scope = StepScope::Begin(*client_, 1, Options(1));
    ASSERT_OK(scope);
    Vec x{9, 9, 9, 9};
    ASSERT_OK((*scope)->Write<float>("w", 2, std::span<const float>(x)));
    auto seen = (*scope)->Read("w", 2);  // the step sees its own write
    ASSERT_OK(seen);
    EXPECT_EQ(seen->as<float>()[0], 9.0f);
    auto other = (*scope)->Read("w", 3);  // untouched: the committed value
    ASSERT_OK(other);
    EXPECT_EQ(other->as<float>()[0], 1.0f);
    EXPECT_THAT((*scope)->Write<float>("w", 0, std::span<const float>(x)),
                StatusIs(absl::StatusCode::kNotFound));  // replica 0 lives on host 0
    EXPECT_EQ(Replicas("w"), before);                    // the committed replicas are untouched
  }                                                      // destroyed without Commit: aborted
  EXPECT_EQ(Replicas("w"), before);
  EXPECT_EQ(ReadVec("w"), (Vec{1, 2, 3, 4}));
  // The next step opens cleanly.
  for (auto& r : RunStep(1, [](int, StepScope&) { return absl::OkStatus(); })) ASSERT_OK(r);
}

TEST_F(StepTest, S3_OneReportPerWorker_RefusalsHaveDistinctStatuses) {
  Create("w", Aggregation::kNone);
  const uint64_t inc0 = testing::WorkerIncarnation(cluster_.worker_address(0));
  auto scope = StepScope::Begin(*client_, 3, Options(0));
  ASSERT_OK(scope);
  auto stub = v1::CoordinatorWorkers::NewStub(
      grpc::CreateChannel(cluster_.address(), grpc::InsecureChannelCredentials()));
  auto report = [&](v1::ReportStepRequest req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    v1::StepPlan plan;
    return stub->ReportStep(&ctx, req, &plan).error_code();
  };
  v1::ReportStepRequest req;
  req.set_step(3);
  req.set_epoch((*scope)->epoch());
  req.set_job("tpu_worker");
  req.set_task(0);
  req.set_incarnation(inc0);
  auto* rr = req.add_replicas();
  rr->set_variable_id(1);
  rr->set_replica(0);
  rr->set_checksum(42);
  rr->set_first_nonfinite(-1);

  v1::ReportStepRequest stale = req;
  stale.set_incarnation(inc0 + 1);
  EXPECT_EQ(report(stale), grpc::StatusCode::ABORTED);
  v1::ReportStepRequest not_owner = req;
  not_owner.mutable_replicas(0)->set_replica(2);  // replica 2 lives on tpu_worker:1
  EXPECT_EQ(report(not_owner), grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportStepRequest future = req;
  future.set_step(4);
  future.set_epoch((*scope)->epoch() + 1);
  EXPECT_EQ(report(future), grpc::StatusCode::OUT_OF_RANGE);
  v1::ReportStepRequest closed = req;
  closed.set_step(2);
  closed.set_epoch((*scope)->epoch() - 1);  // below the open step
  EXPECT_EQ(report(closed), grpc::StatusCode::FAILED_PRECONDITION);

  // Accepted: the call then waits for the barrier (cut short here).
  EXPECT_EQ(report(req), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(report(req), grpc::StatusCode::DEADLINE_EXCEEDED);  // identical: idempotent
  v1::ReportStepRequest different = req;
  different.mutable_replicas(0)->set_checksum(43);
  EXPECT_EQ(report(different), grpc::StatusCode::ALREADY_EXISTS);
}

TEST_F(StepTest, S4_Mean_BeginPlusMeanOfDeltas_ExactAndBitIdentical_VersionPlusOne) {
  Create("w", Aggregation::kMean, {10, 20, 30, 40});
  // Replica r adds (r + 1) * 6 to every element: the mean delta is 21.
  auto results = RunStep(1, [](int, StepScope& s) {
    return WriteAll(s, "w", [](int32_t r) {
      float d = static_cast<float>((r + 1) * 6);
      return Vec{10 + d, 20 + d, 30 + d, 40 + d};
    });
  });
  for (auto& r : results) {
    ASSERT_OK(r);
    ASSERT_EQ(r->changed.size(), 1u);
    EXPECT_EQ(r->changed[0].version, 2);                                 // initialize was version 1
    EXPECT_EQ(r->changed[0].checksum, results[0]->changed[0].checksum);  // one resolution
    EXPECT_EQ(r->latencies.size(), 3u);
  }
  EXPECT_EQ(ReadVec("w"), (Vec{31, 41, 51, 61}));
  auto replicas = Replicas("w");
  ASSERT_EQ(replicas.size(), 6u);
  for (const auto& [i, vc] : replicas) {
    EXPECT_EQ(vc, (std::pair<int64_t, uint64_t>{2, results[0]->changed[0].checksum})) << i;
  }
}

TEST_F(StepTest, S4_Sum_UntouchedReplicasContributeZero) {
  Create("c", Aggregation::kSum, {0, 0, 0, 0});
  // Only host 1 writes: replica 2 adds 1, replica 3 adds 2.
  auto results = RunStep(1, [](int h, StepScope& s) {
    if (h != 1) return absl::OkStatus();
    return WriteAll(s, "c", [](int32_t r) {
      float d = static_cast<float>(r - 1);
      return Vec{d, d, d, d};
    });
  });
  for (auto& r : results) ASSERT_OK(r);
  EXPECT_EQ(ReadVec("c"), (Vec{3, 3, 3, 3}));
  std::set<uint64_t> sums;
  for (const auto& [i, vc] : Replicas("c")) sums.insert(vc.second);
  EXPECT_EQ(sums.size(), 1u);
}

TEST_F(StepTest, S4_BFloat16Sum_AccumulatesInFloat32) {
  CreateZeros("h", DType::kBFloat16, 2, Aggregation::kSum);
  // Replica 0 adds 256, the five others 1 each: 261 in float32, which rounds
  // to 260 in bfloat16. Summed in bfloat16 it would stay at 256.
  auto results = RunStep(1, [](int, StepScope& s) {
    auto local = s.LocalReplicas("h");
    if (!local.ok()) return local.status();
    for (int32_t r : *local) {
      std::array<uint16_t, 2> v;
      v.fill(r == 0 ? uint16_t{0x4380} : uint16_t{0x3f80});  // 256 or 1
      absl::Status st = s.Write("h", r, std::as_bytes(std::span<const uint16_t>(v)));
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  });
  for (auto& r : results) ASSERT_OK(r);
  auto v = client_->Read("h");
  ASSERT_OK(v);
  EXPECT_EQ(v->as<uint16_t>()[0], 0x4382);  // 260
  EXPECT_EQ(v->as<uint16_t>()[1], 0x4382);
}

TEST_F(StepTest, S4_None_DivergenceReportedAndRepairedFromMajority) {
  Create("n", Aggregation::kNone);
  // Hosts 0 and 1 (4 replicas) agree on A; host 2 (2 replicas) writes B.
  auto results = RunStep(1, [](int h, StepScope& s) {
    return WriteAll(s, "n", [h](int32_t) { return h == 2 ? Vec{7, 7, 7, 7} : Vec{5, 5, 5, 5}; });
  });
  for (auto& r : results) {
    ASSERT_OK(r);
    ASSERT_EQ(r->divergences.size(), 1u);
    EXPECT_EQ(r->divergences[0].variable, "n");
    EXPECT_EQ(r->divergences[0].repaired, (std::vector<int32_t>{4, 5}));
    EXPECT_EQ(r->divergences[0].replica_checksums.size(), 6u);
  }
  EXPECT_EQ(ReadVec("n"), (Vec{5, 5, 5, 5}));
  std::set<uint64_t> sums;
  for (const auto& [i, vc] : Replicas("n")) sums.insert(vc.second);
  EXPECT_EQ(sums.size(), 1u);  // repaired everywhere
}

TEST_F(StepTest, S4_OnlyFirstReplica_PrimaryValueEverywhere) {
  Create("f", Aggregation::kOnlyFirstReplica);
  auto results = RunStep(1, [](int h, StepScope& s) {
    return WriteAll(s, "f", [h](int32_t r) {
      float x = static_cast<float>(100 * h + r);
      return Vec{x, x, x, x};
    });
  });
  for (auto& r : results) {
    ASSERT_OK(r);
    EXPECT_TRUE(r->divergences.empty());
  }
  EXPECT_EQ(ReadVec("f"), (Vec{0, 0, 0, 0}));  // replica 0 wrote 0
  std::set<uint64_t> sums;
  for (const auto& [i, vc] : Replicas("f")) sums.insert(vc.second);
  EXPECT_EQ(sums.size(), 1u);
}

TEST_F(StepTest, S4_NonFiniteLocalValue_FailsStepNamingReplica_NothingChanges) {
  Create("w", Aggregation::kMean);
  auto before = Replicas("w");
  auto results = RunStep(1, [](int h, StepScope& s) {
    return WriteAll(s, "w", [h](int32_t r) {
      float bad = (h == 1 && r == 3) ? std::numeric_limits<float>::infinity() : 1.0f;
      return Vec{bad, 1, 1, 1};
    });
  });
  for (auto& r : results) {
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kInvalidArgument, "w/3 on tpu_worker:1"));
  }
  EXPECT_EQ(Replicas("w"), before);
}

TEST_F(StepTest, S4_BarrierTimeout_NamesMissingWorker_EveryCommitGetsIt) {
  Create("w", Aggregation::kMean);
  // Host 2's trainer begins but never commits.
  auto straggler = StepScope::Begin(*client_, 1, Options(2, absl::Seconds(2)));
  ASSERT_OK(straggler);
  std::vector<StepEventInfo> events;
  std::thread watch([&] {
    (void)WatchSteps(*client_, 0, Scaled(absl::Seconds(10)), [&](const StepEventInfo& e) {
      events.push_back(e);
      return e.kind != StepEventInfo::Kind::kResolved;
    });
  });
  // The trainers hear of the stragglers while they wait in Commit.
  absl::Mutex mu;
  std::vector<StepEventInfo> heard;
  std::vector<std::thread> trainers;
  std::vector<absl::StatusOr<StepResult>> results(2, absl::UnknownError("not run"));
  for (int h = 0; h < 2; ++h) {
    trainers.emplace_back([&, h] {
      StepOptions o = Options(h, absl::Seconds(2));
      o.on_event = [&](const StepEventInfo& e) {
        absl::MutexLock lock(&mu);
        heard.push_back(e);
      };
      auto scope = StepScope::Begin(*client_, 1, o);
      if (!scope.ok()) {
        results[h] = scope.status();
        return;
      }
      results[h] = (*scope)->Commit();
    });
  }
  for (std::thread& t : trainers) t.join();
  watch.join();
  {
    absl::MutexLock lock(&mu);
    int stragglers = 0;
    for (const StepEventInfo& e : heard) {
      if (e.kind != StepEventInfo::Kind::kStragglers) continue;
      ++stragglers;
      EXPECT_EQ(e.missing, (std::vector<std::string>{"tpu_worker:2"}));
    }
    EXPECT_EQ(stragglers, 2) << "each waiting trainer is warned at half the timeout";
  }
  for (auto& r : results) {
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     "missing: tpu_worker:2 (sent no report"));
  }
  bool warned = false;
  for (const StepEventInfo& e : events) {
    if (e.kind == StepEventInfo::Kind::kStragglers) {
      warned = true;
      EXPECT_EQ(e.missing, (std::vector<std::string>{"tpu_worker:2"}));
    }
  }
  EXPECT_TRUE(warned) << "no straggler warning at half the timeout";
}

TEST_F(StepTest, S5_CrossReplicaWriteRefused_ReadsCommitted_NewVariablesJoinNextStep) {
  Create("w", Aggregation::kMean);
  auto scope = StepScope::Begin(*client_, 1, Options(0));
  ASSERT_OK(scope);
  Vec x{0, 0, 0, 0};
  EXPECT_THAT(client_->Assign<float>("w", std::span<const float>(x)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 is open"));
  ASSERT_OK((*scope)->Write<float>("w", 0, std::span<const float>(x)));
  EXPECT_EQ(ReadVec("w"), (Vec{1, 2, 3, 4}));  // the last committed value
  // A new variable may be created and initialized now; it is not in step 1.
  Create("slot", Aggregation::kMean);
  EXPECT_THAT((*scope)->LocalReplicas("slot").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "after the step began"));
  ASSERT_OK((*scope)->Abort());
  auto next = StepScope::Begin(*client_, 2, Options(0));
  ASSERT_OK(next);
  EXPECT_OK((*next)->LocalReplicas("slot"));  // joined the next step
}

TEST_F(StepTest, F1_DeadWorker_AbortsStepWithUnavailableNamingIt) {
  Create("w", Aggregation::kMean);
  auto straggler = StepScope::Begin(*client_, 1, Options(2, absl::Seconds(60)));
  ASSERT_OK(straggler);
  cluster_.worker(2).Kill(SIGSTOP);  // heartbeats stop
  auto results = RunStep(
      1, [](int, StepScope&) { return absl::OkStatus(); }, absl::Seconds(60), 2);
  cluster_.worker(2).Kill(SIGCONT);
  for (auto& r : results) {
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kUnavailable, "worker tpu_worker:2"));
  }
}

TEST_F(StepTest, S3_OneTrainerPerDevice_HostReportsWhenBothDevicesCommitted) {
  Create("w", Aggregation::kSum, {0, 0, 0, 0});
  // Six trainers: one per device, each writing only its own replica.
  std::vector<absl::StatusOr<StepResult>> out(6, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 6; ++r) {
    threads.emplace_back([&, r] {
      StepOptions o = Options(r / 2);
      o.devices = {absl::StrCat("TPU:", r % 2)};
      auto scope = StepScope::Begin(*client_, 1, o);
      if (!scope.ok()) {
        out[r] = scope.status();
        return;
      }
      Vec x{1, 1, 1, 1};
      if (absl::Status st = (*scope)->Write<float>("w", r, std::span<const float>(x)); !st.ok()) {
        out[r] = st;
        return;
      }
      out[r] = (*scope)->Commit();
    });
  }
  for (std::thread& t : threads) t.join();
  for (auto& r : out) {
    ASSERT_OK(r);
    EXPECT_EQ(r->epoch, out[0]->epoch);
    EXPECT_EQ(r->latencies.size(), 3u);  // one report per host, not per trainer
  }
  EXPECT_EQ(ReadVec("w"), (Vec{6, 6, 6, 6}));
}

TEST_F(StepTest, S3_TrainerOnAHostWithoutReplicas_GetsTheSameResolution) {
  Create("w", Aggregation::kMean);
  absl::StatusOr<StepResult> cpu_host = absl::UnknownError("not run");
  std::thread cpu([&] {
    auto scope = StepScope::Begin(*client_, 1, {.worker = "worker:0"});
    if (!scope.ok()) {
      cpu_host = scope.status();
      return;
    }
    auto local = (*scope)->LocalReplicas("w");
    EXPECT_TRUE(local.ok() && local->empty());
    cpu_host = (*scope)->Commit();
  });
  auto results = RunStep(1, [](int, StepScope& s) {
    return WriteAll(s, "w", [](int32_t) { return Vec{2, 3, 4, 5}; });
  });
  cpu.join();
  for (auto& r : results) ASSERT_OK(r);
  ASSERT_OK(cpu_host);
  EXPECT_EQ(cpu_host->epoch, results[0]->epoch);
  ASSERT_EQ(cpu_host->changed.size(), 1u);
  EXPECT_EQ(cpu_host->changed[0].checksum, results[0]->changed[0].checksum);
}

TEST_F(StepTest, F2_WorkerRestartedAfterSteps_ResyncedFromAnUpToDateReplica) {
  Create("w", Aggregation::kMean);
  for (int step = 1; step <= 2; ++step) {
    auto results = RunStep(step, [step](int, StepScope& s) {
      return WriteAll(s, "w", [step](int32_t r) {
        float x = static_cast<float>(step * 10 + r);
        return Vec{x, x, x, x};
      });
    });
    for (auto& r : results) ASSERT_OK(r);
  }
  // The committed value now exists only on the replicas (nothing has read
  // it through the coordinator yet): the resync must fetch it from one.
  auto info = client_->GetVariable("w");
  ASSERT_OK(info);
  cluster_.worker(2).Kill(SIGKILL);
  RestartAndResync(2, "w");
  auto r = Replicas("w");
  EXPECT_EQ(r[4], (std::pair<int64_t, uint64_t>{info->version, info->checksum}));
  EXPECT_EQ(r[5], (std::pair<int64_t, uint64_t>{info->version, info->checksum}));
  EXPECT_EQ(ReadVec("w"), (Vec{22.5f, 22.5f, 22.5f, 22.5f}));
  // And the restarted worker takes part in the next step.
  auto next = RunStep(3, [](int, StepScope& s) {
    return WriteAll(s, "w", [](int32_t) { return Vec{1, 1, 1, 1}; });
  });
  for (auto& res : next) ASSERT_OK(res);
  EXPECT_EQ(ReadVec("w"), (Vec{1, 1, 1, 1}));
}

TEST_F(StepTest, X2_BadInStepWrites_RefusedAndNothingChanges) {
  Create("w", Aggregation::kMean);
  auto scope = StepScope::Begin(*client_, 1, Options(0));
  ASSERT_OK(scope);
  float three[3] = {1, 2, 3};
  EXPECT_THAT((*scope)->Write("w", 0, std::as_bytes(std::span(three))),
              StatusIs(absl::StatusCode::kInvalidArgument));  // 3 floats for a float32[4]
  // A header whose checksum does not match its bytes.
  auto stub = testing::WorkerStepsStub(cluster_.worker_address(0));
  v1::StepWriteSmallRequest req;
  v1::StepWriteHeader* h = req.add_writes();
  h->set_step(1);
  h->set_epoch((*scope)->epoch());
  auto var = client_->GetVariable("w");
  ASSERT_OK(var);
  h->set_variable_id(var->id);
  h->set_replica(0);
  h->mutable_tensor()->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  h->mutable_tensor()->mutable_spec()->add_dims(4);
  h->mutable_tensor()->set_byte_size(16);
  h->mutable_tensor()->set_checksum(12345);
  h->set_inline_data(std::string(16, '\0'));
  grpc::ClientContext ctx;
  v1::StepWriteResponse resp;
  EXPECT_EQ(stub->StepWriteSmall(&ctx, req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  auto seen = (*scope)->Read("w", 0);
  ASSERT_OK(seen);
  EXPECT_EQ(seen->as<float>()[0], 1.0f);  // still the committed value

  // A stream whose second tensor is bad applies neither.
  {
    grpc::ClientContext sctx;
    v1::StepWriteResponse sresp;
    auto writer = stub->StepWrite(&sctx, &sresp);
    float good[4] = {7, 7, 7, 7};
    v1::StepWriteRequest m1;
    *m1.mutable_header() = *h;
    m1.mutable_header()->set_stream_writes(2);
    m1.mutable_header()->set_inline_data(reinterpret_cast<const char*>(good), sizeof(good));
    m1.mutable_header()->mutable_tensor()->set_checksum(
        Checksum(std::as_bytes(std::span<const float>(good))));
    v1::StepWriteRequest m2;
    *m2.mutable_header() = *h;  // the bad checksum again, for replica 1
    m2.mutable_header()->set_replica(1);
    EXPECT_TRUE(writer->Write(m1));
    writer->Write(m2);
    writer->WritesDone();
    grpc::Status finished = writer->Finish();
    EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(finished.error_message(), ::testing::HasSubstr("checksum"));
  }
  EXPECT_EQ((*scope)->Read("w", 0)->as<float>()[0], 1.0f);
  EXPECT_EQ((*scope)->Read("w", 1)->as<float>()[0], 1.0f);
}

TEST_F(StepTest, F1_WorkerKilledDuringAggregation_StepFailsNothingChanges_NextStepWorks) {
  // A big MEAN variable keeps the workers in the reduction long enough.
  const int64_t n = 8 << 20;  // 32 MiB of float32
  CreateZeros("big", DType::kFloat32, n, Aggregation::kMean);
  auto before = Replicas("big");
  std::vector<float> ones(n, 1.0f);
  auto write_all = [&](int, StepScope& s) -> absl::Status {
    auto local = s.LocalReplicas("big");
    if (!local.ok()) return local.status();
    for (int32_t r : *local) {
      absl::Status st = s.Write<float>("big", r, std::span<const float>(ones));
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  };
  std::thread killer([&] {
    // Once every host has reported, the workers are in the reduction.
    (void)WatchSteps(*client_, 0, Scaled(absl::Seconds(60)), [&](const StepEventInfo& e) {
      if (e.kind != StepEventInfo::Kind::kAggregating) return true;
      cluster_.worker(2).Kill(SIGKILL);
      return false;
    });
  });
  auto results = RunStep(1, write_all, absl::Seconds(60));
  killer.join();
  // Whoever notices first ends the step for everyone, naming the lost worker:
  // the coordinator (its heartbeats stopped: UNAVAILABLE) or the trainer on
  // that host (its worker went away mid-commit: it aborts the step).
  for (int h = 0; h < 2; ++h) {
    ASSERT_FALSE(results[h].ok()) << h;
    EXPECT_TRUE(absl::IsUnavailable(results[h].status()) || absl::IsAborted(results[h].status()))
        << results[h].status();
    EXPECT_NE(results[h].status().message().find("tpu_worker:2"), std::string::npos)
        << results[h].status();
  }
  EXPECT_FALSE(results[2].ok());                                    // its worker is gone
  auto after = Replicas("big", 2);                                  // the two live hosts
  for (int r = 0; r < 4; ++r) EXPECT_EQ(after[r], before[r]) << r;  // nothing changed
  // The worker comes back, is resynced, and the next step works with all six.
  RestartAndResync(2, "big");
  auto next = RunStep(1, write_all, absl::Seconds(20));
  for (auto& r : next) ASSERT_OK(r);
  auto v = client_->Read("big");
  ASSERT_OK(v);
  EXPECT_EQ(v->as<float>()[0], 1.0f);
  EXPECT_EQ(v->as<float>()[n - 1], 1.0f);
}

TEST_F(StepTest, RunToRun_SameStepsGiveBitIdenticalValues) {
  // The same five steps from the same start, run twice (the variable is reset
  // by a cross-replica assign in between), end bit-identical: the reduction
  // order is fixed for a fixed set of workers.
  const Vec init{0.1f, 0.2f, 0.3f, 0.4f};
  Create("a", Aggregation::kMean, init);
  std::vector<std::vector<std::byte>> runs;
  for (int run = 0; run < 2; ++run) {
    for (int i = 1; i <= 5; ++i) {
      auto results = RunStep(run * 5 + i, [i](int, StepScope& s) {
        auto local = s.LocalReplicas("a");
        if (!local.ok()) return local.status();
        for (int32_t r : *local) {
          auto cur = s.Read("a", r);
          if (!cur.ok()) return cur.status();
          Vec x;
          std::memcpy(x.data(), cur->bytes.data(), sizeof(x));
          for (float& e : x)
            e = e * 0.9f + 0.013f * static_cast<float>(i) / static_cast<float>(r + 3);
          absl::Status st = s.Write<float>("a", r, std::span<const float>(x));
          if (!st.ok()) return st;
        }
        return absl::OkStatus();
      });
      for (auto& r : results) ASSERT_OK(r);
    }
    auto v = client_->Read("a");
    ASSERT_OK(v);
    runs.push_back(v->bytes);
    ASSERT_OK(client_->Assign<float>("a", std::span<const float>(init)));
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_NE(runs[0], std::vector<std::byte>(16));
}

}  // namespace
}  // namespace repvar

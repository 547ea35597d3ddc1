// SPDX-License-Identifier: Apache-2.0
// Replicated steps against real processes: beginning a step (S1) and the
// trainers' reads and writes inside it (S2). Aggregation, refusals and
// failures are in step_aggregation_test.cc.
#include "tests/integration/step_fixture.h"

namespace repvar {
namespace {

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

}  // namespace
}  // namespace repvar

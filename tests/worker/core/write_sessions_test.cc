// SPDX-License-Identifier: Apache-2.0
// Receiving writes as chunk streams: all of a stream's writes apply together
// at the end or none do; fencing by incarnation; the data plane delivers
// bytes to the members that do not get them in the stream.
#include "worker/core/write_sessions.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "tests/testing/status_matchers.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::StatusIs;

constexpr uint64_t kInc = 7;

std::vector<std::byte> Bytes(std::vector<float> v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Hands `session` a chunk as the RPC layer does: `fill` copies the bytes
// into place.
template <typename Session>
absl::Status Chunk(Session& session, uint64_t offset, std::span<const std::byte> data,
                   uint64_t checksum) {
  return session.OnChunk(offset, data.size(), checksum, [&](std::span<std::byte> out) {
    std::memcpy(out.data(), data.data(), data.size());
  });
}

ReplicaWriteHeader Header(uint64_t id, const std::vector<std::byte>& bytes,
                          uint64_t incarnation = kInc) {
  ReplicaWriteHeader h;
  h.incarnation = incarnation;
  h.write.variable_id = id;
  h.write.name = absl::StrCat("v", id);
  h.write.version = 3;
  h.write.fence = 1;
  h.write.replicas = {0, 1};
  h.tensor = TensorHeader{TensorSpec{DType::kFloat32, {static_cast<int64_t>(bytes.size() / 4)}},
                          bytes.size(), Checksum(bytes)};
  return h;
}

// The root's bytes as the data plane delivers them to another member; on
// the root, what it sent (each half once it had arrived).
class FakeBroadcast final : public Collectives {
 public:
  absl::Status Broadcast(const CollectiveSpec& c, std::span<std::byte> bytes,
                         ChecksumStream* received, ArrivingBytes* arriving) override {
    if (c.rank == c.root) {
      for (size_t end : {bytes.size() / 2, bytes.size()}) {
        root_waited = arriving->Await(end);
        if (!root_waited.ok()) return absl::UnavailableError(root_waited.ToString());
        sent.assign(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(end));
      }
      return absl::OkStatus();
    }
    std::memcpy(bytes.data(), root.data(), std::min(bytes.size(), root.size()));
    if (received != nullptr) received->Update(bytes);
    return absl::OkStatus();
  }
  absl::Status Allreduce(const CollectiveSpec&, AccumType, std::span<std::byte>) override {
    return absl::OkStatus();
  }
  std::vector<std::byte> root;
  std::vector<std::byte> sent;  // by the root
  absl::Status root_waited;
};

TEST(ReplicaWriteSession, AllWritesApplyTogetherAtTheEnd_ABadOneAppliesNone) {
  ReplicaStore store;
  const auto a = Bytes({1, 2});
  const auto b = Bytes({3, 4, 5});
  {
    ReplicaWriteSession session(kInc, &store, nullptr);
    ASSERT_OK(session.OnHeader(Header(1, a), a));  // inline
    ASSERT_OK(session.OnHeader(Header(2, b), {}));
    EXPECT_THAT(Chunk(session, 0, b, Checksum(b) + 1),
                StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  EXPECT_TRUE(store.List().empty());
  ReplicaWriteSession session(kInc, &store, nullptr);
  ASSERT_OK(session.OnHeader(Header(1, a), a));
  ASSERT_OK(session.OnHeader(Header(2, b), {}));
  ASSERT_OK(Chunk(session, 0, b, Checksum(b)));
  EXPECT_TRUE(store.List().empty()) << "nothing before Finish";
  EXPECT_EQ(*session.Finish(), Checksum(b));
  EXPECT_EQ(store.List().size(), 4u);
  EXPECT_EQ(store.Get(2, 1)->version, 3);
}

TEST(ReplicaWriteSession, Refusals) {
  ReplicaStore store;
  const auto a = Bytes({1, 2});
  ReplicaWriteSession session(kInc, &store, nullptr);
  EXPECT_THAT(session.OnHeader(Header(1, a, kInc + 1), a),
              StatusIs(absl::StatusCode::kAborted, "meant for incarnation 8"));
  EXPECT_THAT(Chunk(session, 0, a, Checksum(a)),
              StatusIs(absl::StatusCode::kInvalidArgument, "without a header"));
  ReplicaWriteHeader bad = Header(1, a);
  bad.write.version = 0;
  EXPECT_THAT(session.OnHeader(bad, a), StatusIs(absl::StatusCode::kInvalidArgument, "version"));
  bad = Header(1, a);
  bad.write.replicas = {0, -1};
  EXPECT_THAT(session.OnHeader(bad, a), StatusIs(absl::StatusCode::kInvalidArgument, "replica"));
  bad.write.replicas = {2, 0, 2};
  EXPECT_THAT(session.OnHeader(bad, a), StatusIs(absl::StatusCode::kInvalidArgument, "repeated"));
  // A long list (checked by sorting a copy): repeated, then negative.
  bad.write.replicas.clear();
  for (int32_t r = 40; r >= 0; --r) bad.write.replicas.push_back(r);
  bad.write.replicas.push_back(17);
  EXPECT_THAT(session.OnHeader(bad, a), StatusIs(absl::StatusCode::kInvalidArgument, "repeated"));
  bad.write.replicas.back() = -3;
  EXPECT_THAT(session.OnHeader(bad, a), StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  bad.write.replicas.back() = 41;
  EXPECT_OK(session.OnHeader(bad, a));
  bad = Header(1, a);
  bad.write.fence = 0;
  EXPECT_THAT(session.OnHeader(bad, a), StatusIs(absl::StatusCode::kInvalidArgument, "fence"));
  ReplicaWriteHeader h = Header(1, a);
  h.write.collective = CollectiveSpec{"g", 1, 2, 0, 0, absl::Seconds(1)};
  ASSERT_OK(session.OnHeader(h, {}));
  EXPECT_THAT(session.Finish(), StatusIs(absl::StatusCode::kFailedPrecondition, "no data plane"));
}

// Small writes in one message, each value whole (WriteSmallReplicas); the
// writes point into `values`.
SmallReplicaWrites Small(const std::vector<const std::vector<std::byte>*>& values,
                         uint64_t incarnation = kInc) {
  SmallReplicaWrites out;
  out.incarnation = incarnation;
  for (size_t i = 0; i < values.size(); ++i) {
    ReplicaWriteHeader h = Header(i + 1, *values[i]);
    out.specs.push_back(h.tensor.spec);
    out.items.push_back({h.write, i, h.tensor.checksum, i, *values[i]});
  }
  return out;
}

TEST(ApplySmallWrites, AllApplyTogether_ABadOneAppliesNone) {
  ReplicaStore store;
  const auto a = Bytes({1, 2});
  const auto b = Bytes({3, 4, 5});
  SmallReplicaWrites corrupt = Small({&a, &b});
  corrupt.items[1].checksum += 1;
  EXPECT_THAT(ApplySmallWrites(kInc, corrupt, &store),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum mismatch"));
  EXPECT_TRUE(store.List().empty());
  SmallReplicaWrites unsummed = Small({&a, &b});
  unsummed.items[1].checksum = 0;  // not given: computed here
  EXPECT_EQ(*ApplySmallWrites(kInc, unsummed, &store), Checksum(b));
  EXPECT_EQ(store.List().size(), 4u);
  EXPECT_EQ(store.Get(2, 1)->version, 3);
  EXPECT_EQ(store.Get(1, 0)->value->checksum, Checksum(a));
  EXPECT_EQ(*ApplySmallWrites(kInc, Small({}), &store), 0u) << "an empty batch is no write";
}

// Writes that share a value in the message (variables initialized alike)
// share one Tensor in the store: its bytes are held, and counted, once.
TEST(ApplySmallWrites, SharedValue_HeldOnceByEveryWriteNamingIt) {
  ReplicaStore store;
  const auto zeros = Bytes({0, 0});
  const auto other = Bytes({1, 2, 3});
  SmallReplicaWrites writes = Small({&zeros, &other, &zeros});
  writes.items[2].value = 0;  // the third shares the first's value
  ASSERT_OK(ApplySmallWrites(kInc, writes, &store).status());
  ASSERT_OK(store.Get(1, 0));
  EXPECT_EQ(store.Get(1, 0)->value.get(), store.Get(3, 1)->value.get());
  EXPECT_NE(store.Get(1, 0)->value.get(), store.Get(2, 0)->value.get());
  EXPECT_EQ(store.Get(3, 0)->value->checksum, Checksum(zeros));
  EXPECT_EQ(store.BytesHeld(), zeros.size() + other.size());

  // A write that names a value not yet seen, or whose checksum is not the
  // shared value's, is refused with the rest.
  ReplicaStore empty;
  SmallReplicaWrites ahead = Small({&zeros, &zeros});
  ahead.items[1].value = 3;
  EXPECT_THAT(ApplySmallWrites(kInc, ahead, &empty),
              StatusIs(absl::StatusCode::kInvalidArgument, "value 3 after 1"));
  SmallReplicaWrites corrupt = Small({&zeros, &zeros});
  corrupt.items[1].value = 0;
  corrupt.items[1].checksum += 1;
  EXPECT_THAT(ApplySmallWrites(kInc, corrupt, &empty),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum mismatch"));
  EXPECT_TRUE(empty.List().empty());
}

TEST(ApplySmallWrites, Refusals_NothingApplied) {
  ReplicaStore store;
  const auto a = Bytes({1, 2});
  EXPECT_THAT(ApplySmallWrites(kInc, Small({&a}, kInc + 1), &store),
              StatusIs(absl::StatusCode::kAborted, "meant for incarnation 8"));
  struct Bad {
    const char* what;
    std::function<void(ReplicaWrite&)> spoil;
  };
  for (const Bad& bad : std::vector<Bad>{
           {"version", [](ReplicaWrite& w) { w.version = 0; }},
           {"fence", [](ReplicaWrite& w) { w.fence = 0; }},
           {"variable id 0", [](ReplicaWrite& w) { w.variable_id = 0; }},
           {"names no replica", [](ReplicaWrite& w) { w.replicas.clear(); }},
           {"repeated",
            [](ReplicaWrite& w) {
              w.replicas = {1, 1};
            }},
           {"negative",
            [](ReplicaWrite& w) {
              w.replicas = {0, -1};
            }},
       }) {
    SmallReplicaWrites writes = Small({&a, &a});
    bad.spoil(writes.items[1].write);
    EXPECT_THAT(ApplySmallWrites(kInc, writes, &store),
                StatusIs(absl::StatusCode::kInvalidArgument, bad.what));
  }
  SmallReplicaWrites short_value = Small({&a});
  short_value.items[0].bytes = std::span(a).first(4);
  EXPECT_THAT(ApplySmallWrites(kInc, short_value, &store),
              StatusIs(absl::StatusCode::kInvalidArgument));
  MemoryBudget budget(4, nullptr, "the worker's budget");
  EXPECT_THAT(ApplySmallWrites(kInc, Small({&a}), &store, &budget),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(store.List().empty());
  // The same writes, unspoiled, within a budget that holds them.
  MemoryBudget enough(8, nullptr, "the worker's budget");
  EXPECT_OK(ApplySmallWrites(kInc, Small({&a}), &store, &enough).status());
  EXPECT_EQ(enough.used(), 0u) << "the store holds the bytes now, not the budget";
  EXPECT_EQ(store.List().size(), 2u);
}

TEST(ReplicaWriteSession, DataPlaneMember_GetsTheRootsBytes_ChecksumVerified) {
  ThreadPool root_broadcasts(1);
  ReplicaStore store;
  FakeBroadcast plane;
  const auto a = Bytes({1, 2});
  ReplicaWriteHeader h = Header(1, a);
  h.write.collective = CollectiveSpec{"g", 1, 2, 0, 0, absl::Seconds(1)};
  plane.root = Bytes({9, 9});  // not what the header announced
  {
    ReplicaWriteSession session(kInc, &store, &plane, nullptr, &root_broadcasts);
    ASSERT_OK(session.OnHeader(h, {}));
    EXPECT_THAT(session.Finish(), StatusIs(absl::StatusCode::kDataLoss, "bad checksum"));
  }
  EXPECT_TRUE(store.List().empty());
  plane.root = a;
  ReplicaWriteSession session(kInc, &store, &plane, nullptr, &root_broadcasts);
  ASSERT_OK(session.OnHeader(h, {}));
  ASSERT_OK(session.Finish());
  EXPECT_EQ(store.Get(1, 0)->checksum, Checksum(a));
}

// The root's broadcast starts at the header and sends each part once the
// stream's chunks put it in place; a stream that ends early abandons it
// (its wait fails, nothing is applied).
TEST(ReplicaWriteSession, DataPlaneRoot_SendsAsChunksArrive_AStreamEndingEarlyAbandonsIt) {
  ThreadPool root_broadcasts(1);
  ReplicaStore store;
  FakeBroadcast plane;
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const auto a = Bytes(values);
  ReplicaWriteHeader h = Header(1, a);
  h.write.collective = CollectiveSpec{"g", 0, 3, 0, 0, absl::Seconds(5)};
  const std::span<const std::byte> first = std::span(a).first(a.size() / 2);
  const std::span<const std::byte> second = std::span(a).subspan(a.size() / 2);
  {
    ReplicaWriteSession session(kInc, &store, &plane, nullptr, &root_broadcasts);
    ASSERT_OK(session.OnHeader(h, {}));
    ASSERT_OK(Chunk(session, 0, first, Checksum(first)));
    EXPECT_THAT(session.Finish(), StatusIs(absl::StatusCode::kInvalidArgument, "truncated"));
  }
  EXPECT_THAT(plane.root_waited, StatusIs(absl::StatusCode::kAborted, "ended before"));
  EXPECT_TRUE(plane.sent == std::vector<std::byte>(first.begin(), first.end()));
  EXPECT_TRUE(store.List().empty());

  ReplicaWriteSession session(kInc, &store, &plane, nullptr, &root_broadcasts);
  ASSERT_OK(session.OnHeader(h, {}));
  ASSERT_OK(Chunk(session, 0, first, Checksum(first)));
  ASSERT_OK(Chunk(session, first.size(), second, Checksum(second)));
  ASSERT_OK(session.Finish());
  EXPECT_OK(plane.root_waited);
  EXPECT_TRUE(plane.sent == a);
  EXPECT_EQ(store.Get(1, 0)->checksum, Checksum(a));
}

TEST(StepWriteSession, OneStepPerStream) {
  ReplicaStore store;
  StepTable table(WorkerIdentity{"w", 0, kInc, {"TPU:0"}}, &store, nullptr, nullptr);
  StepWriteSession session(&table);
  const auto a = Bytes({1, 2});
  StepWriteHeader h;
  h.step = 3;
  h.epoch = 11;
  h.tensor = TensorHeader{TensorSpec{DType::kFloat32, {2}}, a.size(), Checksum(a)};
  ASSERT_OK(session.OnHeader(h, a));
  h.epoch = 12;
  EXPECT_THAT(session.OnHeader(h, a), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "one step write stream writes one step"));
}

}  // namespace
}  // namespace repvar::worker

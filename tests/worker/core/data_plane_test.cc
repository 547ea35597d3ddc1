// SPDX-License-Identifier: Apache-2.0
// The data plane's broadcast on real gloo over 127.0.0.1: members in
// threads of this process, their rendezvous through an in-memory store.
// Every member ends with the root's bytes and, as they passed, their
// checksum — down the pipelined chain (many pieces, the last one partial,
// a root in the middle of the ranks) and down gloo's tree (one piece).
#include "worker/core/data_plane.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"

namespace repvar::worker {
namespace {

class MemoryRendezvous final : public RendezvousClient {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto there = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.contains(key); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&there), timeout)) {
      return absl::DeadlineExceededError(key);
    }
    return values_[key];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

struct Outcome {
  absl::Status status;
  std::vector<std::byte> bytes;
  uint64_t received = 0;  // the checksum fed as the bytes came
};

// A root's bytes that arrive only when the broadcast asks for them: each
// Await copies them in up to `end`, so a piece sent before its Await would
// reach the others as zeros. Records the ends asked for.
class JustInTime final : public ArrivingBytes {
 public:
  JustInTime(const std::vector<std::byte>& source, std::span<std::byte> target)
      : source_(source), target_(target) {}
  absl::Status Await(size_t end) override {
    std::copy(source_.begin() + static_cast<ptrdiff_t>(filled_),
              source_.begin() + static_cast<ptrdiff_t>(end), target_.begin() + filled_);
    filled_ = std::max(filled_, end);
    ends.push_back(end);
    return absl::OkStatus();
  }
  std::vector<size_t> ends;

 private:
  const std::vector<std::byte>& source_;
  const std::span<std::byte> target_;
  size_t filled_ = 0;
};

// `members` data planes broadcast `root_bytes` from `root`, twice in one
// group (the second with the next tag), each in its own thread. With
// `just_in_time`, the root's bytes arrive as the broadcast asks for them
// (the ends it asked for, for the last broadcast, go there).
std::vector<Outcome> Broadcast(int members, int root, const std::vector<std::byte>& root_bytes,
                               DataPlaneOptions options,
                               std::vector<size_t>* just_in_time = nullptr) {
  MemoryRendezvous store;
  std::vector<Outcome> out(members);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < members; ++rank) {
    threads.emplace_back([&, rank] {
      GlooDataPlane plane("127.0.0.1", &store, options);
      for (uint32_t tag = 1; tag <= 2; ++tag) {
        CollectiveSpec c{"g1", rank, members, root, tag, absl::Seconds(30)};
        const bool arriving = rank == root && just_in_time != nullptr;
        out[rank].bytes =
            rank == root && !arriving ? root_bytes : std::vector<std::byte>(root_bytes.size());
        ChecksumStream received;
        JustInTime arrival(root_bytes, out[rank].bytes);
        out[rank].status =
            plane.Broadcast(c, out[rank].bytes, &received, arriving ? &arrival : nullptr);
        if (arriving) *just_in_time = arrival.ends;
        out[rank].received = received.Digest();
        if (!out[rank].status.ok()) return;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<std::byte> Pattern(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  return v;
}

void ExpectEveryMemberHolds(const std::vector<Outcome>& out, int root,
                            const std::vector<std::byte>& bytes) {
  for (size_t rank = 0; rank < out.size(); ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_OK(out[rank].status);
    EXPECT_TRUE(out[rank].bytes == bytes);
    if (static_cast<int>(rank) != root) {
      EXPECT_EQ(out[rank].received, Checksum(bytes));
    }
  }
}

// 64 KiB pieces, a chain from two of them.
constexpr DataPlaneOptions kSmallPieces{.piece_bytes = 64 << 10, .chain_min_pieces = 2};

TEST(GlooDataPlane, Broadcast_Chain_EveryMemberGetsTheRootsBytesAndTheirChecksum) {
  const auto bytes = Pattern((1 << 20) + 77);  // 17 pieces, the last of 77 bytes
  ASSERT_TRUE(GlooDataPlane("127.0.0.1", nullptr, kSmallPieces).Chained(bytes.size(), 4));
  ExpectEveryMemberHolds(Broadcast(4, /*root=*/2, bytes, kSmallPieces), 2, bytes);
}

// The root sends each piece only once its bytes are there (they may still
// be arriving from the coordinator): asked for piece by piece down the
// chain, all at once before the tree.
TEST(GlooDataPlane, Broadcast_RootSendsEachPieceOnceItHasArrived) {
  const auto bytes = Pattern((1 << 20) + 77);
  std::vector<size_t> ends;
  ExpectEveryMemberHolds(Broadcast(4, /*root=*/0, bytes, kSmallPieces, &ends), 0, bytes);
  ASSERT_EQ(ends.size(), 17u);
  EXPECT_EQ(ends.front(), size_t{64} << 10);
  EXPECT_EQ(ends.back(), bytes.size());
  const auto small = Pattern((40 << 10) + 3);
  ExpectEveryMemberHolds(Broadcast(4, /*root=*/3, small, kSmallPieces, &ends), 3, small);
  EXPECT_EQ(ends, std::vector<size_t>{small.size()});
}

// The chain cuts a value into about chain_pieces pieces of whole 64 KiB
// blocks, none under min_piece_bytes or over piece_bytes: a longer chain
// then costs a few piece times more than one link, not a few values.
TEST(GlooDataPlane, ChainPiece_AboutChainPiecesOfThem_WithinTheBounds) {
  const DataPlaneOptions defaults;
  ASSERT_EQ(defaults.chain_pieces, 64u);
  const GlooDataPlane plane("127.0.0.1", nullptr, defaults);
  EXPECT_EQ(plane.ChainPiece(size_t{64} << 20), size_t{1} << 20);
  EXPECT_EQ(plane.ChainPiece(size_t{100} << 20), size_t{25} << 16);  // 1.5625 MiB
  EXPECT_EQ(plane.ChainPiece((size_t{64} << 20) + 1), (size_t{1} << 20) + (64 << 10));
  EXPECT_EQ(plane.ChainPiece(size_t{5} << 20), defaults.min_piece_bytes);
  EXPECT_EQ(plane.ChainPiece(size_t{256} << 20), defaults.piece_bytes);
  EXPECT_EQ(plane.ChainPiece(size_t{1} << 30), defaults.piece_bytes);
  // A bound under the minimum is the bound.
  EXPECT_EQ(GlooDataPlane("127.0.0.1", nullptr, kSmallPieces).ChainPiece(size_t{64} << 20),
            kSmallPieces.piece_bytes);
}

// With the defaults, a value of a few MiB goes down the chain in pieces of
// min_piece_bytes, each sent by the root once it is there.
TEST(GlooDataPlane, Broadcast_Chain_DefaultOptions_CutIntoChainPieces) {
  const DataPlaneOptions defaults;
  const auto bytes = Pattern((size_t{5} << 20) + 77);  // 20 pieces of 256 KiB and 77 bytes
  ASSERT_TRUE(GlooDataPlane("127.0.0.1", nullptr, defaults).Chained(bytes.size(), 4));
  std::vector<size_t> ends;
  ExpectEveryMemberHolds(Broadcast(4, /*root=*/1, bytes, defaults, &ends), 1, bytes);
  ASSERT_EQ(ends.size(), 21u);
  EXPECT_EQ(ends.front(), defaults.min_piece_bytes);
  EXPECT_EQ(ends.back(), bytes.size());
}

TEST(GlooDataPlane, Broadcast_OnePiece_GoesDownTheTree_SameBytesAndChecksum) {
  const auto bytes = Pattern((40 << 10) + 3);  // 1 piece
  ASSERT_FALSE(GlooDataPlane("127.0.0.1", nullptr, kSmallPieces).Chained(bytes.size(), 4));
  ExpectEveryMemberHolds(Broadcast(4, /*root=*/1, bytes, kSmallPieces), 1, bytes);
}

// A member's reduction of one variable: `local` - `begin` is its
// contribution (twice when it holds two replicas), begin + sum / divisor
// the result. Records which elements it contributed and applied.
class RecordingReduction final : public FoldedReduction {
 public:
  RecordingReduction(DType dtype, std::vector<std::byte> begin, std::vector<std::byte> local,
                     int replicas, int64_t divisor)
      : dtype_(dtype),
        begin_(std::move(begin)),
        local_(std::move(local)),
        replicas_(replicas),
        divisor_(divisor),
        result_(begin_.size()),
        contributed_(elements(), 0),
        applied_(elements(), 0) {}

  AccumType type() const override { return AccumTypeFor(dtype_); }
  size_t elements() const override { return begin_.size() / item_size(); }
  size_t item_size() const override { return ItemSize(dtype_); }
  void Contribute(size_t lo, size_t hi, std::span<std::byte> acc) override {
    EXPECT_EQ(acc.size(), (hi - lo) * AccumSize(type()));
    for (int k = 0; k < replicas_; ++k) {
      AddDeltaRange(dtype_, begin_.data(), local_.data(), static_cast<int64_t>(lo),
                    static_cast<int64_t>(hi), acc.data(), k == 0);
    }
    if (replicas_ == 0) std::fill(acc.begin(), acc.end(), std::byte{0});
    for (size_t i = lo; i < hi; ++i) ++contributed_[i];
  }
  absl::Status Apply(size_t lo, size_t hi, std::span<const std::byte> sum) override {
    for (size_t i = lo; i < hi; ++i) ++applied_[i];
    return ApplyRange(dtype_, begin_.data(), sum.data(), divisor_, static_cast<int64_t>(lo),
                      static_cast<int64_t>(hi), result_.data());
  }
  std::span<std::byte> result() override { return result_; }

  const std::vector<std::byte>& bytes() const { return result_; }
  const std::vector<int>& contributed() const { return contributed_; }
  size_t applied() const { return std::count(applied_.begin(), applied_.end(), 1); }

 private:
  const DType dtype_;
  const std::vector<std::byte> begin_, local_;
  const int replicas_;
  const int64_t divisor_;
  std::vector<std::byte> result_;
  std::vector<int> contributed_, applied_;
};

// `n` elements of `dtype` from floats made of `seed`.
std::vector<std::byte> Values(DType dtype, size_t n, int seed) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>((i * 7 + seed * 13) % 101) / 8.0f - 6;
  Tensor t = *Tensor::ForOverwrite(TensorSpec{dtype, {static_cast<int64_t>(n)}});
  for (size_t i = 0; i < n; ++i) StoreElement(t, static_cast<int64_t>(i), f[i]);
  return {t.bytes.data(), t.bytes.data() + t.bytes.size()};
}

// The folded ring against Allreduce then Apply (the base ReduceApply, on
// the same data plane): `members` in threads, member m holding m % 3
// replicas (member 0 none: it contributes zeros but still applies its
// share). Every member ends with the same bits as the reference; each
// element's contribution is computed once per member and each element is
// applied by exactly one member.
constexpr DataPlaneOptions kRingOnly{.tree_max_bytes = 0};

void ExpectFoldedMatches(DType dtype, size_t n, int members, DataPlaneOptions options) {
  SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " x ", n, " among ", members));
  MemoryRendezvous store;
  const std::vector<std::byte> begin = Values(dtype, n, 1);
  int64_t divisor = 0;
  for (int m = 0; m < members; ++m) divisor += m % 3;
  std::vector<std::unique_ptr<RecordingReduction>> folded(members), reference(members);
  std::vector<absl::Status> folded_status(members), reference_status(members);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < members; ++rank) {
    folded[rank] = std::make_unique<RecordingReduction>(dtype, begin, Values(dtype, n, rank + 2),
                                                        rank % 3, divisor);
    reference[rank] = std::make_unique<RecordingReduction>(dtype, begin, Values(dtype, n, rank + 2),
                                                           rank % 3, divisor);
    threads.emplace_back([&, rank] {
      GlooDataPlane plane("127.0.0.1", &store, options);
      folded_status[rank] =
          plane.ReduceApply({"g1", rank, members, 0, 1, absl::Seconds(30)}, *folded[rank]);
      reference_status[rank] = plane.Collectives::ReduceApply(
          {"g1", rank, members, 0, 2, absl::Seconds(30)}, *reference[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  size_t applied = 0;
  for (int rank = 0; rank < members; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_OK(folded_status[rank]);
    ASSERT_OK(reference_status[rank]);
    EXPECT_TRUE(folded[rank]->bytes() == reference[rank]->bytes());
    EXPECT_TRUE(folded[rank]->bytes() == folded[0]->bytes());
    EXPECT_EQ(std::count(folded[rank]->contributed().begin(), folded[rank]->contributed().end(), 1),
              static_cast<ptrdiff_t>(n));
    applied += folded[rank]->applied();
    EXPECT_EQ(reference[rank]->applied(), n);  // the reference applies everything everywhere
  }
  EXPECT_EQ(applied, n);
}

// The ring, whatever the size.
void ExpectFoldedRingMatches(DType dtype, size_t n, int members) {
  ASSERT_FALSE(GlooDataPlane("127.0.0.1", nullptr, kRingOnly).Tree(AccumSize(AccumTypeFor(dtype))));
  ExpectFoldedMatches(dtype, n, members, kRingOnly);
}

// docs/contract.md S4 through the folded ring: two and four segments per member
// (the partial sums wait in a ring of slots), a partial last one, fewer
// elements than segments (some empty), float16 summed in float32 (the
// gathered values are half the bytes of the sums), float64.
TEST(GlooDataPlane, ReduceApply_FoldedRing_SameBitsAsAllreduceThenApply_EachSumAppliedOnce) {
  ASSERT_EQ(RingSegments(1000003, 4, 3), 6u);
  ExpectFoldedRingMatches(DType::kFloat32, 1000003, 3);
  ASSERT_EQ(RingSegments(2500007, 4, 3), 12u);  // 4 per member: the slots are reused
  ExpectFoldedRingMatches(DType::kFloat32, 2500007, 3);
  ExpectFoldedRingMatches(DType::kFloat32, 5, 4);
  ExpectFoldedRingMatches(DType::kFloat16, 100001, 4);
  ExpectFoldedRingMatches(DType::kBFloat16, 777, 2);
  ExpectFoldedRingMatches(DType::kFloat64, 300007, 5);
}

// docs/contract.md S4 through the tree a small reduction takes: powers of two and
// not, float16 summed in float32, float64, a single element. Member 0
// applies every element, and every member ends with its bits, the same as
// Allreduce then Apply.
TEST(GlooDataPlane, ReduceApply_SmallOnes_DownATree_SameBitsAsAllreduceThenApply) {
  const GlooDataPlane defaults("127.0.0.1", nullptr);
  ASSERT_TRUE(defaults.Tree(16000 * 4));  // 1,000 float32[16]
  ASSERT_FALSE(defaults.Tree(size_t{1} << 20));
  ExpectFoldedMatches(DType::kFloat32, 16000, 8, {});
  ExpectFoldedMatches(DType::kFloat32, 1001, 5, {});
  ExpectFoldedMatches(DType::kFloat32, 1, 3, {});
  ExpectFoldedMatches(DType::kFloat16, 777, 2, {});
  ExpectFoldedMatches(DType::kFloat64, 999, 7, {});
}

// Integers apply with a check that can fail (OUT_OF_RANGE): every member
// applies everything, so every member sees the same outcome.
TEST(GlooDataPlane, ReduceApply_Integers_EveryMemberAppliesEverything) {
  MemoryRendezvous store;
  const int members = 3;
  std::vector<std::unique_ptr<RecordingReduction>> r(members);
  std::vector<absl::Status> status(members);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < members; ++rank) {
    r[rank] = std::make_unique<RecordingReduction>(DType::kInt32, Values(DType::kInt32, 1001, 1),
                                                   Values(DType::kInt32, 1001, rank + 2), 1, 3);
    threads.emplace_back([&, rank] {
      GlooDataPlane plane("127.0.0.1", &store);
      status[rank] = plane.ReduceApply({"g1", rank, members, 0, 1, absl::Seconds(30)}, *r[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < members; ++rank) {
    ASSERT_OK(status[rank]);
    EXPECT_EQ(r[rank]->applied(), 1001u);
    EXPECT_TRUE(r[rank]->bytes() == r[0]->bytes());
  }
}

}  // namespace
}  // namespace repvar::worker

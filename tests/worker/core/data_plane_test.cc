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

TEST(GlooDataPlane, Broadcast_OnePiece_GoesDownTheTree_SameBytesAndChecksum) {
  const auto bytes = Pattern((40 << 10) + 3);  // 1 piece
  ASSERT_FALSE(GlooDataPlane("127.0.0.1", nullptr, kSmallPieces).Chained(bytes.size(), 4));
  ExpectEveryMemberHolds(Broadcast(4, /*root=*/1, bytes, kSmallPieces), 1, bytes);
}

}  // namespace
}  // namespace repvar::worker

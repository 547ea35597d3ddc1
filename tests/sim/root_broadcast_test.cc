// SPDX-License-Identifier: Apache-2.0
// The worker core's root broadcasts under the simulator's scheduler (no
// sleeps: simulated time passes only while every thread waits). A
// broadcast queued behind a stuck one keeps its own deadline, so stuck
// broadcasts cannot convoy (found by repvar-sim, seed 1616: after a
// coordinator restart every large write timed out for good, each root
// broadcast starting a whole timeout late behind the one before it).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/sync.h"
#include "common/base/thread_pool.h"
#include "sim/scheduler.h"
#include "tests/testing/status_matchers.h"
#include "worker/core/write_sessions.h"

namespace repvar::sim {
namespace {

using ::repvar::testing::StatusIs;
using worker::ReplicaWriteSession;

// A data plane whose collectives never complete: each waits out the
// timeout it is given.
class StuckPlane final : public worker::Collectives {
 public:
  absl::Status Broadcast(const CollectiveSpec& c, std::span<std::byte>, ChecksumStream*,
                         worker::ArrivingBytes*) override {
    MutexLock lock(&mu_);
    ++started_;
    auto never = [] { return false; };
    mu_.AwaitWithTimeout(absl::Condition(&never), c.timeout);
    return absl::UnavailableError("the other members never came");
  }
  absl::Status Allreduce(const CollectiveSpec&, AccumType, std::span<std::byte>) override {
    return absl::UnimplementedError("not used");
  }
  int started() {
    MutexLock lock(&mu_);
    return started_;
  }

 private:
  Mutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
};

ReplicaWriteHeader RootHeader(uint64_t id, const std::vector<std::byte>& bytes, uint32_t tag) {
  ReplicaWriteHeader h;
  h.incarnation = 7;
  h.write.variable_id = id;
  h.write.name = absl::StrCat("v", id);
  h.write.version = 3;
  h.write.fence = 1;
  h.write.replicas = {0};
  h.write.collective = CollectiveSpec{"g", 0, 2, 0, tag, absl::Seconds(30)};
  h.tensor = TensorHeader{TensorSpec{DType::kFloat32, {static_cast<int64_t>(bytes.size() / 4)}},
                          bytes.size(), Checksum(bytes)};
  return h;
}

TEST(RootBroadcastTest, QueuedBehindAStuckOne_FailsAtItsOwnDeadline_NotATimeoutLater) {
  Random random(1);
  Scheduler s(&random);
  const absl::Time start = s.Now();
  const ProcessId worker = s.NewProcess("worker");
  absl::Duration second_took;
  absl::Status second;
  int broadcasts_started = 0;
  s.Spawn(worker, "writes", [&] {
    ThreadPool root_broadcasts(1);  // one thread: the second waits for it
    worker::ReplicaStore store;
    StuckPlane plane;
    const std::vector<std::byte> bytes(16, std::byte{1});
    ReplicaWriteSession first(7, &store, &plane, nullptr, &root_broadcasts);
    ASSERT_OK(first.OnHeader(RootHeader(1, bytes, 0), bytes));
    ReplicaWriteSession queued(7, &store, &plane, nullptr, &root_broadcasts);
    ASSERT_OK(queued.OnHeader(RootHeader(2, bytes, 1), bytes));
    second = queued.Finish().status();
    second_took = s.Now() - start;
    EXPECT_THAT(first.Finish(), StatusIs(absl::StatusCode::kUnavailable));
    broadcasts_started = plane.started();
  });
  ASSERT_EQ(s.Run([] { return false; }, start + absl::Minutes(5)), Scheduler::Stop::kIdle);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kDeadlineExceeded, "for a data-plane thread"));
  EXPECT_EQ(second_took, absl::Seconds(30)) << "its own timeout, from its header";
  EXPECT_EQ(broadcasts_started, 1) << "the queued one never waited in a collective";
}

}  // namespace
}  // namespace repvar::sim

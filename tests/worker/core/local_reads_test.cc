// SPDX-License-Identifier: Apache-2.0
// C8 on the worker: when a value is readable from the local read table, and
// when not (worker/core/local_reads.h). No sockets: the table is heap memory
// read through the trainers' own reader.
#include "worker/core/local_reads.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace repvar::worker {
namespace {

std::shared_ptr<const Tensor> Value(float x) {
  return std::make_shared<const Tensor>(
      *Tensor::FromBytes(TensorSpec{DType::kFloat32, {}}, std::as_bytes(std::span(&x, 1))));
}
ReplicaWrite Fenced(int64_t version, float x, uint64_t fence) {
  ReplicaWrite w{7, "w", version, {0, 1}, Value(x)};
  w.fence = fence;
  return w;
}

class LocalReadsTest : public ::testing::Test {
 protected:
  LocalReadsTest()
      : region_(LocalReadTableBytes(16, 4096) / 8, 0),
        reads_(Region(), 16, &store_, [this] { return now_ns_; }),
        view_(*LocalReadView::Open(Region())) {
    store_.set_listener(&reads_);
  }
  std::span<std::byte> Region() {
    return {reinterpret_cast<std::byte*>(region_.data()), region_.size() * 8};
  }
  // The version a trainer reads locally; 0 when it is not served.
  int64_t ReadLocally() {
    LocalValue v;
    std::vector<std::byte> bytes;
    auto now = [this] { return now_ns_; };
    const auto outcome = view_.Read("w", now, v, bytes);
    return outcome == LocalReadView::Outcome::kServed ? v.version : 0;
  }
  // A heartbeat round answered with a lease of 3 s and `confirm` for each
  // value asked about.
  LocalReads::Round Heartbeat(bool confirm) {
    LocalReads::Round round = reads_.StartRound();
    reads_.Granted(round, absl::Seconds(3), std::vector<bool>(round.held.size(), confirm));
    return round;
  }

  std::vector<uint64_t> region_;
  int64_t now_ns_ = 1'000'000'000;
  ReplicaStore store_;
  LocalReads reads_;
  LocalReadView view_;
};

TEST_F(LocalReadsTest, C8_AppliedWrite_NotReadableUntilConfirmed) {
  ASSERT_OK(store_.Apply({Fenced(1, 1.0f, 10)}));
  EXPECT_EQ(ReadLocally(), 0);
  LocalReads::Round refused = Heartbeat(/*confirm=*/false);
  ASSERT_EQ(refused.held.size(), 1u);
  EXPECT_EQ(refused.held[0], (HeldValue{7, 0, 1, Value(1.0f)->checksum}));
  EXPECT_EQ(ReadLocally(), 0);
  Heartbeat(/*confirm=*/true);
  EXPECT_EQ(ReadLocally(), 1);
  EXPECT_EQ(reads_.to_confirm(), 0u);
  // The next write: not readable from the moment it is applied, before the
  // worker answers the coordinator.
  ASSERT_OK(store_.Apply({Fenced(2, 2.0f, 11)}));
  EXPECT_EQ(ReadLocally(), 0);
}

TEST_F(LocalReadsTest, C8_ConfirmedAfterANewerWriteLanded_NotPublished) {
  ASSERT_OK(store_.Apply({Fenced(1, 1.0f, 10)}));
  LocalReads::Round round = reads_.StartRound();  // asks about version 1
  ASSERT_OK(store_.Apply({Fenced(2, 2.0f, 11)}));
  reads_.Granted(round, absl::Seconds(3), {true});  // version 1 was committed
  EXPECT_EQ(ReadLocally(), 0);
  Heartbeat(true);
  EXPECT_EQ(ReadLocally(), 2);
}

TEST_F(LocalReadsTest, C8_LeaseRunsFromTheHeartbeatsSending_NotServedAfter) {
  ASSERT_OK(store_.Apply({Fenced(1, 1.0f, 10)}));
  LocalReads::Round round = reads_.StartRound();
  now_ns_ += 1'000'000'000;  // the answer comes a second later
  reads_.Granted(round, absl::Seconds(3), {true});
  EXPECT_EQ(ReadLocally(), 1);
  now_ns_ += 1'999'999'999;
  EXPECT_EQ(ReadLocally(), 1);
  now_ns_ += 1;  // 3 s after sending
  EXPECT_EQ(ReadLocally(), 0);
  // A heartbeat without a lease (a replica here fell behind) ends it now.
  now_ns_ -= 2'000'000'000;
  Heartbeat(true);
  EXPECT_EQ(ReadLocally(), 1);
  LocalReads::Round none = reads_.StartRound();
  reads_.Granted(none, absl::ZeroDuration(), {});
  EXPECT_EQ(ReadLocally(), 0);
}

TEST_F(LocalReadsTest, C8_StepSuspends_InstallResumes_UnresumedAreToConfirm) {
  ASSERT_OK(store_.Apply({Fenced(1, 1.0f, 10)}));
  Heartbeat(true);
  ASSERT_EQ(ReadLocally(), 1);
  reads_.Suspend();
  EXPECT_EQ(ReadLocally(), 0);
  // A step that changed nothing here: served again as before.
  reads_.Resume({}, {});
  EXPECT_EQ(ReadLocally(), 1);
  // The step committed version 2 and installed it (unfenced).
  reads_.Suspend();
  ASSERT_OK(store_.Apply({ReplicaWrite{7, "w", 2, {0, 1}, Value(5.0f)}}));
  EXPECT_EQ(ReadLocally(), 0);
  reads_.Resume({{7, 2, Value(4.0f)->checksum}}, {});  // not what the replica holds
  EXPECT_EQ(ReadLocally(), 0);
  EXPECT_EQ(reads_.to_confirm(), 1u);
  reads_.Suspend();
  reads_.Resume({{7, 2, Value(5.0f)->checksum}}, {});
  EXPECT_EQ(ReadLocally(), 2);
  EXPECT_EQ(reads_.to_confirm(), 0u);
  // Repaired here: asked about.
  reads_.Suspend();
  reads_.Resume({}, {7});
  EXPECT_EQ(ReadLocally(), 0);
  EXPECT_EQ(reads_.to_confirm(), 1u);
  Heartbeat(true);
  ASSERT_EQ(ReadLocally(), 2);
  reads_.Suspend();
  reads_.EndStep([] { return std::vector<uint64_t>{7}; });  // the resolution never came: ask
  EXPECT_EQ(ReadLocally(), 0);
  EXPECT_EQ(reads_.to_confirm(), 1u);
  // After a Resume, the end of the step changes nothing.
  Heartbeat(true);
  reads_.Suspend();
  reads_.Resume({}, {});
  reads_.EndStep([] { return std::vector<uint64_t>{7}; });
  EXPECT_EQ(ReadLocally(), 2);
}

TEST_F(LocalReadsTest, C8_WriteDuringAStep_NotReadableAfterIt) {
  ASSERT_OK(store_.Apply({Fenced(1, 1.0f, 10)}));
  Heartbeat(true);
  reads_.Suspend();
  ASSERT_OK(store_.Apply({Fenced(2, 2.0f, 11)}));  // a coordinator write, not the step
  reads_.Resume({}, {});
  EXPECT_EQ(ReadLocally(), 0);
  EXPECT_EQ(reads_.to_confirm(), 1u);
}

TEST_F(LocalReadsTest, C8_RegistrationLost_NothingReadable_EverythingAskedAgain) {
  ASSERT_OK(store_.Apply({Fenced(1, 1.0f, 10)}));
  Heartbeat(true);
  ASSERT_EQ(ReadLocally(), 1);
  reads_.Lost();
  EXPECT_EQ(ReadLocally(), 0);
  EXPECT_EQ(reads_.to_confirm(), 1u);
  Heartbeat(true);
  EXPECT_EQ(ReadLocally(), 1);
  store_.Drop(7);
  EXPECT_EQ(ReadLocally(), 0);
  EXPECT_EQ(reads_.to_confirm(), 0u);
}

}  // namespace
}  // namespace repvar::worker

// SPDX-License-Identifier: Apache-2.0
// The local read table (C8's mechanism): what is served and what is not.
#include "common/tensor/local_read_table.h"

#include <gtest/gtest.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace repvar {
namespace {

class LocalReadTableTest : public ::testing::Test {
 protected:
  LocalReadTableTest()
      : region_(LocalReadTableBytes(16, 4096) / 8 + 1, 0),
        table_(Region(), 16),
        view_(*LocalReadView::Open(Region())) {}

  std::span<std::byte> Region() {
    return {reinterpret_cast<std::byte*>(region_.data()), LocalReadTableBytes(16, 4096)};
  }
  static std::vector<std::byte> Floats(std::initializer_list<float> f) {
    std::vector<std::byte> b(f.size() * sizeof(float));
    std::memcpy(b.data(), std::data(f), b.size());
    return b;
  }
  bool Publish(uint64_t id, const std::string& name, int64_t version,
               const std::vector<std::byte>& b) {
    return table_.Publish(id, name, version,
                          TensorSpec{DType::kFloat32, {static_cast<int64_t>(b.size() / 4)}},
                          Checksum(b), b);
  }
  LocalReadView::Outcome Read(const std::string& name, int64_t now = 100) {
    return view_.Read(
        name, [now] { return now; }, got_, bytes_);
  }

  std::vector<uint64_t> region_;  // 8-aligned
  LocalReadTable table_;
  LocalReadView view_;
  LocalValue got_;
  std::vector<std::byte> bytes_;
};

TEST_F(LocalReadTableTest, C8_Published_ServedWithItsVersionBeforeTheLeaseEnds) {
  table_.SetLease(1000);
  ASSERT_TRUE(Publish(7, "model/w", 3, Floats({1, 2, 3, 4})));
  ASSERT_EQ(Read("model/w"), LocalReadView::Outcome::kServed);
  EXPECT_EQ(got_.version, 3);
  EXPECT_EQ(got_.spec, (TensorSpec{DType::kFloat32, {4}}));
  EXPECT_EQ(bytes_, Floats({1, 2, 3, 4}));
  // The next version in place.
  ASSERT_TRUE(Publish(7, "model/w", 4, Floats({5, 6, 7, 8})));
  ASSERT_EQ(Read("model/w"), LocalReadView::Outcome::kServed);
  EXPECT_EQ(got_.version, 4);
  EXPECT_EQ(bytes_, Floats({5, 6, 7, 8}));
}

TEST_F(LocalReadTableTest, C8_NoLeaseOrLeaseOver_NotServed) {
  ASSERT_TRUE(Publish(7, "model/w", 3, Floats({1})));
  EXPECT_EQ(Read("model/w"), LocalReadView::Outcome::kNoLease);  // never granted
  table_.SetLease(1000);
  EXPECT_EQ(Read("model/w", 999), LocalReadView::Outcome::kServed);
  EXPECT_EQ(Read("model/w", 1000), LocalReadView::Outcome::kNoLease);
}

TEST_F(LocalReadTableTest, C8_InvalidatedClearedOrUnknown_NotServed) {
  table_.SetLease(1000);
  ASSERT_TRUE(Publish(7, "a", 3, Floats({1})));
  ASSERT_TRUE(Publish(8, "b", 3, Floats({2})));
  EXPECT_EQ(Read("c"), LocalReadView::Outcome::kNotReadable);
  table_.Invalidate(7);
  EXPECT_EQ(Read("a"), LocalReadView::Outcome::kNotReadable);
  EXPECT_EQ(Read("b"), LocalReadView::Outcome::kServed);
  table_.Clear();
  EXPECT_EQ(table_.lease(), 0);
  table_.SetLease(1000);
  EXPECT_EQ(Read("b"), LocalReadView::Outcome::kNotReadable);
  EXPECT_FALSE(table_.Readable(8));
  // Published again after the clear: served.
  ASSERT_TRUE(Publish(8, "b", 4, Floats({3})));
  EXPECT_EQ(Read("b"), LocalReadView::Outcome::kServed);
}

TEST_F(LocalReadTableTest, C8_Suspended_NothingServedUntilResumed) {
  table_.SetLease(1000);
  ASSERT_TRUE(Publish(7, "a", 3, Floats({1})));
  ASSERT_TRUE(Publish(8, "b", 3, Floats({2})));
  table_.Suspend();
  EXPECT_EQ(Read("a"), LocalReadView::Outcome::kNotReadable);
  EXPECT_EQ(Read("b"), LocalReadView::Outcome::kNotReadable);
  // Slots change meanwhile; a clear keeps the suspension.
  ASSERT_TRUE(Publish(7, "a", 4, Floats({3})));
  EXPECT_EQ(Read("a"), LocalReadView::Outcome::kNotReadable);
  table_.Resume();
  ASSERT_EQ(Read("a"), LocalReadView::Outcome::kServed);
  EXPECT_EQ(got_.version, 4);
  ASSERT_EQ(Read("b"), LocalReadView::Outcome::kServed);
  EXPECT_EQ(got_.version, 3);
  table_.Suspend();
  table_.Clear();
  table_.SetLease(1000);
  ASSERT_TRUE(Publish(7, "a", 5, Floats({4})));
  EXPECT_EQ(Read("a"), LocalReadView::Outcome::kNotReadable);
  table_.Resume();
  EXPECT_EQ(Read("a"), LocalReadView::Outcome::kServed);
}

TEST_F(LocalReadTableTest, C8_ReadOverlappingASuspension_NotServedFromItsSnapshot) {
  table_.SetLease(1000);
  ASSERT_TRUE(Publish(7, "a", 3, Floats({1})));
  // Between the reader's snapshot (version 3) and its check of the epoch,
  // a step suspends the table, installs version 4 and resumes.
  int clock_reads = 0;
  auto now = [&] {
    if (clock_reads++ == 0) {
      table_.Suspend();
      EXPECT_TRUE(Publish(7, "a", 4, Floats({2})));
      table_.Resume();
    }
    return int64_t{100};
  };
  ASSERT_EQ(view_.Read("a", now, got_, bytes_), LocalReadView::Outcome::kServed);
  EXPECT_EQ(got_.version, 4);
  EXPECT_EQ(bytes_, Floats({2}));
  EXPECT_EQ(clock_reads, 2);
}

TEST_F(LocalReadTableTest, C8_SlotBeingWritten_NotServed) {
  table_.SetLease(1000);
  ASSERT_TRUE(Publish(7, "a", 3, Floats({1})));
  // A writer stopped half way: the slot's seq is odd.
  auto* slot = reinterpret_cast<LocalReadSlot*>(Region().data() + sizeof(LocalReadHeader));
  for (int i = 0; i < 16; ++i) {
    if (slot[i].name_hash.load() != 0) slot[i].seq.fetch_add(1);
  }
  EXPECT_EQ(Read("a"), LocalReadView::Outcome::kBusy);
}

TEST_F(LocalReadTableTest, C8_BytesThatFailTheChecksum_NotServed) {
  table_.SetLease(1000);
  ASSERT_TRUE(
      table_.Publish(7, "a", 3, TensorSpec{DType::kFloat32, {1}}, /*checksum=*/12345, Floats({1})));
  EXPECT_EQ(Read("a"), LocalReadView::Outcome::kBusy);
}

TEST_F(LocalReadTableTest, C8_TooLargeOrNoRoom_NotKept) {
  table_.SetLease(1000);
  std::vector<std::byte> big(kLocalReadMaxValueBytes + 4);
  EXPECT_FALSE(table_.Publish(1, "big", 1, TensorSpec{DType::kFloat32, {int64_t(big.size())}},
                              Checksum(big), big));
  std::vector<std::byte> kib(1024);
  int kept = 0;
  for (int i = 0; i < 16; ++i) {
    kept += table_.Publish(10 + i, absl::StrCat("v", i), 1, TensorSpec{DType::kFloat32, {256}},
                           Checksum(kib), kib);
  }
  EXPECT_LT(kept, 16);  // 4 KiB of arena
  EXPECT_GT(kept, 0);
  EXPECT_EQ(Read("v0"), LocalReadView::Outcome::kServed);
  EXPECT_EQ(Read("v15"), LocalReadView::Outcome::kNotReadable);
}

TEST_F(LocalReadTableTest, C8_ARegionThatIsNotATable_Refused) {
  std::vector<uint64_t> zeros(64, 0);
  EXPECT_EQ(LocalReadView::Open(std::as_bytes(std::span(zeros))).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(LocalReadView::Open(Region().first(LocalReadTableBytes(16, 4096) - 8)).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace repvar

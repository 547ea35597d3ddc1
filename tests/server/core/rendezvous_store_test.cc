// SPDX-License-Identifier: Apache-2.0
#include "server/core/rendezvous_store.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace repvar::server {
namespace {

using ::repvar::testing::StatusIs;

TEST(RendezvousStoreTest, SetThenGet_GetWaitsUntilDeadline_DeletePrefix) {
  RendezvousStore store;
  EXPECT_THAT(store.Get("g1/rank0", absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_OK(store.Set("g1/rank0", "addr"));
  ASSERT_OK(store.Set("g2/rank0", "addr2"));
  EXPECT_EQ(*store.Get("g1/rank0", absl::InfinitePast()), "addr");
  EXPECT_THAT(store.Set("", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store.Set("k", std::string(70000, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  store.DeletePrefix("g1/");
  EXPECT_EQ(store.size(), 1u);
}

// Bounded: the issue found 4.2 GiB of never-expiring values at the old key
// cap. Now entries expire, and total bytes are capped below that by 64x.
TEST(RendezvousStoreTest, EntriesExpire_TotalBytesBounded_LongKeysRefused) {
  repvar::testing::FakeClock clock;
  RendezvousStore store(&clock, absl::Minutes(10));
  ASSERT_OK(store.Set("g/rank0", "addr"));
  clock.Advance(absl::Minutes(11));
  EXPECT_THAT(store.Get("g/rank0", absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(store.Set(std::string(600, 'k'), "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string value(RendezvousStore::kMaxValueBytes, 'v');
  int stored = 0;
  absl::Status s;
  while ((s = store.Set(absl::StrCat("big/", stored), value)).ok()) ++stored;
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "full"));
  EXPECT_LE(uint64_t(stored) * value.size(), RendezvousStore::kMaxTotalBytes);
  EXPECT_GT(stored, 900);
  // Overwriting a key in place still fits; once they expire there is room.
  ASSERT_OK(store.Set("big/0", value));
  clock.Advance(absl::Minutes(11));
  ASSERT_OK(store.Set("fresh", value));
  EXPECT_EQ(store.size(), 1u);
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "server/core/rendezvous_store.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace repvar::server

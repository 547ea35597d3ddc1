// SPDX-License-Identifier: Apache-2.0
// Memory lent to requests: a connection's share is bounded by its own
// capacity and by the daemon's; refusals take nothing; releases return to
// both.
#include "common/base/memory_budget.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>

#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(MemoryBudgetTest, ConnectionShare_BoundedByItsOwnAndTheDaemonsCapacity) {
  MemoryBudget daemon(100);
  ConnectionBudgets connections(&daemon, 60);
  auto a = connections.For("ipv4:127.0.0.1:1000");
  auto b = connections.For("ipv4:127.0.0.1:2000");
  EXPECT_EQ(connections.For("ipv4:127.0.0.1:1000"), a) << "one budget per connection";

  ASSERT_OK(a->Charge(50, "a"));
  EXPECT_THAT(a->Charge(20, "a's second tensor"),
              StatusIs(absl::StatusCode::kResourceExhausted, "connection ipv4:127.0.0.1:1000"));
  EXPECT_EQ(a->used(), 50u);  // the refusal took nothing
  EXPECT_EQ(daemon.used(), 50u);
  ASSERT_OK(b->Charge(40, "b"));  // another connection still may, up to the daemon's capacity
  EXPECT_THAT(b->Charge(20, "b's second tensor"),
              StatusIs(absl::StatusCode::kResourceExhausted, "this daemon lends"));
  EXPECT_EQ(b->used(), 40u);  // nor did the daemon's refusal
  EXPECT_EQ(daemon.used(), 90u);

  a->Release(50);
  EXPECT_EQ(daemon.used(), 40u);
  ASSERT_OK(b->Charge(20, "b's second tensor"));
  b->Release(60);
  EXPECT_EQ(daemon.used(), 0u);
}

TEST(MemoryBudgetTest, ConnectionBudget_ForgottenWhenNothingHoldsIt) {
  MemoryBudget daemon(100);
  ConnectionBudgets connections(&daemon, 60);
  std::weak_ptr<MemoryBudget> first = connections.For("ipv4:127.0.0.1:1000");
  EXPECT_TRUE(first.expired());
  auto again = connections.For("ipv4:127.0.0.1:1000");
  ASSERT_OK(again->Charge(60, "x"));
  again->Release(60);
}

// In a container the default budget follows the cgroup's limit, not the
// node's memory: a limit is read from either cgroup version's file, and
// "no limit" in either spelling leaves the machine's memory.
TEST(MemoryBudgetTest, DefaultCapacity_FollowsTheCgroupLimit) {
  EXPECT_EQ(MemoryBudget::ParseCgroupMemoryLimit("8589934592\n"), uint64_t{8} << 30);
  EXPECT_EQ(MemoryBudget::ParseCgroupMemoryLimit("max\n"), std::nullopt);
  EXPECT_EQ(MemoryBudget::ParseCgroupMemoryLimit("9223372036854771712"), std::nullopt);  // v1
  EXPECT_EQ(MemoryBudget::ParseCgroupMemoryLimit(""), std::nullopt);
  EXPECT_EQ(MemoryBudget::ParseCgroupMemoryLimit("12k"), std::nullopt);
  const uint64_t half = MemoryBudget::HalfOfMemoryLimit();
  EXPECT_GT(half, 0u);
  EXPECT_LE(half, static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                      static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 2);
}

}  // namespace
}  // namespace repvar

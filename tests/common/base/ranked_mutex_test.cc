// SPDX-License-Identifier: Apache-2.0
// The lock-order check: taking locks in rank order works; against it, the
// process dies naming both locks.
#include "common/base/ranked_mutex.h"

#include <gtest/gtest.h>

namespace repvar {
namespace {

TEST(RankedMutex, AscendingRanks_Allowed) {
  RankedMutex outer(10, "outer");
  RankedMutex inner(20, "inner");
  RankedLock a(&outer);
  RankedLock b(&inner);
  SUCCEED();
}

TEST(RankedMutex, ReleasedLocksDoNotCount) {
  RankedMutex low(10, "low");
  RankedMutex high(20, "high");
  { RankedLock h(&high); }
  RankedLock l(&low);  // high was released: no violation
  SUCCEED();
}

TEST(RankedMutexDeathTest, DescendingRanks_CrashNamingBothLocks) {
  RankedMutex outer(10, "StepCoordinator::mu_");
  RankedMutex inner(20, "Registry::mu_");
  EXPECT_DEATH(
      {
        RankedLock a(&inner);
        RankedLock b(&outer);
      },
      "taking StepCoordinator::mu_ \\(rank 10\\) while holding Registry::mu_ \\(rank 20\\)");
}

TEST(RankedMutexDeathTest, EqualRanks_Crash) {
  RankedMutex a(10, "a");
  RankedMutex b(10, "b");
  EXPECT_DEATH(
      {
        RankedLock la(&a);
        RankedLock lb(&b);
      },
      "lock order violation: taking b");
}

TEST(RankedMutexDeathTest, UnrankedOuterLockUnderARankedOne_Crashes) {
  RankedMutex ranked(10, "Registry::mu_");
  RankedMutex::AssertNoneHeld("variable write locks");  // nothing held: fine
  EXPECT_DEATH(
      {
        RankedLock l(&ranked);
        RankedMutex::AssertNoneHeld("variable write locks");
      },
      "taking variable write locks while holding Registry::mu_");
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// The client's retry policy, on a fake clock: UNAVAILABLE is retried with a
// doubling backoff capped at 2 s; every other code is final at once.
#include "client/retry.h"

#include <gtest/gtest.h>

#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace repvar::client_internal {
namespace {

using ::repvar::testing::StatusIs;

TEST(RetryPolicy, Unavailable_RetriedWithDoublingBackoffCappedAtTwoSeconds) {
  repvar::testing::FakeClock clock;
  RetryPolicy retry(8, absl::Milliseconds(500), &clock);
  const absl::Time start = clock.Now();
  std::vector<absl::Duration> at;
  absl::Status s = retry.Run([&] {
    at.push_back(clock.Now() - start);
    return absl::UnavailableError("down");
  });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "down"));
  ASSERT_EQ(at.size(), 8u);
  EXPECT_EQ(at[1], absl::Milliseconds(500));
  EXPECT_EQ(at[2], absl::Milliseconds(1500));
  EXPECT_EQ(at[3], absl::Milliseconds(3500));
  EXPECT_EQ(at[4] - at[3], absl::Seconds(2)) << "capped";
  EXPECT_EQ(clock.Now() - start, at.back()) << "no wait after the last attempt";
}

TEST(RetryPolicy, OtherCodes_NotRetried_SuccessEnds) {
  repvar::testing::FakeClock clock;
  RetryPolicy retry(5, absl::Milliseconds(50), &clock);
  int calls = 0;
  EXPECT_THAT(retry.Run([&] {
    ++calls;
    return absl::AbortedError("stale");
  }),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(calls, 1);
  calls = 0;
  EXPECT_OK(
      retry.Run([&] { return ++calls < 3 ? absl::UnavailableError("x") : absl::OkStatus(); }));
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace repvar::client_internal

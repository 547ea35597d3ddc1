// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_CLIENT_RETRY_H_
#define REPVAR_CLIENT_RETRY_H_

#include <algorithm>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace repvar::client_internal {

// How the client retries: only UNAVAILABLE (the call did not happen or its
// answer was lost), with exponential backoff from `initial_backoff`, capped
// at 2 s, at most `max_attempts` times. Only operations that are safe to
// repeat go through it: reads, and writes that carry one request id for all
// their attempts (C6). Time passes through `clock`. Thread-compatible.
class RetryPolicy {
 public:
  RetryPolicy(int max_attempts, absl::Duration initial_backoff, Clock* clock)
      : max_attempts_(std::max(1, max_attempts)),
        initial_backoff_(initial_backoff),
        clock_(clock) {}

  // Runs `attempt` until it succeeds, fails with a code other than
  // UNAVAILABLE, or runs out of attempts; returns its last status.
  template <typename F>
  absl::Status Run(F&& attempt) const {
    absl::Duration backoff = initial_backoff_;
    absl::Status s;
    for (int i = 0; i < max_attempts_; ++i) {
      s = attempt();
      if (!absl::IsUnavailable(s) || i + 1 == max_attempts_) return s;
      clock_->SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
    }
    return s;
  }

 private:
  const int max_attempts_;
  const absl::Duration initial_backoff_;
  Clock* const clock_;
};

}  // namespace repvar::client_internal

#endif  // REPVAR_CLIENT_RETRY_H_

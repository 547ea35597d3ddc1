// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_BASE_CLOCK_H_
#define REPVAR_COMMON_BASE_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace repvar {

// Anything that reads time or waits for it to pass takes a Clock*, so tests
// can drive time by hand (tests/testing/fake_clock.h).
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Lets `d` pass (a retry's backoff); a fake clock just moves on.
  virtual void SleepFor(absl::Duration d) = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
  static Clock* Get() {
    static RealClock clock;
    return &clock;
  }
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_CLOCK_H_

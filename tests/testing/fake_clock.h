// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_TESTS_TESTING_FAKE_CLOCK_H_
#define REPVAR_TESTS_TESTING_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"

namespace repvar::testing {

// Time moves only when the test says so.
class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void SleepFor(absl::Duration d) override { Advance(d); }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_FAKE_CLOCK_H_

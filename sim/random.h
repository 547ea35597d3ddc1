// SPDX-License-Identifier: Apache-2.0
// The simulator's one source of chance: xoshiro256** seeded by splitmix64,
// with the few draws the simulator makes defined here (the standard
// library's distributions differ between implementations; these do not).
#ifndef REPVAR_SIM_RANDOM_H_
#define REPVAR_SIM_RANDOM_H_

#include <cstdint>

#include "absl/numeric/int128.h"
#include "absl/time/time.h"

namespace repvar::sim {

class Random {
 public:
  explicit Random(uint64_t seed) {
    for (uint64_t& s : s_) {
      seed += 0x9e3779b97f4a7c15;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
      z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
      s = z ^ (z >> 31);
    }
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n); 0 when n is 0. (Lemire's multiply; the bias is below
  // 2^-32 for the sizes drawn here.)
  uint64_t Uniform(uint64_t n) { return absl::Uint128High64(absl::uint128(Next()) * n); }
  // Uniform in [lo, hi].
  int64_t Between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Uniform(static_cast<uint64_t>(hi - lo) + 1));
  }
  // True with probability p.
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  // Uniform in [lo, hi], to the microsecond.
  absl::Duration Between(absl::Duration lo, absl::Duration hi) {
    return absl::Microseconds(
        Between(absl::ToInt64Microseconds(lo), absl::ToInt64Microseconds(hi)));
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_RANDOM_H_

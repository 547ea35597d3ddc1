// SPDX-License-Identifier: Apache-2.0
// A linearizability checker for one variable's history (Wing & Gong's
// search with Lowe's memoization, as Porcupine does it): is there an order of
// the operations, each placed between its call and its return, in which
// every answer is what a single register would have given? Operations whose
// outcome is unknown (an error, a timeout: they may or may not have taken
// effect) may be placed anywhere after their call, or at the very end, where
// they change nothing anyone saw.
//
// The register is a variable as the coordinator keeps it: a committed
// (version, value); Assign sets the value, Add adds to it elementwise, each
// making version + 1; Read returns it. Answers carry the version and the
// checksum of the value (XXH3-64 of its bytes), so a stale read, a lost or
// doubled write or a version that went back all fail the check.
#ifndef REPVAR_SIM_LINEARIZABILITY_H_
#define REPVAR_SIM_LINEARIZABILITY_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"

namespace repvar::sim {

struct RegisterState {
  int64_t version = 0;
  std::vector<float> value;
};

struct RegisterOp {
  enum class Kind { kAssign, kAdd, kRead };
  Kind kind = Kind::kRead;
  std::vector<float> arg;  // Assign: the value; Add: the delta
  int64_t call = 0;        // when it was called (any monotonic clock)
  // When it returned; kNever when the outcome is unknown.
  int64_t ret = kNever;
  // The answer, when known (ret != kNever).
  int64_t version = 0;
  uint64_t checksum = 0;

  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
};

// OK when `history` (in any order) is linearizable from `initial`; else
// FAILED_PRECONDITION naming the operations no order could explain.
absl::Status CheckLinearizable(const std::vector<RegisterOp>& history,
                               const RegisterState& initial);

// The checksum the register's answers carry for `value`.
uint64_t ChecksumOf(const std::vector<float>& value);

}  // namespace repvar::sim

#endif  // REPVAR_SIM_LINEARIZABILITY_H_

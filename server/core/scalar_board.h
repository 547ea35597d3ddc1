// SPDX-License-Identifier: Apache-2.0
// Scalars training scripts publish for people to watch (the web view's loss
// curve): Client::PublishScalar(name, step, value). Kept in memory only, by
// design: a point is telemetry, not state -- syncing it would put an fsync
// in every training step for a picture -- so a coordinator restart starts
// every curve empty, and the answer to a publish promises nothing more than
// that the point is on the board.
//
// Every trainer of a data-parallel job publishes its own loss for the same
// step: the board keeps, per (name, step), the mean of what was published
// and how many values it is the mean of. Bounded: at most kMaxSeries names
// (a new one beyond them is refused) and kMaxPoints steps per name; a full
// series drops every other point it holds (the oldest half keeps its
// shape at half the density), so a run of any length stays a whole curve.
// Thread-safe.
#ifndef REPVAR_SERVER_CORE_SCALAR_BOARD_H_
#define REPVAR_SERVER_CORE_SCALAR_BOARD_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/base/sync.h"

namespace repvar::server {

// One value a trainer publishes.
struct ScalarSample {
  std::string name;
  int64_t step = 0;
  double value = 0;
};
struct ScalarPoint {
  int64_t step = 0;
  double value = 0;   // the mean of what was published for this step
  int64_t count = 0;  // how many values that is
};
struct ScalarSeries {
  std::string name;
  std::vector<ScalarPoint> points;  // by step
};

class ScalarBoard {
 public:
  static constexpr size_t kMaxSeries = 64;
  static constexpr size_t kMaxPoints = 2048;
  static constexpr size_t kMaxNameBytes = 128;

  // Adds each sample's value at its step of its series, all or none. Any
  // double is kept (a NaN loss is worth seeing); the step's mean then is
  // NaN too. Errors, changing nothing: INVALID_ARGUMENT (a name that is
  // empty, longer than kMaxNameBytes, or not of [A-Za-z0-9_./:-]; a
  // negative step), RESOURCE_EXHAUSTED (new names beyond kMaxSeries).
  absl::Status Publish(const std::vector<ScalarSample>& samples) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Publish(absl::string_view name, int64_t step, double value) {
    return Publish({ScalarSample{std::string(name), step, value}});
  }

  // Every series, by name.
  std::vector<ScalarSeries> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Sum {
    double sum = 0;
    int64_t count = 0;
  };
  mutable Mutex mu_;
  std::map<std::string, std::map<int64_t, Sum>, std::less<>> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_SCALAR_BOARD_H_

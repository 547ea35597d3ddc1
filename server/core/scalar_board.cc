// SPDX-License-Identifier: Apache-2.0
#include "server/core/scalar_board.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace repvar::server {
namespace {

bool IsScalarName(absl::string_view name) {
  if (name.empty() || name.size() > ScalarBoard::kMaxNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' &&
        c != ':' && c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status ScalarBoard::Publish(const std::vector<ScalarSample>& samples) {
  for (const ScalarSample& sample : samples) {
    if (!IsScalarName(sample.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scalar name must be 1-", kMaxNameBytes, " characters of [A-Za-z0-9_./:-], got \"",
          absl::string_view(sample.name).substr(0, 200), "\""));
    }
    if (sample.step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("scalar step must be >= 0, got ", sample.step, " for ", sample.name));
    }
  }
  MutexLock lock(&mu_);
  std::set<absl::string_view> added;
  for (const ScalarSample& sample : samples) {
    if (series_.find(sample.name) != series_.end()) continue;
    if (added.insert(sample.name).second && series_.size() + added.size() > kMaxSeries) {
      return absl::ResourceExhaustedError(absl::StrCat("the board holds ", kMaxSeries,
                                                       " scalar series at most; \"", sample.name,
                                                       "\" would be one more"));
    }
  }
  for (const ScalarSample& sample : samples) {
    std::map<int64_t, Sum>& points = series_[sample.name];
    Sum& sum = points[sample.step];
    sum.sum += sample.value;
    ++sum.count;
    if (points.size() > kMaxPoints) {
      // Every other point goes; the first and the newest stay.
      bool drop = points.size() % 2 == 0;
      for (auto p = points.begin(); p != points.end();) {
        p = drop ? points.erase(p) : std::next(p);
        drop = !drop;
      }
    }
  }
  return absl::OkStatus();
}

std::vector<ScalarSeries> ScalarBoard::Snapshot() const {
  MutexLock lock(&mu_);
  std::vector<ScalarSeries> out;
  out.reserve(series_.size());
  for (const auto& [name, points] : series_) {
    ScalarSeries& s = out.emplace_back();
    s.name = name;
    s.points.reserve(points.size());
    for (const auto& [step, sum] : points) {
      s.points.push_back({step, sum.sum / static_cast<double>(sum.count), sum.count});
    }
  }
  return out;
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "common/model/index_ranges.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace repvar {
namespace {

// Merges two range lists with `keep(in_a, in_b)` deciding membership.
template <typename Keep>
std::vector<uint32_t> Combine(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b,
                              Keep keep) {
  // The points where either set changes, in order.
  std::vector<uint32_t> cuts(a);
  cuts.insert(cuts.end(), b.begin(), b.end());
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<uint32_t> out;
  size_t ia = 0, ib = 0;  // the next bound of each at or after the cut
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    const uint32_t lo = cuts[c], hi = cuts[c + 1];
    while (ia < a.size() && a[ia] <= lo) ++ia;
    while (ib < b.size() && b[ib] <= lo) ++ib;
    // Inside a range when an odd number of bounds lie at or below lo.
    if (!keep(ia % 2 == 1, ib % 2 == 1)) continue;
    if (!out.empty() && out.back() == lo) {
      out.back() = hi;
    } else {
      out.push_back(lo);
      out.push_back(hi);
    }
  }
  return out;
}

}  // namespace

IndexRanges IndexRanges::All(uint32_t n) {
  IndexRanges r;
  if (n > 0) r.bounds_ = {0, n};
  return r;
}

absl::StatusOr<IndexRanges> IndexRanges::FromBounds(std::vector<uint32_t> bounds, uint32_t limit) {
  if (bounds.size() % 2 != 0) {
    return absl::InvalidArgumentError("index ranges come as (begin, end) pairs");
  }
  for (size_t i = 0; i < bounds.size(); i += 2) {
    const bool after_previous = i == 0 || bounds[i] > bounds[i - 1];
    if (bounds[i] >= bounds[i + 1] || bounds[i + 1] > limit || !after_previous) {
      return absl::InvalidArgumentError(
          absl::StrCat("index ranges must be non-empty, sorted, apart and below ", limit,
                       "; range ", i / 2, " is [", bounds[i], ", ", bounds[i + 1], ")"));
    }
  }
  IndexRanges r;
  r.bounds_ = std::move(bounds);
  return r;
}

void IndexRanges::Append(uint32_t i) {
  if (!bounds_.empty() && bounds_.back() == i) {
    ++bounds_.back();
    return;
  }
  bounds_.push_back(i);
  bounds_.push_back(i + 1);
}

bool IndexRanges::Contains(uint32_t i) const {
  // The first bound above i: inside when it is an end.
  auto at = std::upper_bound(bounds_.begin(), bounds_.end(), i);
  return (at - bounds_.begin()) % 2 == 1;
}

size_t IndexRanges::count() const {
  size_t n = 0;
  for (size_t r = 0; r < bounds_.size(); r += 2) n += bounds_[r + 1] - bounds_[r];
  return n;
}

IndexRanges IndexRanges::Union(const IndexRanges& other) const {
  if (other.bounds_ == bounds_ || other.empty()) return *this;
  if (empty()) return other;
  return IndexRanges(Combine(bounds_, other.bounds_, [](bool a, bool b) { return a || b; }));
}

IndexRanges IndexRanges::Minus(const IndexRanges& other) const {
  if (other.bounds_ == bounds_) return IndexRanges();
  return IndexRanges(Combine(bounds_, other.bounds_, [](bool a, bool b) { return a && !b; }));
}

IndexRanges IndexRanges::Intersect(const IndexRanges& other) const {
  if (other.bounds_ == bounds_) return *this;
  return IndexRanges(Combine(bounds_, other.bounds_, [](bool a, bool b) { return a && b; }));
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// A set of layout indices (positions in a step's variables) as sorted,
// disjoint, non-touching half-open ranges: what a step's messages name
// instead of listing variables, so that "every variable changed" is one
// range however many variables there are.
#ifndef REPVAR_COMMON_MODEL_INDEX_RANGES_H_
#define REPVAR_COMMON_MODEL_INDEX_RANGES_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace repvar {

class IndexRanges {
 public:
  IndexRanges() = default;
  // [0, n).
  static IndexRanges All(uint32_t n);
  // From flat (begin, end) pairs as they travel; every index below `limit`.
  // INVALID_ARGUMENT: odd count, empty, unsorted, overlapping or touching
  // ranges, or an index at or past `limit`.
  static absl::StatusOr<IndexRanges> FromBounds(std::vector<uint32_t> bounds, uint32_t limit);

  // Adds `i`, which is above every index already in (building in order).
  void Append(uint32_t i);
  bool Contains(uint32_t i) const;
  bool empty() const { return bounds_.empty(); }
  size_t count() const;
  // The flat (begin, end) pairs.
  const std::vector<uint32_t>& bounds() const { return bounds_; }
  template <typename F>
  void ForEach(F f) const {
    for (size_t r = 0; r < bounds_.size(); r += 2) {
      for (uint32_t i = bounds_[r]; i < bounds_[r + 1]; ++i) f(i);
    }
  }
  IndexRanges Union(const IndexRanges& other) const;
  IndexRanges Minus(const IndexRanges& other) const;
  IndexRanges Intersect(const IndexRanges& other) const;
  bool IsSubsetOf(const IndexRanges& other) const { return Minus(other).empty(); }

  friend bool operator==(const IndexRanges&, const IndexRanges&) = default;

 private:
  explicit IndexRanges(std::vector<uint32_t> bounds) : bounds_(std::move(bounds)) {}

  std::vector<uint32_t> bounds_;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_INDEX_RANGES_H_

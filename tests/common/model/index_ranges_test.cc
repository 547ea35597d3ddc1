// SPDX-License-Identifier: Apache-2.0
#include "common/model/index_ranges.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace repvar {
namespace {

std::set<uint32_t> Members(const IndexRanges& r) {
  std::set<uint32_t> out;
  r.ForEach([&](uint32_t i) { out.insert(i); });
  return out;
}

IndexRanges Of(const std::set<uint32_t>& members) {
  IndexRanges r;
  for (uint32_t i : members) r.Append(i);
  return r;
}

TEST(IndexRanges, AppendMergesNeighbours_ContainsAndCount) {
  IndexRanges r;
  for (uint32_t i : {0u, 1u, 2u, 5u, 7u, 8u}) r.Append(i);
  EXPECT_EQ(r.bounds(), (std::vector<uint32_t>{0, 3, 5, 6, 7, 9}));
  EXPECT_EQ(r.count(), 6u);
  EXPECT_TRUE(r.Contains(0));
  EXPECT_TRUE(r.Contains(2));
  EXPECT_FALSE(r.Contains(3));
  EXPECT_TRUE(r.Contains(5));
  EXPECT_FALSE(r.Contains(6));
  EXPECT_TRUE(r.Contains(8));
  EXPECT_FALSE(r.Contains(9));
  EXPECT_EQ(IndexRanges::All(10000).bounds(), (std::vector<uint32_t>{0, 10000}));
  EXPECT_TRUE(IndexRanges::All(0).empty());
}

TEST(IndexRanges, FromBounds_RefusesWhatIsNotSortedDisjointPairsBelowTheLimit) {
  EXPECT_TRUE(IndexRanges::FromBounds({0, 3, 5, 9}, 9).ok());
  EXPECT_TRUE(IndexRanges::FromBounds({}, 0).ok());
  for (std::vector<uint32_t> bad : std::vector<std::vector<uint32_t>>{
           {0}, {3, 3}, {4, 2}, {0, 3, 3, 5}, {0, 3, 2, 5}, {5, 6, 0, 1}, {0, 10}}) {
    EXPECT_EQ(IndexRanges::FromBounds(bad, 9).status().code(), absl::StatusCode::kInvalidArgument)
        << bad.size();
  }
}

// Set algebra against std::set on random sets.
TEST(IndexRanges, UnionMinusIntersect_MatchSetAlgebra) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::set<uint32_t> a, b;
    for (uint32_t i = 0; i < 40; ++i) {
      if (rng() % 3 == 0) a.insert(i);
      if (rng() % 2 == 0) b.insert(i);
    }
    std::set<uint32_t> u = a, m, x;
    u.insert(b.begin(), b.end());
    for (uint32_t i : a) (b.count(i) ? x : m).insert(i);
    const IndexRanges ra = Of(a), rb = Of(b);
    EXPECT_EQ(ra.Union(rb), Of(u));
    EXPECT_EQ(ra.Minus(rb), Of(m));
    EXPECT_EQ(ra.Intersect(rb), Of(x));
    EXPECT_EQ(Members(ra.Union(rb)), u);
    EXPECT_EQ(ra.IsSubsetOf(rb), m.empty());
  }
}

}  // namespace
}  // namespace repvar

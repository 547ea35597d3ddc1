// SPDX-License-Identifier: Apache-2.0
// One commit point: random sequences of operations (registrations, deaths,
// creates, initializes, assigns, deletes, steps, repairs, failing workers)
// run against the coordinator core; the records it committed, replayed into
// an empty ClusterState, give exactly the state the coordinator holds. If
// any code changed the state outside Apply, or applied something it did not
// log, the replay would differ; the negative controls show the comparison
// notices a record altered or left out.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/core/coordinator.h"
#include "tests/testing/random_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar::server {
namespace {

using ::repvar::testing::RandomCluster;

std::string Replay(const std::vector<Record>& records) {
  ClusterState replayed(RandomCluster::StateOptions());
  for (const Record& r : records) replayed.Apply(r);
  return replayed.Dump();
}

TEST(ReplayTest, OneCommitPoint_ReplayingTheRecordsGivesTheSameState) {
  std::set<size_t> kinds;  // of the changes recorded, over all seeds
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    RandomCluster cluster(seed);
    cluster.Run(300);
    ASSERT_GT(cluster.records().size(), 20u) << "seed " << seed;
    EXPECT_EQ(Replay(cluster.records()), cluster.CoordinatorState()) << "seed " << seed;
    for (const Record& r : cluster.records()) {
      for (const Change& c : r.changes) kinds.insert(c.index());
    }
  }
  // The operations reached every kind of change there is.
  EXPECT_EQ(kinds.size(), std::variant_size_v<Change>);
}

// Negative controls: the comparison notices a record altered or left out.
TEST(ReplayTest, NegativeControl_AnAlteredRecordIsNoticed) {
  int controls = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    RandomCluster cluster(seed);
    cluster.Run(300);
    std::vector<Record> records = cluster.records();
    // Alter the last committed value of a variable that still exists.
    std::set<uint64_t> deleted;
    ValueCommitted* last = nullptr;
    for (Record& r : records) {
      for (Change& c : r.changes) {
        if (auto* d = std::get_if<VariableDeleted>(&c)) deleted.insert(d->id);
        if (auto* v = std::get_if<ValueCommitted>(&c)) last = v;
      }
    }
    if (last == nullptr || deleted.contains(last->id)) continue;
    last->checksum ^= 0xdead;
    EXPECT_NE(Replay(records), cluster.CoordinatorState()) << "seed " << seed;
    ++controls;
  }
  EXPECT_GT(controls, 0);
}

TEST(ReplayTest, NegativeControl_ARecordLeftOutIsNoticed) {
  RandomCluster cluster(8);
  cluster.Run(300);
  std::vector<Record> records = cluster.records();
  // Leave out the tail from the last record that changes what the state
  // shows (some change nothing: a failed step only closes an epoch, a
  // resync flag may be raised again).
  while (!records.empty()) {
    const std::string with = Replay(records);
    const Record last = records.back();
    records.pop_back();
    if (Replay(records) != with) break;
  }
  ASSERT_FALSE(records.empty());
  EXPECT_NE(Replay(records), cluster.CoordinatorState());
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// The barrier's pure decisions (step_plan.h): the source replica of NONE
// and ONLY_FIRST_REPLICA variables (S4), and the collectives in their
// fixed order.
#include "server/core/step_plan.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace repvar::server {
namespace {

StepVariable Var(uint64_t id, Aggregation a, std::vector<int32_t> participants,
                 DType dtype = DType::kFloat32) {
  StepVariable v;
  v.id = id;
  v.name = absl::StrCat("v", id);
  v.aggregation = a;
  v.spec = TensorSpec{dtype, {2}};
  v.replica_participant = std::move(participants);
  return v;
}

TEST(StepPlanTest, S4_PickSource_NoneTakesTheMajority_TiesToTheLowerReplica) {
  EXPECT_EQ(PickSource(Aggregation::kNone, {0, 1, 2}, {7, 9, 9}), 1);
  EXPECT_EQ(PickSource(Aggregation::kNone, {0, 1, 2, 3}, {7, 9, 9, 7}), 0) << "a tie";
  EXPECT_EQ(PickSource(Aggregation::kNone, {1, 2, 3}, {5, 7, 9, 9}), 2) << "0 sits out";
  EXPECT_EQ(PickSource(Aggregation::kOnlyFirstReplica, {1, 2}, {5, 7, 9}), 1);
}

TEST(StepPlanTest, Voters_AreTheReplicasOnAParticipant) {
  EXPECT_EQ(Voters(Var(1, Aggregation::kNone, {0, -1, 1, 2})), (std::vector<int32_t>{0, 2, 3}));
}

// Fused reductions by accumulator type first, then repairs by variable id;
// a NONE variable whose replicas disagree is a divergence; one whose
// replicas agree changes without a collective.
TEST(StepPlanTest, S4_PlanCollectives_ReductionsThenRepairs_DivergencesNamed) {
  const StepVariable mean = Var(1, Aggregation::kMean, {0, 1});
  const StepVariable sum64 = Var(2, Aggregation::kSum, {0, 1}, DType::kFloat64);
  const StepVariable diverged = Var(3, Aggregation::kNone, {0, 1, 1});
  const StepVariable agreed = Var(4, Aggregation::kNone, {0, 1});
  const StepVariable first = Var(5, Aggregation::kOnlyFirstReplica, {0, 1});
  const StepDecision d = PlanCollectives({{&mean, 0, std::nullopt, {}},
                                          {&sum64, 1, std::nullopt, {}},
                                          {&diverged, 2, std::nullopt, {8, 6, 6}},
                                          {&agreed, 3, std::nullopt, {4, 4}},
                                          {&first, 4, std::nullopt, {3, 5}}});
  EXPECT_EQ(d.changed, IndexRanges::All(5));
  EXPECT_EQ(d.expected, (std::vector<uint64_t>{0, 0, 6, 4, 3}));
  ASSERT_EQ(d.collectives.size(), 4u);
  EXPECT_EQ(d.collectives[0].kind, StepCollective::Kind::kAllreduce);
  EXPECT_EQ(d.collectives[1].kind, StepCollective::Kind::kAllreduce);
  EXPECT_EQ(d.collectives[2].variables.bounds(), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(d.collectives[2].source_replica, 1);
  EXPECT_EQ(d.collectives[2].targets, (std::vector<int32_t>{0}));
  EXPECT_EQ(d.collectives[3].variables.bounds(), (std::vector<uint32_t>{4, 5}));
  EXPECT_EQ(d.collectives[3].targets, (std::vector<int32_t>{1}));
  ASSERT_EQ(d.divergences.size(), 1u) << "ONLY_FIRST_REPLICA disagreeing is no divergence";
  EXPECT_EQ(d.divergences[0].variable_id, 3u);
  EXPECT_EQ(d.divergences[0].chosen_checksum, 6u);
}

// Variables the digests showed agreeing go without a per-replica merge
// and without a collective.
TEST(StepPlanTest, S4_PlanCollectives_AgreedNoneVariable_ChangesWithoutACollective) {
  const StepVariable agreed = Var(7, Aggregation::kNone, {0, 1, 2});
  const StepDecision d = PlanCollectives({{&agreed, 5, 42, {}}});
  EXPECT_EQ(d.changed.bounds(), (std::vector<uint32_t>{5, 6}));
  EXPECT_EQ(d.expected, (std::vector<uint64_t>{42}));
  EXPECT_TRUE(d.collectives.empty());
  EXPECT_TRUE(d.divergences.empty());
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// A step plan's collectives on one worker, with fake collectives: the fused
// MEAN reduction applied to the begin value, and a repair broadcast checked
// against its checksum.
#include "worker/core/plan_runner.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::Floats;
using ::repvar::testing::StatusIs;

// Another member adds `others` to every element; a broadcast delivers `root`.
class FakeCollectives final : public Collectives {
 public:
  absl::Status Broadcast(const CollectiveSpec& c, std::span<std::byte> bytes,
                         ChecksumStream* received, ArrivingBytes*) override {
    seen.push_back(c);
    if (c.rank != c.root) {
      std::memcpy(bytes.data(), root->bytes.data(), bytes.size());
      if (received != nullptr) received->Update(bytes);
    }
    return absl::OkStatus();
  }
  absl::Status Allreduce(const CollectiveSpec& c, AccumType, std::span<std::byte> bytes) override {
    seen.push_back(c);
    auto* f = reinterpret_cast<float*>(bytes.data());
    for (size_t i = 0; i < bytes.size() / 4; ++i) f[i] += others;
    return absl::OkStatus();
  }
  absl::Status ReduceApply(const CollectiveSpec& c, FoldedReduction& r) override {
    ++folded;
    return Collectives::ReduceApply(c, r);
  }
  float others = 0;
  int folded = 0;  // ReduceApply calls
  std::shared_ptr<const Tensor> root;
  std::vector<CollectiveSpec> seen;
};

class PlanRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // This worker is participant 1 of 2 and holds replicas 2 and 3 of w (of 4).
    auto layout = std::make_shared<StepLayout>();
    layout->info.participants.resize(2);
    layout->me = 1;
    StepVariable w;
    w.id = 1;
    w.name = "w";
    w.aggregation = Aggregation::kMean;
    w.spec = TensorSpec{DType::kFloat32, {2}};
    w.replica_participant = {0, 0, 1, 1};
    layout->info.variables.push_back(w);
    layout->vars[1] = 0;
    step_.layout = layout;
    ASSERT_TRUE(store_.Apply({ReplicaWrite{1, "w", 5, {2, 3}, F32({1, 2})}}).ok());
  }
  ReplicaStore store_;
  FakeCollectives collectives_;
  PlanRunner runner_{&store_, &collectives_};
  LocalStep step_;
};

TEST_F(PlanRunnerTest, Allreduce_BeginPlusSumOfDeltasOverReplicaCount) {
  step_.written[{1, 2}] = F32({5, 6});  // +4 each; replica 3 untouched: +0
  collectives_.others = 8;              // the other host's deltas
  StepPlan plan;
  plan.group = "g";
  plan.collectives.push_back(
      StepCollective{StepCollective::Kind::kAllreduce, 4, IndexRanges::All(1), 0, 0, 0, {}});
  auto out = runner_.Run(step_, plan);
  ASSERT_OK(out);
  EXPECT_EQ(Floats(*out->values.at(1)), (std::vector<float>{4, 5}));  // 1,2 + 12/4
  EXPECT_EQ(out->reduced_nonfinite.at(1), -1);
  ASSERT_EQ(collectives_.seen.size(), 1u);
  EXPECT_EQ(collectives_.seen[0].rank, 1) << "rank = participant index";
  EXPECT_EQ(collectives_.seen[0].size, 2);
  EXPECT_EQ(collectives_.seen[0].tag, 4u);
}

// Several SUM/MEAN variables in one collective: folded into the ring
// (ReduceApply) when they have one dtype and every participant holds each,
// else Allreduce then apply; the same values either way, each its own
// divisor.
TEST_F(PlanRunnerTest, Allreduce_SeveralVariables_FoldedWhenOneDtypeAndAllHold_SameValues) {
  for (DType b_dtype : {DType::kFloat32, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(b_dtype));
    SetUp();
    collectives_.folded = 0;
    auto layout = std::make_shared<StepLayout>(*step_.layout);
    StepVariable b;
    b.id = 2;
    b.name = "b";
    b.aggregation = Aggregation::kMean;
    b.spec = TensorSpec{b_dtype, {3}};
    b.replica_participant = {0, 1};  // this worker holds replica 1
    layout->info.variables.push_back(b);
    layout->vars[2] = 1;
    step_.layout = layout;
    Tensor begin = *Tensor::ForOverwrite(b.spec), local = *Tensor::ForOverwrite(b.spec);
    for (int64_t i = 0; i < 3; ++i) {
      StoreElement(begin, i, 10.0 * static_cast<double>(i + 1));
      StoreElement(local, i, 10.0 * static_cast<double>(i + 1) + 1);  // +1 each
    }
    begin.UpdateChecksum();
    local.UpdateChecksum();
    ASSERT_OK(store_.Apply(
        {ReplicaWrite{2, "b", 5, {1}, std::make_shared<const Tensor>(std::move(begin))}}));
    step_.written[{1, 2}] = F32({5, 6});  // w: +4 each
    step_.written[{2, 1}] = std::make_shared<const Tensor>(std::move(local));
    collectives_.others = 8;
    StepPlan plan;
    plan.group = "g";
    plan.collectives.push_back(
        StepCollective{StepCollective::Kind::kAllreduce, 4, IndexRanges::All(2), 0, 0, 0, {}});
    auto out = runner_.Run(step_, plan);
    ASSERT_OK(out);
    EXPECT_EQ(collectives_.folded, b_dtype == DType::kFloat32 ? 1 : 0);
    EXPECT_EQ(Floats(*out->values.at(1)), (std::vector<float>{4, 5}));  // 1,2 + 12/4
    const Tensor& got = *out->values.at(2);                             // 10,20,30 + 9/2
    EXPECT_EQ(LoadElement(got, 0), 14.5);
    EXPECT_EQ(LoadElement(got, 2), 34.5);
    EXPECT_EQ(got.checksum, Checksum(got.bytes.span()));
  }
}

// S4: MEAN divides by the replicas taking part; replicas on a
// worker that sat the step out (participant -1) are not counted.
TEST_F(PlanRunnerTest, S4_Mean_DividesByParticipatingReplicasOnly) {
  auto layout = std::make_shared<StepLayout>(*step_.layout);
  layout->info.variables.Own()[0].replica_participant = {-1, -1, 1, 1};  // host 0 sat out
  step_.layout = layout;
  step_.written[{1, 2}] = F32({5, 6});  // +4 each; replica 3 untouched: +0
  collectives_.others = 0;              // nobody else contributes
  StepPlan plan;
  plan.group = "g";
  plan.collectives.push_back(
      StepCollective{StepCollective::Kind::kAllreduce, 4, IndexRanges::All(1), 0, 0, 0, {}});
  auto out = runner_.Run(step_, plan);
  ASSERT_OK(out);
  EXPECT_EQ(Floats(*out->values.at(1)), (std::vector<float>{3, 4}));  // 1,2 + 4/2, not 4/4
}

// A reduced value a trainer on this host maps after the step is written
// into shared memory (lent without a copy); a small one is not.
TEST_F(PlanRunnerTest, LargeReducedValue_InSharedMemory_SmallOneNot) {
  const int64_t n = PlanRunner::kSharedValueBytes / 4;
  auto layout = std::make_shared<StepLayout>(*step_.layout);
  layout->info.variables.Own()[0].spec = TensorSpec{DType::kFloat32, {n}};
  step_.layout = layout;
  std::vector<float> ones(n, 1.0f), threes(n, 3.0f);
  ASSERT_TRUE(store_.Apply({ReplicaWrite{1, "w", 6, {2, 3}, F32(ones), 1}}).ok());
  step_.written[{1, 2}] = F32(threes);  // +2 each
  StepPlan plan;
  plan.group = "g";
  plan.collectives.push_back(
      StepCollective{StepCollective::Kind::kAllreduce, 4, IndexRanges::All(1), 0, 0, 0, {}});
  auto out = runner_.Run(step_, plan);
  ASSERT_OK(out);
  const Tensor& big = *out->values.at(1);
  EXPECT_GE(big.bytes.shared_fd(), 0);
  EXPECT_EQ(Floats(big)[n - 1], 1.5f);  // 1 + 2/4
  EXPECT_EQ(big.checksum, Checksum(big.bytes.span()));

  PlanRunnerTest::SetUp();  // w of 2 floats again
  step_.written.clear();
  step_.written[{1, 2}] = F32({5, 6});
  auto small = runner_.Run(step_, plan);
  ASSERT_OK(small);
  EXPECT_LT(small->values.at(1)->bytes.shared_fd(), 0);
}

TEST_F(PlanRunnerTest, Broadcast_ReceivedValueCheckedAgainstThePlannedChecksum) {
  collectives_.root = F32({7, 7});
  StepPlan plan;
  plan.collectives.push_back(StepCollective{StepCollective::Kind::kBroadcast,
                                            0,
                                            IndexRanges::All(1),
                                            /*root=*/0,
                                            0,
                                            collectives_.root->checksum,
                                            {2, 3}});
  auto out = runner_.Run(step_, plan);
  ASSERT_OK(out);
  EXPECT_EQ(Floats(*out->values.at(1)), (std::vector<float>{7, 7}));
  plan.collectives[0].checksum ^= 1;
  EXPECT_THAT(runner_.Run(step_, plan), StatusIs(absl::StatusCode::kDataLoss, "bad checksum"));
  plan.collectives[0].variables = IndexRanges::All(99);
  EXPECT_THAT(runner_.Run(step_, plan),
              StatusIs(absl::StatusCode::kInvalidArgument, "past the layout"));
}

// A repair broadcast: the root sends the winning value itself and keeps it
// (no copy); a receiver of a large value gets it in shared memory.
TEST_F(PlanRunnerTest, Broadcast_RootKeepsItsValueUncopied_LargeReceivedValueShared) {
  const std::shared_ptr<const Tensor> winner = F32({7, 7});
  step_.written[{1, 2}] = winner;
  StepPlan plan;
  plan.collectives.push_back(StepCollective{StepCollective::Kind::kBroadcast,
                                            0,
                                            IndexRanges::All(1),
                                            /*root=*/1,
                                            /*source_replica=*/2,
                                            winner->checksum,
                                            {2, 3}});
  auto out = runner_.Run(step_, plan);
  ASSERT_OK(out);
  EXPECT_EQ(out->values.at(1), winner);
  plan.collectives[0].checksum ^= 1;
  EXPECT_THAT(runner_.Run(step_, plan), StatusIs(absl::StatusCode::kDataLoss, "bad checksum"));

  const int64_t n = PlanRunner::kSharedValueBytes / 4;
  auto layout = std::make_shared<StepLayout>(*step_.layout);
  layout->info.variables.Own()[0].spec = TensorSpec{DType::kFloat32, {n}};
  step_.layout = layout;
  collectives_.root = F32(std::vector<float>(n, 2.0f));
  plan.collectives[0] =
      StepCollective{StepCollective::Kind::kBroadcast, 0,     IndexRanges::All(1), /*root=*/0, 0,
                     collectives_.root->checksum,      {2, 3}};
  auto big = runner_.Run(step_, plan);
  ASSERT_OK(big);
  EXPECT_GE(big->values.at(1)->bytes.shared_fd(), 0);
  EXPECT_EQ(Floats(*big->values.at(1))[n - 1], 2.0f);
}

}  // namespace
}  // namespace repvar::worker

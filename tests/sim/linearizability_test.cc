// SPDX-License-Identifier: Apache-2.0
// The history checker catches what it checks: each kind of anomaly the
// crash trials look for, seeded into a small history, is rejected, next to
// the same history without it, accepted.
#include "sim/linearizability.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace repvar::sim {
namespace {

using ::repvar::testing::StatusIs;
using Kind = RegisterOp::Kind;

RegisterOp Op(Kind kind, std::vector<float> arg, int64_t call, int64_t ret, int64_t version,
              std::vector<float> seen) {
  RegisterOp op;
  op.kind = kind;
  op.arg = std::move(arg);
  op.call = call;
  op.ret = ret;
  op.version = version;
  op.checksum = ChecksumOf(seen);
  return op;
}
RegisterOp Write(std::vector<float> v, int64_t call, int64_t ret, int64_t version) {
  return Op(Kind::kAssign, v, call, ret, version, v);
}
RegisterOp Read(int64_t call, int64_t ret, int64_t version, std::vector<float> seen) {
  return Op(Kind::kRead, {}, call, ret, version, std::move(seen));
}
RegisterOp Unknown(RegisterOp op) {
  op.ret = RegisterOp::kNever;
  return op;
}

const RegisterState kInitial{0, {0, 0}};

TEST(Linearizability, SequentialAndConcurrentHistories_Accepted) {
  EXPECT_OK(CheckLinearizable(
      {Write({1, 1}, 0, 10, 1), Read(20, 30, 1, {1, 1}), Write({2, 2}, 40, 50, 2)}, kInitial));
  // Two overlapping writes: a read after both may see either order's end.
  EXPECT_OK(CheckLinearizable(
      {Write({1, 1}, 0, 30, 2), Write({2, 2}, 10, 20, 1), Read(40, 50, 2, {1, 1})}, kInitial));
  // A read overlapping a write may see it or not.
  EXPECT_OK(CheckLinearizable({Write({1, 1}, 0, 30, 1), Read(10, 20, 0, {0, 0})}, kInitial));
  EXPECT_OK(CheckLinearizable({Write({1, 1}, 0, 30, 1), Read(10, 20, 1, {1, 1})}, kInitial));
}

TEST(Linearizability, SeededStaleRead_Rejected) {
  const std::vector<RegisterOp> fresh = {Write({1, 1}, 0, 10, 1), Write({2, 2}, 20, 30, 2),
                                         Read(40, 50, 2, {2, 2})};
  EXPECT_OK(CheckLinearizable(fresh, kInitial));
  std::vector<RegisterOp> stale = fresh;
  stale[2] = Read(40, 50, 1, {1, 1});  // the write before it had returned
  EXPECT_THAT(CheckLinearizable(stale, kInitial),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not linearizable"));
}

TEST(Linearizability, LostAcknowledgedWrite_Rejected_UnknownOneMayBeLost) {
  EXPECT_THAT(CheckLinearizable({Write({1, 1}, 0, 10, 1), Read(20, 30, 0, {0, 0})}, kInitial),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Not acknowledged (the coordinator died): lost or not, both are fine.
  EXPECT_OK(
      CheckLinearizable({Unknown(Write({1, 1}, 0, 10, 1)), Read(20, 30, 0, {0, 0})}, kInitial));
  EXPECT_OK(
      CheckLinearizable({Unknown(Write({1, 1}, 0, 10, 1)), Read(20, 30, 1, {1, 1})}, kInitial));
  // ... but once seen it cannot be unseen.
  EXPECT_THAT(CheckLinearizable({Unknown(Write({1, 1}, 0, 10, 1)), Read(20, 30, 1, {1, 1}),
                                 Read(40, 50, 0, {0, 0})},
                                kInitial),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(Linearizability, AddAppliedTwice_Rejected_VersionThatGoesBack_Rejected) {
  const RegisterOp add = Op(Kind::kAdd, {1, 1}, 0, 10, 1, {1, 1});
  EXPECT_OK(CheckLinearizable({add, Read(20, 30, 1, {1, 1})}, kInitial));
  EXPECT_THAT(CheckLinearizable({add, Read(20, 30, 2, {2, 2})}, kInitial),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(
      CheckLinearizable(
          {Write({1, 1}, 0, 10, 1), Write({2, 2}, 20, 30, 2), Write({3, 3}, 40, 50, 2)}, kInitial),
      StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace repvar::sim

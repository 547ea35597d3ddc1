// SPDX-License-Identifier: Apache-2.0
// The data plane's groups: large writes go to one root and every member
// gets the same group and tag, in order; a failure starts a new generation.
#include "server/core/collective_groups.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "server/core/coordinator.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_worker_client.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar::server {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::StatusIs;

VariableDef Def(const std::string& name, int replicas, std::vector<int64_t> dims) {
  VariableDef d;
  d.name = name;
  d.tensor = TensorSpec{DType::kFloat32, std::move(dims)};
  d.replica_count = replicas;
  return d;
}

TEST(DataPlaneTest, LargeWrite_OneRootGetsBytesAllMembersGetOneGroupAndTag) {
  repvar::testing::FakeClock clock;
  repvar::testing::FakeWorkerClient workers;
  CoordinatorOptions options;
  options.replication.data_plane = true;
  options.replication.data_plane_min_bytes = 1024;
  Coordinator core(options, &clock, &workers);
  for (int t = 0; t < 4; ++t) {
    ASSERT_OK(core.RegisterWorker(
        {"tpu_worker",
         t,
         absl::StrCat("h", t, ":1"),
         10u + t,
         {absl::StrCat("/job:tpu_worker/replica:0/task:", t, "/device:TPU:0")}}));
  }
  ASSERT_OK(core.CreateVariables({}, {{Def("big", 4, {1024}), {}}, {Def("small", 4, {4}), {}}}));
  std::vector<float> v(1024, 1.0f);
  auto big = std::make_shared<const Tensor>(
      *Tensor::FromBytes(TensorSpec{DType::kFloat32, {1024}}, std::as_bytes(std::span(v))));
  ASSERT_OK(core.Assign({}, {"big", AssignOp::kAssign, big}));
  ASSERT_OK(core.Assign({}, {"big", AssignOp::kAssign, big}));
  ASSERT_OK(core.Assign({}, {"small", AssignOp::kAssign, F32({1, 2, 3, 4})}));
  auto c = workers.collectives();
  ASSERT_EQ(c.size(), 8u) << "small writes do not use the data plane";
  std::map<std::string, int> ranks;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(c[i].second.group, c[0].second.group);
    EXPECT_EQ(c[i].second.tag, c[0].second.tag);
    EXPECT_EQ(c[i].second.size, 4);
    EXPECT_EQ(c[i].second.root, 0);
    ranks[c[i].first] = c[i].second.rank;
    EXPECT_EQ(c[i + 4].second.tag, c[0].second.tag + 1) << "distinct tags, in order";
  }
  EXPECT_EQ(ranks["tpu_worker:0"], 0);
  EXPECT_EQ(ranks["tpu_worker:3"], 3);
  // A failed collective moves the group to a new generation.
  workers.Fail("tpu_worker:2", absl::UnavailableError("gloo timeout"));
  EXPECT_THAT(core.Assign({}, {"big", AssignOp::kAssign, big}),
              StatusIs(absl::StatusCode::kUnavailable));
  workers.Heal("tpu_worker:2");
  ASSERT_OK(core.Assign({}, {"big", AssignOp::kAssign, big}));
  auto after = workers.collectives();
  EXPECT_NE(after.back().second.group, c[0].second.group);
}

// The simulator's seed 1616: a coordinator restarted with its workers
// still running handed out the groups and tags of its earlier life, which
// workers still held from before the crash; every large write then timed
// out in its collective. A new life never repeats a group name.
TEST(CollectiveGroupsTest, ANewCoordinatorLife_NeverRepeatsAGroup) {
  std::vector<GroupMember> members = {{{"tpu_worker", 0}, 1}, {{"tpu_worker", 1}, 2}};
  CollectiveGroups before(/*life=*/1000);
  CollectiveGroups after(/*life=*/2000);
  std::set<std::string> seen;
  for (int i = 0; i < 3; ++i) {
    seen.insert(before.ForStep(members, 1, /*fresh=*/true).first);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(seen.contains(after.ForStep(members, 1, /*fresh=*/true).first));
  }
}

TEST(CollectiveGroupsTest, ForStep_ConsecutiveTags_FreshStartsANewGeneration_OldKeysDeleted) {
  CollectiveGroups groups(/*life=*/7);
  std::vector<GroupMember> members = {{{"tpu_worker", 0}, 1}, {{"tpu_worker", 1}, 2}};
  auto [g1, t1] = groups.ForStep(members, 3, /*fresh=*/false);
  auto [g2, t2] = groups.ForStep(members, 1, /*fresh=*/false);
  EXPECT_EQ(g1, g2);
  EXPECT_EQ(t2, t1 + 3);
  ASSERT_OK(groups.store().Set(g1 + "/rank0", "addr"));
  auto [g3, t3] = groups.ForStep(members, 1, /*fresh=*/true);
  EXPECT_NE(g3, g1);
  EXPECT_EQ(t3, t2 + 1);
  EXPECT_EQ(groups.store().size(), 0u) << "the old group's rendezvous keys are gone";
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "worker/core/replica_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"

namespace repvar::worker {
namespace {

using ::repvar::testing::StatusIs;

std::shared_ptr<const Tensor> Value(float x) {
  return std::make_shared<const Tensor>(
      *Tensor::FromBytes(TensorSpec{DType::kFloat32, {}}, std::as_bytes(std::span(&x, 1))));
}

TEST(ReplicaStore, Apply_AllReplicasShareOneValue) {
  ReplicaStore store;
  ASSERT_OK(store.Apply({{7, "w", 1, {0, 1}, Value(1.0f)}}));
  auto r0 = store.Get(7, 0);
  auto r1 = store.Get(7, 1);
  ASSERT_OK(r0);
  ASSERT_OK(r1);
  EXPECT_EQ(r0->version, 1);
  EXPECT_EQ(r0->value.get(), r1->value.get());
  EXPECT_EQ(store.BytesHeld(), 4u);
  EXPECT_THAT(store.Get(7, 2), StatusIs(absl::StatusCode::kNotFound));
}

TEST(ReplicaStore, ReaderKeepsItsVersionAcrossAWrite) {
  ReplicaStore store;
  ASSERT_OK(store.Apply({{7, "w", 1, {0}, Value(1.0f)}}));
  auto held = store.Get(7, 0);
  ASSERT_OK(store.Apply({{7, "w", 2, {0}, Value(2.0f)}}));
  EXPECT_EQ(held->version, 1);
  EXPECT_EQ(LoadElement(*held->value, 0), 1.0);
  EXPECT_EQ(LoadElement(*store.Get(7, 0)->value, 0), 2.0);
  store.Drop(7);
  EXPECT_TRUE(store.List().empty());
}

ReplicaWrite Fenced(uint64_t id, int64_t version, std::vector<int32_t> replicas, float x,
                    uint64_t fence) {
  ReplicaWrite w{id, "w", version, std::move(replicas), Value(x)};
  w.fence = fence;
  return w;
}

// A write delayed past its own failure (the coordinator gave up, repaired
// the replica with a later fence) must not land on top of the repair.
TEST(ReplicaStore, F2_WriteWithALowerFence_Aborted_NothingApplied) {
  ReplicaStore store;
  ASSERT_OK(store.Apply({Fenced(7, 1, {0}, 1.0f, /*fence=*/20)}));
  EXPECT_THAT(store.Apply({Fenced(8, 1, {0}, 5.0f, 10), Fenced(7, 2, {0}, 2.0f, 19)}),
              StatusIs(absl::StatusCode::kAborted, "superseded"));
  EXPECT_EQ(store.Get(7, 0)->version, 1);
  EXPECT_THAT(store.Get(8, 0), StatusIs(absl::StatusCode::kNotFound));  // all or nothing
  // The same fence again (a retried delivery) and a higher one land.
  ASSERT_OK(store.Apply({Fenced(7, 2, {0}, 2.0f, 20)}));
  ASSERT_OK(store.Apply({Fenced(7, 3, {0}, 3.0f, 21)}));
  EXPECT_EQ(store.Get(7, 0)->version, 3);
  // The fence outlives a drop: a delayed write cannot bring it back.
  store.Drop(7);
  EXPECT_THAT(store.Apply({Fenced(7, 2, {0}, 2.0f, 20)}), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(store.Get(7, 0), StatusIs(absl::StatusCode::kNotFound));
  // A step's result (no fence) is this worker's own: never refused.
  ASSERT_OK(store.Apply({Fenced(8, 4, {0}, 4.0f, 0)}));
}

TEST(ReplicaStore, F2_FenceAndList_RefusesEveryEarlierWrite_ThenLists) {
  ReplicaStore store;
  ASSERT_OK(store.Apply({Fenced(7, 1, {0, 1}, 1.0f, 5)}));
  std::vector<StoredReplica> listed = store.FenceAndList(/*floor=*/30);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].version, 1);
  // Any variable, even one never written here: nothing sent before the
  // floor lands after the list.
  EXPECT_THAT(store.Apply({Fenced(9, 1, {0}, 1.0f, 29)}), StatusIs(absl::StatusCode::kAborted));
  ASSERT_OK(store.Apply({Fenced(9, 1, {0}, 1.0f, 30)}));
  // The floor never goes down.
  store.FenceAndList(3);
  EXPECT_THAT(store.Apply({Fenced(7, 2, {0}, 2.0f, 10)}), StatusIs(absl::StatusCode::kAborted));
}

// A read waiting for a newer version of a replica that is dropped meanwhile
// hears NOT_FOUND at once, not at its deadline (and never looks at the
// dropped entry).
TEST(ReplicaStore, WaitFor_ReplicaDroppedWhileWaiting_NotFoundAtOnce) {
  ReplicaStore store;
  ASSERT_OK(store.Apply({{7, "w", 1, {0}, Value(1.0f)}}));
  absl::StatusOr<StoredReplica> waited;
  std::thread reader([&] { waited = store.WaitFor(7, 0, 2, absl::InfiniteFuture()); });
  while (store.Waiting() == 0) std::this_thread::yield();
  store.Drop(7);
  reader.join();  // hangs if the drop does not wake the wait
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kNotFound));
  // The valid case: a write of the version waited for ends the wait.
  ASSERT_OK(store.Apply({{8, "x", 1, {0}, Value(1.0f)}}));
  std::thread writer([&] { ASSERT_OK(store.Apply({{8, "x", 2, {0}, Value(2.0f)}})); });
  auto newer = store.WaitFor(8, 0, 2, absl::InfiniteFuture());
  writer.join();
  ASSERT_OK(newer);
  EXPECT_EQ(newer->version, 2);
}

}  // namespace
}  // namespace repvar::worker

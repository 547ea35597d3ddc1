// SPDX-License-Identifier: Apache-2.0
#include "worker/core/replica_store.h"

#include <gtest/gtest.h>

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
  store.Apply({{7, "w", 1, {0, 1}, Value(1.0f)}});
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
  store.Apply({{7, "w", 1, {0}, Value(1.0f)}});
  auto held = store.Get(7, 0);
  store.Apply({{7, "w", 2, {0}, Value(2.0f)}});
  EXPECT_EQ(held->version, 1);
  EXPECT_EQ(LoadElement(*held->value, 0), 1.0);
  EXPECT_EQ(LoadElement(*store.Get(7, 0)->value, 0), 2.0);
  store.Drop(7);
  EXPECT_TRUE(store.List().empty());
}

}  // namespace
}  // namespace repvar::worker

// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/tensor.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(TensorSpec, ByteSize_OverflowNegativeAndRank) {
  EXPECT_EQ(*(TensorSpec{DType::kFloat32, {}}.ByteSize()), 4);
  EXPECT_EQ(*(TensorSpec{DType::kBFloat16, {2, 0, 5}}.ByteSize()), 0);
  EXPECT_THAT((TensorSpec{DType::kFloat32, {-1}}.ByteSize()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((TensorSpec{DType::kInt64, {int64_t{1} << 31, int64_t{1} << 31}}.ByteSize()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((TensorSpec{DType::kFloat32, std::vector<int64_t>(33, 1)}.ByteSize()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Checksum, IsXxh3Of64Bits) {
  const char text[] = "repvar";
  EXPECT_EQ(Checksum(std::as_bytes(std::span(text, 6))), XXH3_64bits(text, 6));
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/element_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(AddScaled, F16AccumulatesInF32AndIntegersWrap) {
  auto a = *Tensor::Zeros(TensorSpec{DType::kFloat16, {2}});
  StoreElement(a, 0, 1.0);
  StoreElement(a, 1, 2048.0);
  auto b = *Tensor::Zeros(TensorSpec{DType::kFloat16, {2}});
  StoreElement(b, 0, 0.5);
  StoreElement(b, 1, 1.0);
  auto sum = AddScaled(a, b, 1);
  ASSERT_OK(sum);
  EXPECT_EQ(LoadElement(*sum, 0), 1.5);
  EXPECT_EQ(LoadElement(*sum, 1), 2048.0);  // 2049 rounds to even in f16
  auto i = *Tensor::Zeros(TensorSpec{DType::kInt32, {1}});
  StoreElement(i, 0, 2147483647.0);
  auto one = *Tensor::Zeros(TensorSpec{DType::kInt32, {1}});
  StoreElement(one, 0, 1);
  EXPECT_EQ(LoadElement(*AddScaled(i, one, 1), 0), -2147483648.0);
}

TEST(FirstNonFinite, FindsNanAndInfInEveryFloatType) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    auto t = *Tensor::Zeros(TensorSpec{d, {4}});
    EXPECT_EQ(FirstNonFinite(t), -1);
    StoreElement(t, 2, std::numeric_limits<double>::infinity());
    EXPECT_EQ(FirstNonFinite(t), 2) << DTypeName(d);
  }
}

// Across block boundaries (the search tests blocks of elements at once):
// the first of several (set from the last down), wherever it falls, and
// none in a long finite run.
TEST(FirstNonFinite, FindsTheFirstAcrossBlocks) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    auto t = *Tensor::Zeros(TensorSpec{d, {20000}});
    EXPECT_EQ(FirstNonFinite(t), -1) << DTypeName(d);
    for (int64_t first :
         {int64_t{19999}, int64_t{8192}, int64_t{4096}, int64_t{4095}, int64_t{0}}) {
      StoreElement(t, first, std::numeric_limits<double>::quiet_NaN());
      StoreElement(t, 19999, -std::numeric_limits<double>::infinity());
      EXPECT_EQ(FirstNonFinite(t), first) << DTypeName(d);
    }
  }
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/model/initializer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(Initializer, ConstantsAndSeededRandomAreDeterministic) {
  TensorSpec spec{DType::kFloat32, {5}};
  auto c = MakeInitialValue({InitializerKind::kConstant, 2.5}, spec);
  ASSERT_OK(c);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(LoadElement(*c, i), 2.5);
  Initializer n{InitializerKind::kRandomNormal, 0, 1.0, 2.0, 99};
  EXPECT_EQ(MakeInitialValue(n, spec)->checksum, MakeInitialValue(n, spec)->checksum);
  n.seed = 100;
  EXPECT_NE(MakeInitialValue(n, spec)->checksum,
            MakeInitialValue({InitializerKind::kRandomNormal, 0, 1.0, 2.0, 99}, spec)->checksum);
  EXPECT_THAT(MakeInitialValue({}, spec), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MakeInitialValue({InitializerKind::kRandomUniform, 0, 2, 1, 0}, spec),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// The same initializer (every field, numbers bit for bit, kValue's tensor
// the same object) is what lets a batched initialize share one value.
TEST(Initializer, SameInitializer_EveryFieldBitForBit) {
  const Initializer normal{InitializerKind::kRandomNormal, 0, 0.5, 2.0, 99};
  EXPECT_TRUE(SameInitializer(normal, normal));
  for (auto spoil : std::vector<std::function<void(Initializer&)>>{
           [](Initializer& i) { i.kind = InitializerKind::kRandomUniform; },
           [](Initializer& i) { i.seed = 100; },
           [](Initializer& i) { i.a = -0.5; },
           [](Initializer& i) { i.b = 2.5; },
           [](Initializer& i) { i.constant = 1; },
       }) {
    Initializer other = normal;
    spoil(other);
    EXPECT_FALSE(SameInitializer(normal, other));
  }
  Initializer zero{InitializerKind::kConstant, 0.0};
  Initializer negative_zero{InitializerKind::kConstant, -0.0};
  EXPECT_FALSE(SameInitializer(zero, negative_zero)) << "different bytes";
  Initializer nan{InitializerKind::kConstant, std::numeric_limits<double>::quiet_NaN()};
  EXPECT_TRUE(SameInitializer(nan, nan));
  const auto value = std::make_shared<const Tensor>(*Tensor::Zeros({DType::kFloat32, {2}}));
  const auto copy = std::make_shared<const Tensor>(*Tensor::Zeros({DType::kFloat32, {2}}));
  Initializer given{InitializerKind::kValue};
  given.value = value;
  Initializer again = given;
  EXPECT_TRUE(SameInitializer(given, again));
  again.value = copy;
  EXPECT_FALSE(SameInitializer(given, again)) << "another object: not compared by content";
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/model/initializer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/model/names.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(Names, VariableNamesAndRequestIds) {
  EXPECT_OK(ValidateVariableName("model/dense-1/kernel.0"));
  EXPECT_THAT(ValidateVariableName(std::string(257, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(ValidateRequestId("3f2a-11"));
  EXPECT_THAT(ValidateRequestId("has space"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateRequestId(std::string(65, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace repvar

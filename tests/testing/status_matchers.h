// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_TESTS_TESTING_STATUS_MATCHERS_H_
#define REPVAR_TESTS_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace repvar::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << s.ToString();
  return s.ok();
}

MATCHER_P(StatusIs, code, "has status code " + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << s.ToString();
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, substring,
           "has status code " + absl::StatusCodeToString(code) + " and a message containing \"" +
               std::string(substring) + "\"") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << s.ToString();
  return s.code() == code && s.message().find(substring) != absl::string_view::npos;
}

}  // namespace repvar::testing

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::repvar::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::repvar::testing::IsOk())

#endif  // REPVAR_TESTS_TESTING_STATUS_MATCHERS_H_

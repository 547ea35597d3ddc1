// SPDX-License-Identifier: Apache-2.0
#include "common/base/status_util.h"

#include <cstdio>
#include <cstdlib>

namespace repvar::internal {

void CheckFailed(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, cond);
  std::abort();
}

void CheckFailedMessage(const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, message.c_str());
  std::abort();
}

}  // namespace repvar::internal

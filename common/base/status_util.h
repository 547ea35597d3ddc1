// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_BASE_STATUS_UTIL_H_
#define REPVAR_COMMON_BASE_STATUS_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Abseil 20220623 has no status macros; these are ours.
#define REPVAR_STATUS_CONCAT_INNER_(a, b) a##b
#define REPVAR_STATUS_CONCAT_(a, b) REPVAR_STATUS_CONCAT_INNER_(a, b)

#define REPVAR_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status _repvar_status = (expr);          \
    if (!_repvar_status.ok()) return _repvar_status; \
  } while (0)

#define REPVAR_ASSIGN_OR_RETURN(lhs, expr) \
  REPVAR_ASSIGN_OR_RETURN_IMPL_(REPVAR_STATUS_CONCAT_(_repvar_sor_, __LINE__), lhs, expr)

#define REPVAR_ASSIGN_OR_RETURN_IMPL_(sor, lhs, expr) \
  auto sor = (expr);                                  \
  if (!sor.ok()) return sor.status();                 \
  lhs = std::move(sor).value()

// Broken internal invariants crash; anything a peer can trigger returns a Status.
#define REPVAR_CHECK(cond)                                                   \
  do {                                                                       \
    if (!(cond)) ::repvar::internal::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

// The same with a message built by the caller (only when the check fails).
#define REPVAR_CHECK_MSG(cond, message)                                                 \
  do {                                                                                  \
    if (!(cond)) ::repvar::internal::CheckFailedMessage(__FILE__, __LINE__, (message)); \
  } while (0)

namespace repvar::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond);
[[noreturn]] void CheckFailedMessage(const char* file, int line, const std::string& message);
}  // namespace repvar::internal

#endif  // REPVAR_COMMON_BASE_STATUS_UTIL_H_

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_NAMES_H_
#define REPVAR_COMMON_MODEL_NAMES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace repvar {

constexpr size_t kMaxVariableNameBytes = 256;
constexpr size_t kMaxRequestIdBytes = 64;

// Variable names: '/'-separated segments of [A-Za-z0-9_.-], no empty, "." or
// ".." segment, at most 256 bytes. Errors: INVALID_ARGUMENT.
absl::Status ValidateVariableName(absl::string_view name);
// Request ids: empty (no dedup) or at most 64 printable ASCII bytes.
absl::Status ValidateRequestId(absl::string_view id);

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_NAMES_H_

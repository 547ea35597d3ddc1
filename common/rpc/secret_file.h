// SPDX-License-Identifier: Apache-2.0
// Reading the files security is configured with (tokens, certificates,
// keys).
#ifndef REPVAR_COMMON_RPC_SECRET_FILE_H_
#define REPVAR_COMMON_RPC_SECRET_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace repvar {

// The whole of `path`; `what` names it in errors. Errors: INVALID_ARGUMENT
// (cannot be read, or empty).
absl::StatusOr<std::string> ReadFile(absl::string_view what, const std::string& path);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_SECRET_FILE_H_

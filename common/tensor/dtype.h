// SPDX-License-Identifier: Apache-2.0
// The dtype table: what each element type is made of.
#ifndef REPVAR_COMMON_TENSOR_DTYPE_H_
#define REPVAR_COMMON_TENSOR_DTYPE_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "repvar/types.h"

namespace repvar {

// Errors: INVALID_ARGUMENT for a number that names no dtype.
absl::StatusOr<DType> DTypeFromInt(int value);
// Bytes per element.
size_t ItemSize(DType dtype);
bool IsFloating(DType dtype);

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_DTYPE_H_

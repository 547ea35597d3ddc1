// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/dtype.h"

#include "absl/strings/str_cat.h"

namespace repvar {

absl::StatusOr<DType> DTypeFromInt(int value) {
  if (value >= static_cast<int>(DType::kFloat32) && value <= static_cast<int>(DType::kInt64)) {
    return static_cast<DType>(value);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype ", value,
                   "; supported: float32, float16, bfloat16, float64, int32, int64"));
}

size_t ItemSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

bool IsFloating(DType dtype) { return dtype != DType::kInt32 && dtype != DType::kInt64; }

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_DTYPE_H_
#define REPVAR_DTYPE_H_

namespace repvar {

// Element types. Numbers match repvar.v1.DType. Bytes are little-endian,
// row-major; bfloat16 and float16 travel as uint16_t bit patterns.
enum class DType : int {
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat64 = 4,
  kInt32 = 5,
  kInt64 = 6,
};

}  // namespace repvar

#endif  // REPVAR_DTYPE_H_

// SPDX-License-Identifier: Apache-2.0
// IEEE float16 and bfloat16 <-> float32, rounding to nearest even: the one
// implementation every path uses (element access, step arithmetic,
// initializers).
#ifndef REPVAR_COMMON_TENSOR_HALF_H_
#define REPVAR_COMMON_TENSOR_HALF_H_

#include <cstdint>

namespace repvar {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_HALF_H_

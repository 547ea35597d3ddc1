// SPDX-License-Identifier: Apache-2.0
// Element-wise arithmetic on whole tensors, in each dtype: reading and
// writing one element, the non-finite scan, and a + b / a - b (AssignAdd,
// AssignSub). The step reductions are in step_math.h.
#ifndef REPVAR_COMMON_TENSOR_ELEMENT_MATH_H_
#define REPVAR_COMMON_TENSOR_ELEMENT_MATH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"

namespace repvar {

// Index of the first NaN/Inf element, or -1. Integers are always finite.
int64_t FirstNonFinite(const Tensor& t);
// The same over `bytes`, elements of `dtype` (an index into them).
int64_t FirstNonFinite(DType dtype, std::span<const std::byte> bytes);
// Elementwise a + sign*b into a new tensor (f16/bf16 computed in f32 and
// rounded to nearest even; integers wrap around). Errors:
// FAILED_PRECONDITION if the specs differ.
absl::StatusOr<Tensor> AddScaled(const Tensor& a, const Tensor& b, int sign);

// Stores `v` (computed in double) at element `i` in the tensor's dtype
// (integers: floor).
void StoreElement(Tensor& t, int64_t i, double v);
double LoadElement(const Tensor& t, int64_t i);

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_ELEMENT_MATH_H_

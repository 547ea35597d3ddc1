// SPDX-License-Identifier: Apache-2.0
// The arithmetic of SUM/MEAN step aggregation (docs/contract.md S4):
//
//   value = begin + reduce_r(local_r - begin)        (SUM)
//   value = begin + reduce_r(local_r - begin) / R    (MEAN; R: the replicas
//                                                     taking part in the step)
//
// Deltas accumulate in a wider type than some dtypes: float16 and bfloat16 in
// float32, int32 in int64. Each worker first sums the deltas of its own
// replicas (in replica order) into an accumulator buffer; the workers then
// sum those buffers with a ring allreduce; every worker applies the same
// reduced buffer to the same begin value with the same code, so every replica
// ends bit-identical. When the ring does the arithmetic itself (a worker's
// data plane, FoldedRing), the same functions run on ranges: each element's
// delta and apply are computed once, the applied bits then shared.
#ifndef REPVAR_COMMON_TENSOR_STEP_MATH_H_
#define REPVAR_COMMON_TENSOR_STEP_MATH_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"

namespace repvar {

enum class AccumType { kFloat32 = 1, kFloat64 = 2, kInt64 = 3 };

AccumType AccumTypeFor(DType dtype);
size_t AccumSize(AccumType type);
const char* AccumTypeName(AccumType type);

// acc[i] += local[i] - begin[i] in the accumulator type of begin's dtype
// (`overwrite`: acc[i] = local[i] - begin[i], for the first local replica,
// so the buffer needs no clearing pass). `acc` holds NumElements()
// accumulator elements. Errors: FAILED_PRECONDITION when the specs differ or
// `acc` has the wrong size.
absl::Status AddDelta(const Tensor& begin, const Tensor& local, std::span<std::byte> acc,
                      bool overwrite = false);

// AddDelta on elements [lo, hi) of whole `begin` and `local` byte arrays of
// `dtype`: acc[i - lo] (+)= local[i] - begin[i]; `acc` holds hi - lo
// accumulator elements. For a ring that computes a member's contribution
// piece by piece, as it sends or adds each piece (GlooDataPlane).
void AddDeltaRange(DType dtype, const std::byte* begin, const std::byte* local, int64_t lo,
                   int64_t hi, std::byte* acc, bool overwrite);

struct Reduced {
  Tensor value;                  // with its checksum
  int64_t first_nonfinite = -1;  // index of the first NaN/Inf in value
};
// begin + acc / divisor (divisor 1 for SUM), rounded to begin's dtype. The
// checksum and the non-finite scan are taken in the same pass, block by
// block while the bytes are in cache. Errors: OUT_OF_RANGE when an integer
// result overflows its dtype; FAILED_PRECONDITION for a size mismatch or
// divisor < 1. `shared`: the result goes in a shared memfd mapping (a worker's
// large values, which trainers on its host then map without a copy).
absl::StatusOr<Reduced> ApplyReduced(const Tensor& begin, std::span<const std::byte> acc,
                                     int64_t divisor, bool shared = false);
// ApplyReduced's arithmetic on elements [lo, hi), without the checksum and
// the scan: out[i] = begin[i] + acc[i - lo] / divisor, rounded to `dtype`
// (`begin` and `out` are whole byte arrays; `acc` holds hi - lo accumulator
// elements). The same bits as ApplyReduced for those elements. Errors:
// OUT_OF_RANGE as ApplyReduced.
absl::Status ApplyRange(DType dtype, const std::byte* begin, const std::byte* acc, int64_t divisor,
                        int64_t lo, int64_t hi, std::byte* out);
// A value applied piece by piece (ApplyRange) made whole: its checksum and
// its first non-finite element, in one pass over its bytes.
Reduced Sealed(Tensor value);
// The same for a value whose bytes are still elsewhere (a piece of a
// buffer several values were reduced into): copies value.bytes.size()
// bytes from `from` into the value block by block, and scans and hashes
// each block while it is in cache: one pass instead of a copy and then
// Sealed's.
Reduced SealedCopy(Tensor value, const std::byte* from);

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_STEP_MATH_H_

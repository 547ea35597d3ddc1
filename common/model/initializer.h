// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_INITIALIZER_H_
#define REPVAR_COMMON_MODEL_INITIALIZER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"
#include "repvar/types.h"

namespace repvar {

// How a variable gets its first value (repvar.v1.Initializer), with a kValue
// value verified against its checksum. The coordinator
// generates the value once and broadcasts it, so every replica is identical.
struct Initializer {
  InitializerKind kind = InitializerKind::kNone;
  double constant = 0;
  double a = 0;  // mean or minval
  double b = 0;  // stddev or maxval
  uint64_t seed = 0;
  std::shared_ptr<const Tensor> value;  // kValue
};

// Generates the initial value. The random kinds use SplitMix64 (see
// types.proto RANDOM_GENERATOR_SPLITMIX64_V1), so a seed gives the same bytes
// on every host. Errors: INVALID_ARGUMENT for kNone, a value of another spec,
// or a bad range/stddev.
absl::StatusOr<Tensor> MakeInitialValue(const Initializer& init, const TensorSpec& spec);

// True when MakeInitialValue gives the same bytes for `a` and `b` with any
// one spec because they are the same initializer: every field equal, the
// numbers bit for bit, kValue's tensor the same object. (False says
// nothing: two initializers may still give the same bytes.)
bool SameInitializer(const Initializer& a, const Initializer& b);

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_INITIALIZER_H_

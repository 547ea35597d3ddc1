// SPDX-License-Identifier: Apache-2.0
#include "common/model/initializer.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "common/tensor/element_math.h"

namespace repvar {
namespace {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace

absl::StatusOr<Tensor> MakeInitialValue(const Initializer& init, const TensorSpec& spec) {
  using Kind = InitializerKind;
  if (init.kind == Kind::kNone) {
    return absl::InvalidArgumentError(
        "no initializer: give one at create or in the initialize call");
  }
  if (init.kind == Kind::kValue) {
    if (init.value == nullptr || !(init.value->spec == spec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("initializer value ", init.value ? init.value->spec.ToString() : "(none)",
                       " does not match the variable ", spec.ToString()));
    }
    return Tensor::FromBytes(spec, init.value->bytes.span());
  }
  if (init.kind == Kind::kRandomNormal && !(init.b >= 0 && std::isfinite(init.b))) {
    return absl::InvalidArgumentError("random_normal stddev must be finite and >= 0");
  }
  if (init.kind == Kind::kRandomUniform && !(init.a <= init.b)) {
    return absl::InvalidArgumentError("random_uniform needs minval <= maxval");
  }
  auto t = Tensor::Zeros(spec);
  if (!t.ok()) return t.status();
  auto n = spec.NumElements();
  if (!n.ok()) return n.status();
  switch (init.kind) {
    case Kind::kZeros:
      break;
    case Kind::kOnes:
    case Kind::kConstant: {
      double v = init.kind == Kind::kOnes ? 1.0 : init.constant;
      if (*n > 0) {
        // Fill the first element, then copy its bytes along.
        StoreElement(*t, 0, v);
        size_t item = ItemSize(spec.dtype);
        for (int64_t i = 1; i < *n; ++i) {
          std::memcpy(t->bytes.data() + i * item, t->bytes.data(), item);
        }
      }
      break;
    }
    case Kind::kRandomNormal: {
      SplitMix64 rng(init.seed);
      for (int64_t i = 0; i < *n; ++i) {
        double u1 = rng.Uniform();
        double u2 = rng.Uniform();
        double z = std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * std::numbers::pi * u2);
        StoreElement(*t, i, init.a + init.b * z);
      }
      break;
    }
    case Kind::kRandomUniform: {
      SplitMix64 rng(init.seed);
      for (int64_t i = 0; i < *n; ++i) {
        StoreElement(*t, i, init.a + (init.b - init.a) * rng.Uniform());
      }
      break;
    }
    default:
      break;
  }
  t->UpdateChecksum();
  return t;
}

bool SameInitializer(const Initializer& a, const Initializer& b) {
  auto bits = [](double d) { return std::bit_cast<uint64_t>(d); };
  return a.kind == b.kind && bits(a.constant) == bits(b.constant) && bits(a.a) == bits(b.a) &&
         bits(a.b) == bits(b.b) && a.seed == b.seed && a.value == b.value;
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/step_math.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/tensor/element.h"
#include "common/tensor/element_math.h"
#include "common/tensor/half.h"

namespace repvar {
namespace {

// Converts one element of `dtype` at `p[i]` to its accumulator type `A`.
template <typename A>
A Widen(DType dtype, const std::byte* p, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<A>(Load<float>(p, i));
    case DType::kFloat64:
      return static_cast<A>(Load<double>(p, i));
    case DType::kFloat16:
      return static_cast<A>(HalfToFloat(Load<uint16_t>(p, i)));
    case DType::kBFloat16:
      return static_cast<A>(BFloat16ToFloat(Load<uint16_t>(p, i)));
    case DType::kInt32:
      return static_cast<A>(Load<int32_t>(p, i));
    case DType::kInt64:
      return static_cast<A>(Load<int64_t>(p, i));
  }
  return A{};
}

template <typename A>
void AddDeltaTyped(DType dtype, const std::byte* begin, const std::byte* local, std::byte* acc,
                   int64_t n, bool overwrite) {
  if (dtype == DType::kFloat32 && std::is_same_v<A, float>) {
    // The hot case, without per-element dispatch, in loops the compiler
    // vectorizes (tensor and accumulator buffers are at least 4-byte aligned).
    const float* l = reinterpret_cast<const float*>(local);
    const float* b = reinterpret_cast<const float*>(begin);
    float* out = reinterpret_cast<float*>(acc);
    if (overwrite) {
      for (int64_t i = 0; i < n; ++i) out[i] = l[i] - b[i];
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] += l[i] - b[i];
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    A base = overwrite ? A{} : Load<A>(acc, i);
    Store<A>(acc, i, base + (Widen<A>(dtype, local, i) - Widen<A>(dtype, begin, i)));
  }
}

// Elements per block of the fused apply/checksum/scan pass (64 KiB of f32).
constexpr int64_t kBlock = 16384;

// Makes `value` whole block by block: fill(out, lo, hi) writes its
// elements [lo, hi) into `out` (its bytes), which are then scanned for the first non-finite one and
// hashed while they are in cache. Errors: fill's, at the first.
template <typename Fill>
absl::StatusOr<Reduced> SealInBlocks(Tensor value, Fill fill) {
  const DType dtype = value.spec.dtype;
  const size_t item = ItemSize(dtype);
  const int64_t n = static_cast<int64_t>(value.bytes.size() / item);
  ChecksumStream hash;
  int64_t first_nonfinite = -1;
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t hi = std::min(n, lo + kBlock);
    REPVAR_RETURN_IF_ERROR(fill(value.bytes.data(), lo, hi));
    const std::span<const std::byte> block(value.bytes.data() + lo * static_cast<int64_t>(item),
                                           static_cast<size_t>(hi - lo) * item);
    if (first_nonfinite < 0) {
      if (const int64_t k = FirstNonFinite(dtype, block); k >= 0) first_nonfinite = lo + k;
    }
    hash.Update(block);
  }
  value.checksum = hash.Digest();
  return Reduced{std::move(value), first_nonfinite};
}

}  // namespace

AccumType AccumTypeFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return AccumType::kFloat64;
    case DType::kInt32:
    case DType::kInt64:
      return AccumType::kInt64;
    default:
      return AccumType::kFloat32;
  }
}

size_t AccumSize(AccumType type) { return type == AccumType::kFloat32 ? 4 : 8; }

const char* AccumTypeName(AccumType type) {
  switch (type) {
    case AccumType::kFloat32:
      return "float32";
    case AccumType::kFloat64:
      return "float64";
    case AccumType::kInt64:
      return "int64";
  }
  return "?";
}

absl::Status AddDelta(const Tensor& begin, const Tensor& local, std::span<std::byte> acc,
                      bool overwrite) {
  if (!(begin.spec == local.spec)) {
    return absl::FailedPreconditionError(absl::StrCat("local value is ", local.spec.ToString(),
                                                      "; the variable is ", begin.spec.ToString()));
  }
  const int64_t n = static_cast<int64_t>(begin.bytes.size() / ItemSize(begin.spec.dtype));
  AccumType type = AccumTypeFor(begin.spec.dtype);
  if (acc.size() != static_cast<size_t>(n) * AccumSize(type)) {
    return absl::FailedPreconditionError("accumulator size does not match the variable");
  }
  const std::byte* b = begin.bytes.data();
  const std::byte* l = local.bytes.data();
  switch (type) {
    case AccumType::kFloat32:
      AddDeltaTyped<float>(begin.spec.dtype, b, l, acc.data(), n, overwrite);
      break;
    case AccumType::kFloat64:
      AddDeltaTyped<double>(begin.spec.dtype, b, l, acc.data(), n, overwrite);
      break;
    case AccumType::kInt64:
      AddDeltaTyped<int64_t>(begin.spec.dtype, b, l, acc.data(), n, overwrite);
      break;
  }
  return absl::OkStatus();
}

void AddDeltaRange(DType dtype, const std::byte* begin, const std::byte* local, int64_t lo,
                   int64_t hi, std::byte* acc, bool overwrite) {
  const int64_t skip = lo * static_cast<int64_t>(ItemSize(dtype));
  switch (AccumTypeFor(dtype)) {
    case AccumType::kFloat32:
      AddDeltaTyped<float>(dtype, begin + skip, local + skip, acc, hi - lo, overwrite);
      break;
    case AccumType::kFloat64:
      AddDeltaTyped<double>(dtype, begin + skip, local + skip, acc, hi - lo, overwrite);
      break;
    case AccumType::kInt64:
      AddDeltaTyped<int64_t>(dtype, begin + skip, local + skip, acc, hi - lo, overwrite);
      break;
  }
}

absl::Status ApplyRange(DType dtype, const std::byte* b, const std::byte* acc, int64_t divisor,
                        int64_t lo, int64_t hi, std::byte* o) {
  // `a` indexed like `b` and `o`: acc's first element is element lo.
  const std::byte* a = acc - lo * static_cast<int64_t>(AccumSize(AccumTypeFor(dtype)));
  switch (dtype) {
    case DType::kFloat32: {
      // The hot case: branch-free loops the compiler vectorizes.
      const float d = static_cast<float>(divisor);
      const float* fb = reinterpret_cast<const float*>(b);
      const float* fa = reinterpret_cast<const float*>(a);
      float* fo = reinterpret_cast<float*>(o);
      if (divisor == 1) {
        for (int64_t i = lo; i < hi; ++i) fo[i] = fb[i] + fa[i];
      } else {
        for (int64_t i = lo; i < hi; ++i) fo[i] = fb[i] + fa[i] / d;
      }
      break;
    }
    case DType::kFloat64: {
      const double d = static_cast<double>(divisor);
      for (int64_t i = lo; i < hi; ++i) {
        double sum = Load<double>(a, i);
        Store<double>(o, i, Load<double>(b, i) + (divisor == 1 ? sum : sum / d));
      }
      break;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const float d = static_cast<float>(divisor);
      const bool half = dtype == DType::kFloat16;
      for (int64_t i = lo; i < hi; ++i) {
        float sum = Load<float>(a, i);
        float v = Widen<float>(dtype, b, i) + (divisor == 1 ? sum : sum / d);
        Store<uint16_t>(o, i, half ? FloatToHalf(v) : FloatToBFloat16(v));
      }
      break;
    }
    case DType::kInt32:
    case DType::kInt64: {
      for (int64_t i = lo; i < hi; ++i) {
        int64_t base = Widen<int64_t>(dtype, b, i);
        int64_t sum = Load<int64_t>(a, i) / divisor;
        int64_t v = 0;
        if (__builtin_add_overflow(base, sum, &v) ||
            (dtype == DType::kInt32 && (v < std::numeric_limits<int32_t>::min() ||
                                        v > std::numeric_limits<int32_t>::max()))) {
          return absl::OutOfRangeError(
              absl::StrCat("the reduced value overflows ", DTypeName(dtype), " at element ", i));
        }
        if (dtype == DType::kInt32) {
          Store<int32_t>(o, i, static_cast<int32_t>(v));
        } else {
          Store<int64_t>(o, i, v);
        }
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Reduced> ApplyReduced(const Tensor& begin, std::span<const std::byte> acc,
                                     int64_t divisor, bool shared) {
  const DType dtype = begin.spec.dtype;
  const int64_t n = static_cast<int64_t>(begin.bytes.size() / ItemSize(dtype));
  const size_t acc_item = AccumSize(AccumTypeFor(dtype));
  if (acc.size() != static_cast<size_t>(n) * acc_item || divisor < 1) {
    return absl::FailedPreconditionError("reduced buffer does not match the variable");
  }
  absl::StatusOr<Tensor> out = Tensor::ForOverwrite(begin.spec, shared);
  if (!out.ok()) return out.status();
  return SealInBlocks(*std::move(out), [&](std::byte* o, int64_t lo, int64_t hi) {
    return ApplyRange(dtype, begin.bytes.data(), acc.data() + lo * static_cast<int64_t>(acc_item),
                      divisor, lo, hi, o);
  });
}

Reduced Sealed(Tensor value) {
  // Filling nothing cannot fail.
  return *SealInBlocks(std::move(value),
                       [](std::byte*, int64_t, int64_t) { return absl::OkStatus(); });
}

Reduced SealedCopy(Tensor value, const std::byte* from) {
  const size_t item = ItemSize(value.spec.dtype);
  return *SealInBlocks(std::move(value), [&](std::byte* to, int64_t lo, int64_t hi) {
    std::memcpy(to + lo * static_cast<int64_t>(item), from + lo * static_cast<int64_t>(item),
                static_cast<size_t>(hi - lo) * item);
    return absl::OkStatus();
  });
}

}  // namespace repvar

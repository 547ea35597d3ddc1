// SPDX-License-Identifier: Apache-2.0
#include "common/step_math.h"

#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace repvar {
namespace {

// Element access through memcpy: tensor buffers are aligned, accumulator
// spans may not be.
template <typename T>
T Get(const std::byte* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}
template <typename T>
void Put(std::byte* p, int64_t i, T v) {
  std::memcpy(p + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

// Converts one element of `dtype` at `p[i]` to its accumulator type `A`.
template <typename A>
A Widen(DType dtype, const std::byte* p, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<A>(Get<float>(p, i));
    case DType::kFloat64:
      return static_cast<A>(Get<double>(p, i));
    case DType::kFloat16:
      return static_cast<A>(HalfToFloat(Get<uint16_t>(p, i)));
    case DType::kBFloat16:
      return static_cast<A>(BFloat16ToFloat(Get<uint16_t>(p, i)));
    case DType::kInt32:
      return static_cast<A>(Get<int32_t>(p, i));
    case DType::kInt64:
      return static_cast<A>(Get<int64_t>(p, i));
  }
  return A{};
}

template <typename A>
void AddDeltaTyped(DType dtype, const std::byte* begin, const std::byte* local, std::byte* acc,
                   int64_t n) {
  if (dtype == DType::kFloat32 && std::is_same_v<A, float>) {
    // The hot case, without per-element dispatch.
    for (int64_t i = 0; i < n; ++i) {
      Put<float>(acc, i, Get<float>(acc, i) + (Get<float>(local, i) - Get<float>(begin, i)));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    Put<A>(acc, i, Get<A>(acc, i) + (Widen<A>(dtype, local, i) - Widen<A>(dtype, begin, i)));
  }
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

absl::Status AddDelta(const Tensor& begin, const Tensor& local, std::span<std::byte> acc) {
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
      AddDeltaTyped<float>(begin.spec.dtype, b, l, acc.data(), n);
      break;
    case AccumType::kFloat64:
      AddDeltaTyped<double>(begin.spec.dtype, b, l, acc.data(), n);
      break;
    case AccumType::kInt64:
      AddDeltaTyped<int64_t>(begin.spec.dtype, b, l, acc.data(), n);
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ApplyReduced(const Tensor& begin, std::span<const std::byte> acc,
                                    int64_t divisor) {
  const DType dtype = begin.spec.dtype;
  const int64_t n = static_cast<int64_t>(begin.bytes.size() / ItemSize(dtype));
  AccumType type = AccumTypeFor(dtype);
  if (acc.size() != static_cast<size_t>(n) * AccumSize(type) || divisor < 1) {
    return absl::FailedPreconditionError("reduced buffer does not match the variable");
  }
  absl::StatusOr<Tensor> out_or = Tensor::Zeros(begin.spec);
  if (!out_or.ok()) return out_or.status();
  Tensor out = *std::move(out_or);
  const std::byte* b = begin.bytes.data();
  const std::byte* a = acc.data();
  std::byte* o = out.bytes.data();
  switch (dtype) {
    case DType::kFloat32: {
      const float d = static_cast<float>(divisor);
      for (int64_t i = 0; i < n; ++i) {
        float sum = Get<float>(a, i);
        Put<float>(o, i, Get<float>(b, i) + (divisor == 1 ? sum : sum / d));
      }
      break;
    }
    case DType::kFloat64: {
      const double d = static_cast<double>(divisor);
      for (int64_t i = 0; i < n; ++i) {
        double sum = Get<double>(a, i);
        Put<double>(o, i, Get<double>(b, i) + (divisor == 1 ? sum : sum / d));
      }
      break;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const float d = static_cast<float>(divisor);
      const bool half = dtype == DType::kFloat16;
      for (int64_t i = 0; i < n; ++i) {
        float sum = Get<float>(a, i);
        float v = Widen<float>(dtype, b, i) + (divisor == 1 ? sum : sum / d);
        Put<uint16_t>(o, i, half ? FloatToHalf(v) : FloatToBFloat16(v));
      }
      break;
    }
    case DType::kInt32:
    case DType::kInt64: {
      for (int64_t i = 0; i < n; ++i) {
        int64_t base = Widen<int64_t>(dtype, b, i);
        int64_t sum = Get<int64_t>(a, i) / divisor;
        int64_t v = 0;
        if (__builtin_add_overflow(base, sum, &v) ||
            (dtype == DType::kInt32 && (v < std::numeric_limits<int32_t>::min() ||
                                        v > std::numeric_limits<int32_t>::max()))) {
          return absl::OutOfRangeError(
              absl::StrCat("the reduced value overflows ", DTypeName(dtype), " at element ", i));
        }
        if (dtype == DType::kInt32) {
          Put<int32_t>(o, i, static_cast<int32_t>(v));
        } else {
          Put<int64_t>(o, i, v);
        }
      }
      break;
    }
  }
  out.UpdateChecksum();
  return out;
}

}  // namespace repvar

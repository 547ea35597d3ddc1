// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/element_math.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/tensor/element.h"
#include "common/tensor/half.h"

namespace repvar {

double LoadElement(const Tensor& t, int64_t i) {
  const std::byte* p = t.bytes.data();
  switch (t.spec.dtype) {
    case DType::kFloat32:
      return Load<float>(p, i);
    case DType::kFloat64:
      return Load<double>(p, i);
    case DType::kFloat16:
      return HalfToFloat(Load<uint16_t>(p, i));
    case DType::kBFloat16:
      return BFloat16ToFloat(Load<uint16_t>(p, i));
    case DType::kInt32:
      return Load<int32_t>(p, i);
    case DType::kInt64:
      return static_cast<double>(Load<int64_t>(p, i));
  }
  return 0;
}

void StoreElement(Tensor& t, int64_t i, double v) {
  std::byte* p = t.bytes.data();
  switch (t.spec.dtype) {
    case DType::kFloat32:
      Store<float>(p, i, static_cast<float>(v));
      return;
    case DType::kFloat64:
      Store<double>(p, i, v);
      return;
    case DType::kFloat16:
      Store<uint16_t>(p, i, FloatToHalf(static_cast<float>(v)));
      return;
    case DType::kBFloat16:
      Store<uint16_t>(p, i, FloatToBFloat16(static_cast<float>(v)));
      return;
    case DType::kInt32:
      Store<int32_t>(p, i, static_cast<int32_t>(std::floor(v)));
      return;
    case DType::kInt64:
      Store<int64_t>(p, i, static_cast<int64_t>(std::floor(v)));
      return;
  }
}

namespace {

// The index of the first element of `n` whose exponent bits (`mask`) are
// all set (Inf or NaN), or -1. Blocks are tested without a branch per
// element, so the compiler vectorizes the test; only a block that holds
// one is searched element by element.
template <typename U>
int64_t FirstWithAllBits(const std::byte* p, int64_t n, U mask) {
  constexpr int64_t kBlock = 4096;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    U hit = 0;
    for (int64_t i = start; i < end; ++i) {
      hit |= static_cast<U>((Load<U>(p, i) & mask) == mask);
    }
    if (hit == 0) continue;
    for (int64_t i = start; i < end; ++i) {
      if ((Load<U>(p, i) & mask) == mask) return i;
    }
  }
  return -1;
}

}  // namespace

int64_t FirstNonFinite(const Tensor& t) { return FirstNonFinite(t.spec.dtype, t.bytes.span()); }

int64_t FirstNonFinite(DType dtype, std::span<const std::byte> bytes) {
  if (!IsFloating(dtype)) return -1;
  const int64_t n = static_cast<int64_t>(bytes.size() / ItemSize(dtype));
  const std::byte* p = bytes.data();
  switch (dtype) {
    case DType::kFloat32:
      return FirstWithAllBits<uint32_t>(p, n, 0x7f800000u);
    case DType::kFloat64:
      return FirstWithAllBits<uint64_t>(p, n, 0x7ff0000000000000ull);
    case DType::kFloat16:
      return FirstWithAllBits<uint16_t>(p, n, 0x7c00);
    case DType::kBFloat16:
      return FirstWithAllBits<uint16_t>(p, n, 0x7f80);
    default:
      return -1;
  }
}

namespace {
template <typename T>
void AddLoop(const std::byte* a, const std::byte* b, std::byte* out, int64_t n, int sign) {
  for (int64_t i = 0; i < n; ++i) {
    T x = Load<T>(a, i), y = Load<T>(b, i);
    T r;
    if constexpr (std::is_integral_v<T>) {
      // Wrap around like TensorFlow's integer arithmetic (no UB).
      using U = std::make_unsigned_t<T>;
      r = static_cast<T>(sign > 0 ? static_cast<U>(x) + static_cast<U>(y)
                                  : static_cast<U>(x) - static_cast<U>(y));
    } else {
      r = sign > 0 ? x + y : x - y;
    }
    Store<T>(out, i, r);
  }
}
}  // namespace

absl::StatusOr<Tensor> AddScaled(const Tensor& a, const Tensor& b, int sign) {
  if (!(a.spec == b.spec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("operand ", b.spec.ToString(), " does not match ", a.spec.ToString()));
  }
  auto buf = Buffer::Allocate(a.bytes.size());
  if (!buf.ok()) return buf.status();
  Tensor out;
  out.spec = a.spec;
  out.bytes = *std::move(buf);
  int64_t n = static_cast<int64_t>(a.bytes.size() / ItemSize(a.spec.dtype));
  const std::byte* pa = a.bytes.data();
  const std::byte* pb = b.bytes.data();
  std::byte* po = out.bytes.data();
  switch (a.spec.dtype) {
    case DType::kFloat32:
      AddLoop<float>(pa, pb, po, n, sign);
      break;
    case DType::kFloat64:
      AddLoop<double>(pa, pb, po, n, sign);
      break;
    case DType::kInt32:
      AddLoop<int32_t>(pa, pb, po, n, sign);
      break;
    case DType::kInt64:
      AddLoop<int64_t>(pa, pb, po, n, sign);
      break;
    case DType::kFloat16:
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) {
        double x = LoadElement(a, i), y = LoadElement(b, i);
        float r = static_cast<float>(x) + (sign > 0 ? 1.0f : -1.0f) * static_cast<float>(y);
        StoreElement(out, i, r);
      }
      break;
  }
  out.UpdateChecksum();
  return out;
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// Element access in raw tensor bytes, through memcpy: tensor buffers are
// aligned, accumulator spans and wire buffers may not be. Shared by the
// element arithmetic and the step arithmetic.
#ifndef REPVAR_COMMON_TENSOR_ELEMENT_H_
#define REPVAR_COMMON_TENSOR_ELEMENT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace repvar {

template <typename T>
T Load(const std::byte* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <typename T>
void Store(std::byte* p, int64_t i, T v) {
  std::memcpy(p + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_ELEMENT_H_

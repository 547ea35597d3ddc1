// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_TESTS_TESTING_TENSORS_H_
#define REPVAR_TESTS_TESTING_TENSORS_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor/tensor.h"

namespace repvar::testing {

// A float32 tensor of shape `dims`; a vector of the values when `dims` is
// left out.
inline std::shared_ptr<const Tensor> F32(std::vector<float> v, std::vector<int64_t> dims) {
  auto t =
      Tensor::FromBytes(TensorSpec{DType::kFloat32, std::move(dims)}, std::as_bytes(std::span(v)));
  return std::make_shared<const Tensor>(*std::move(t));
}
inline std::shared_ptr<const Tensor> F32(std::vector<float> v) {
  const auto n = static_cast<int64_t>(v.size());
  return F32(std::move(v), {n});
}

// The values of a float32 tensor.
inline std::vector<float> Floats(const Tensor& t) {
  std::vector<float> out(t.bytes.size() / sizeof(float));
  std::memcpy(out.data(), t.bytes.data(), out.size() * sizeof(float));
  return out;
}

// The bytes of float32 values, as a wire message carries them.
inline std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_TENSORS_H_

// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/tensor.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(TensorSpec, ByteSize_OverflowNegativeAndRank) {
  EXPECT_EQ(*(TensorSpec{DType::kFloat32, {}}.ByteSize()), 4);
  EXPECT_EQ(*(TensorSpec{DType::kBFloat16, {2, 0, 5}}.ByteSize()), 0);
  EXPECT_THAT((TensorSpec{DType::kFloat32, {-1}}.ByteSize()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((TensorSpec{DType::kInt64, {int64_t{1} << 31, int64_t{1} << 31}}.ByteSize()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((TensorSpec{DType::kFloat32, std::vector<int64_t>(33, 1)}.ByteSize()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Checksum, IsXxh3Of64Bits) {
  const char text[] = "repvar";
  EXPECT_EQ(Checksum(std::as_bytes(std::span(text, 6))), XXH3_64bits(text, 6));
}

// The dispatching (vectorized) path gives the library's portable value, one
// shot or streamed in uneven pieces, over sizes that take every code path
// (short inputs, one stripe, many blocks and a tail).
TEST(Checksum, DispatchedAndStreamed_EqualTheBaselineXxh3) {
  std::vector<unsigned char> data((3 << 20) + 77);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{3}, size_t{200}, size_t{4096}, data.size()}) {
    auto bytes = std::as_bytes(std::span(data.data(), n));
    const uint64_t expect = XXH3_64bits(data.data(), n);
    EXPECT_EQ(Checksum(bytes), expect) << n;
    ChecksumStream stream;
    for (size_t off = 0, piece = 1; off < n; off += piece, piece = piece * 3 + 1) {
      stream.Update(bytes.subspan(off, std::min(piece, n - off)));
    }
    EXPECT_EQ(stream.Digest(), expect) << n;
    stream.Reset();
    stream.Update(bytes);
    EXPECT_EQ(stream.Digest(), expect) << n;
  }
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/step_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

Tensor Make(DType dtype, const std::vector<double>& v) {
  Tensor t = *Tensor::Zeros(TensorSpec{dtype, {static_cast<int64_t>(v.size())}});
  for (size_t i = 0; i < v.size(); ++i) StoreElement(t, static_cast<int64_t>(i), v[i]);
  t.UpdateChecksum();
  return t;
}

TEST(StepMathTest, S4_Mean_BeginPlusMeanOfDeltas_Float32Exact) {
  Tensor begin = Make(DType::kFloat32, {10, 20});
  std::vector<std::byte> acc(2 * AccumSize(AccumType::kFloat32));
  for (int r = 1; r <= 4; ++r) {
    ASSERT_TRUE(AddDelta(begin, Make(DType::kFloat32, {10.0 + r, 20.0 - r}), acc).ok());
  }
  auto out = ApplyReduced(begin, acc, 4);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(LoadElement(out->value, 0), 12.5);
  EXPECT_EQ(LoadElement(out->value, 1), 17.5);
  EXPECT_EQ(out->value.checksum, Checksum(out->value.bytes.span()));
  EXPECT_EQ(out->first_nonfinite, -1);
}

TEST(StepMathTest, S4_BFloat16AccumulatesInFloat32) {
  // 256 + 1 + 1 is 256 in bfloat16 step by step, 258 when accumulated in f32.
  Tensor begin = Make(DType::kBFloat16, {256});
  std::vector<std::byte> acc(AccumSize(AccumTypeFor(DType::kBFloat16)));
  ASSERT_EQ(AccumTypeFor(DType::kBFloat16), AccumType::kFloat32);
  Tensor plus_one = Make(DType::kBFloat16, {257});  // rounds to 256 in bf16
  ASSERT_TRUE(AddDelta(begin, plus_one, acc).ok());
  float one = 2.0f;
  std::memcpy(acc.data(), &one, 4);  // two replicas each adding 1, as the ring delivers
  auto out = ApplyReduced(begin, acc, 1);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(LoadElement(out->value, 0), 258);
}

TEST(StepMathTest, S4_FusedPass_ChecksumAndFirstNonFiniteOverManyBlocks) {
  std::vector<double> zeros(100000, 0.0);
  Tensor begin = Make(DType::kFloat32, zeros);
  std::vector<double> local = zeros;
  local[70000] = std::numeric_limits<double>::infinity();
  std::vector<std::byte> acc(zeros.size() * 4);
  ASSERT_TRUE(AddDelta(begin, Make(DType::kFloat32, local), acc, /*overwrite=*/true).ok());
  auto out = ApplyReduced(begin, acc, 2);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->first_nonfinite, 70000);
  EXPECT_EQ(out->value.checksum, Checksum(out->value.bytes.span()));
}

TEST(StepMathTest, S4_IntegerSumOverflow_OutOfRange) {
  Tensor begin = Make(DType::kInt32, {2147483600});
  std::vector<std::byte> acc(AccumSize(AccumType::kInt64));
  ASSERT_TRUE(AddDelta(begin, Make(DType::kInt32, {2147483647}), acc).ok());
  ASSERT_TRUE(AddDelta(begin, Make(DType::kInt32, {2147483647}), acc).ok());
  EXPECT_EQ(ApplyReduced(begin, acc, 1).status().code(), absl::StatusCode::kOutOfRange);
}

// The ring's pieces (AddDeltaRange, ApplyRange over uneven ranges, then
// Sealed, or SealedCopy out of a buffer several values share) give the same
// bits, checksum and first non-finite element as the whole-tensor passes,
// for every floating dtype; a non-finite element sits past the first block.
TEST(StepMathTest, S4_InPieces_SameBitsChecksumAndNonFiniteAsWhole) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 40000;
    std::vector<double> b(n), l1(n), l2(n);
    for (int64_t i = 0; i < n; ++i) {
      b[i] = static_cast<double>(i % 97) / 4;
      l1[i] = b[i] + static_cast<double>(i % 13) / 8;
      l2[i] = b[i] - static_cast<double>(i % 7) / 2;
    }
    l2[30001] = std::numeric_limits<double>::infinity();
    const Tensor begin = Make(dtype, b), one = Make(dtype, l1), two = Make(dtype, l2);
    const size_t acc_item = AccumSize(AccumTypeFor(dtype));
    std::vector<std::byte> whole(n * acc_item);
    ASSERT_OK(AddDelta(begin, one, whole, /*overwrite=*/true));
    ASSERT_OK(AddDelta(begin, two, whole));
    auto expected = ApplyReduced(begin, whole, 3);
    ASSERT_OK(expected);

    Tensor out = *Tensor::ForOverwrite(begin.spec);
    for (int64_t lo = 0; lo < n;) {
      const int64_t hi = std::min(n, lo + 777 + lo % 5000);
      std::vector<std::byte> piece((hi - lo) * acc_item);
      AddDeltaRange(dtype, begin.bytes.data(), one.bytes.data(), lo, hi, piece.data(), true);
      AddDeltaRange(dtype, begin.bytes.data(), two.bytes.data(), lo, hi, piece.data(), false);
      ASSERT_OK(ApplyRange(dtype, begin.bytes.data(), piece.data(), 3, lo, hi, out.bytes.data()));
      lo = hi;
    }
    // The same bytes at an offset in a larger buffer, as a folded reduction
    // of several variables leaves them.
    std::vector<std::byte> shared(out.bytes.size() + 24);
    std::memcpy(shared.data() + 24, out.bytes.data(), out.bytes.size());
    const Reduced got = Sealed(std::move(out));
    const Reduced copied = SealedCopy(*Tensor::ForOverwrite(begin.spec), shared.data() + 24);
    for (const Reduced* r : {&got, &copied}) {
      EXPECT_EQ(std::memcmp(r->value.bytes.data(), expected->value.bytes.data(),
                            expected->value.bytes.size()),
                0);
      EXPECT_EQ(r->value.checksum, expected->value.checksum);
      EXPECT_EQ(r->first_nonfinite, 30001);
    }
    EXPECT_EQ(expected->first_nonfinite, 30001);
  }
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/model/device_name.h"
#include "common/model/initializer.h"
#include "common/model/names.h"
#include "common/tensor/chunk_assembler.h"
#include "common/tensor/element_math.h"
#include "common/tensor/half.h"
#include "common/tensor/step_math.h"
#include "common/tensor/tensor.h"
#include "tests/testing/status_matchers.h"
#include "xxhash.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(DeviceName, Parse_FullName_RoundTrips) {
  auto d = DeviceName::Parse("/job:tpu_worker/replica:0/task:12/device:TPU:3");
  ASSERT_OK(d);
  EXPECT_EQ(d->job, "tpu_worker");
  EXPECT_EQ(d->task, 12);
  EXPECT_EQ(d->type, "TPU");
  EXPECT_EQ(d->id, 3);
  EXPECT_TRUE(d->IsAccelerator());
  EXPECT_EQ(d->ToString(), "/job:tpu_worker/replica:0/task:12/device:TPU:3");
  EXPECT_EQ(d->HostCpu(), "/job:tpu_worker/replica:0/task:12/device:CPU:0");
}

TEST(DeviceName, Parse_Malformed_InvalidArgument) {
  std::string nul("/job:w/replica:0/task:0/device:TPU:0\0", 37);
  for (std::string bad :
       {std::string(""), std::string("job:w/replica:0/task:0/device:TPU:0"),
        std::string("/job:w/replica:0/task:0/device:TPU:0/"),
        std::string("/job:w/task:0/device:TPU:0"),
        std::string("/job:w/replica:0/task:+1/device:TPU:0"),
        std::string("/job:w/replica:0/task:2147483648/device:TPU:0"),
        std::string("/job:ｊob/replica:0/task:0/device:TPU:0"),
        std::string("/job:w/replica:0/task:0/device:FPGA:0"),
        std::string("/job:w/replica:0/task:0/device:TPU:x"),
        std::string("/job:w/job:w/task:0/device:TPU:0"), nul, std::string(300, 'a')}) {
    EXPECT_THAT(DeviceName::Parse(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(DeviceName, Order_IsNumericPerField) {
  auto a = *DeviceName::Parse("/job:w/replica:0/task:9/device:TPU:0");
  auto b = *DeviceName::Parse("/job:w/replica:0/task:10/device:TPU:0");
  EXPECT_LT(a, b);
}

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

Tensor Iota(int n) {
  auto t = Tensor::Zeros(TensorSpec{DType::kFloat32, {n}});
  for (int i = 0; i < n; ++i) StoreElement(*t, i, i);
  t->UpdateChecksum();
  return *std::move(t);
}

TEST(ChunkAssembler, InOrderChunks_RebuildTheTensor) {
  Tensor src = Iota(1000);
  auto a = ChunkAssembler::Start(src.spec, src.bytes.size(), src.checksum, UINT64_MAX);
  ASSERT_OK(a);
  ForEachChunk(src.bytes.span(), 1000, [&](uint64_t off, std::span<const std::byte> p) {
    ASSERT_OK(a->Add(off, p, Checksum(p)));
  });
  auto t = a->Finish();
  ASSERT_OK(t);
  EXPECT_EQ(std::memcmp(t->bytes.data(), src.bytes.data(), src.bytes.size()), 0);
}

TEST(ChunkAssembler, BadInput_InvalidArgument) {
  Tensor src = Iota(1000);
  auto bytes = src.bytes.span();
  auto start = [&] {
    return *ChunkAssembler::Start(src.spec, bytes.size(), src.checksum, UINT64_MAX);
  };
  {  // out of order
    auto a = start();
    EXPECT_THAT(a.Add(100, bytes.subspan(100, 100), Checksum(bytes.subspan(100, 100))),
                StatusIs(absl::StatusCode::kInvalidArgument, "out of order"));
  }
  {  // bad chunk checksum
    auto a = start();
    EXPECT_THAT(a.Add(0, bytes.subspan(0, 100), 1234),
                StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  {  // truncated
    auto a = start();
    ASSERT_OK(a.Add(0, bytes.subspan(0, 100), Checksum(bytes.subspan(0, 100))));
    EXPECT_THAT(a.Finish(), StatusIs(absl::StatusCode::kInvalidArgument, "truncated"));
  }
  {  // whole-tensor checksum
    auto a = *ChunkAssembler::Start(src.spec, bytes.size(), src.checksum + 1, UINT64_MAX);
    ASSERT_OK(a.Add(0, bytes, Checksum(bytes)));
    EXPECT_THAT(a.Finish(), StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  {  // overrun: header says fewer bytes than the spec
    EXPECT_THAT(ChunkAssembler::Start(src.spec, 10, 0, UINT64_MAX),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  {  // too big
    EXPECT_THAT(ChunkAssembler::Start(src.spec, bytes.size(), 0, 100),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }
}

TEST(HalfFloat, RoundTripsAndRounds) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.5f)), 1.5f);
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
}

TEST(AddScaled, F16AccumulatesInF32AndIntegersWrap) {
  auto a = *Tensor::Zeros(TensorSpec{DType::kFloat16, {2}});
  StoreElement(a, 0, 1.0);
  StoreElement(a, 1, 2048.0);
  auto b = *Tensor::Zeros(TensorSpec{DType::kFloat16, {2}});
  StoreElement(b, 0, 0.5);
  StoreElement(b, 1, 1.0);
  auto sum = AddScaled(a, b, 1);
  ASSERT_OK(sum);
  EXPECT_EQ(LoadElement(*sum, 0), 1.5);
  EXPECT_EQ(LoadElement(*sum, 1), 2048.0);  // 2049 rounds to even in f16
  auto i = *Tensor::Zeros(TensorSpec{DType::kInt32, {1}});
  StoreElement(i, 0, 2147483647.0);
  auto one = *Tensor::Zeros(TensorSpec{DType::kInt32, {1}});
  StoreElement(one, 0, 1);
  EXPECT_EQ(LoadElement(*AddScaled(i, one, 1), 0), -2147483648.0);
}

TEST(Initializer, ConstantsAndSeededRandomAreDeterministic) {
  TensorSpec spec{DType::kFloat32, {5}};
  auto c = MakeInitialValue({InitializerKind::kConstant, 2.5}, spec);
  ASSERT_OK(c);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(LoadElement(*c, i), 2.5);
  Initializer n{InitializerKind::kRandomNormal, 0, 1.0, 2.0, 99};
  EXPECT_EQ(MakeInitialValue(n, spec)->checksum, MakeInitialValue(n, spec)->checksum);
  n.seed = 100;
  EXPECT_NE(MakeInitialValue(n, spec)->checksum,
            MakeInitialValue({InitializerKind::kRandomNormal, 0, 1.0, 2.0, 99}, spec)->checksum);
  EXPECT_THAT(MakeInitialValue({}, spec), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MakeInitialValue({InitializerKind::kRandomUniform, 0, 2, 1, 0}, spec),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(FirstNonFinite, FindsNanAndInfInEveryFloatType) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    auto t = *Tensor::Zeros(TensorSpec{d, {4}});
    EXPECT_EQ(FirstNonFinite(t), -1);
    StoreElement(t, 2, std::numeric_limits<double>::infinity());
    EXPECT_EQ(FirstNonFinite(t), 2) << DTypeName(d);
  }
}

TEST(Names, VariableNamesAndRequestIds) {
  EXPECT_OK(ValidateVariableName("model/dense-1/kernel.0"));
  EXPECT_THAT(ValidateVariableName(std::string(257, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(ValidateRequestId("3f2a-11"));
  EXPECT_THAT(ValidateRequestId("has space"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateRequestId(std::string(65, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace repvar

namespace repvar {
namespace {

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

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/model/initializer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

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

// The same initializer (every field, numbers bit for bit, kValue's tensor
// the same object) is what lets a batched initialize share one value.
TEST(Initializer, SameInitializer_EveryFieldBitForBit) {
  const Initializer normal{InitializerKind::kRandomNormal, 0, 0.5, 2.0, 99};
  EXPECT_TRUE(SameInitializer(normal, normal));
  for (auto spoil : std::vector<std::function<void(Initializer&)>>{
           [](Initializer& i) { i.kind = InitializerKind::kRandomUniform; },
           [](Initializer& i) { i.seed = 100; },
           [](Initializer& i) { i.a = -0.5; },
           [](Initializer& i) { i.b = 2.5; },
           [](Initializer& i) { i.constant = 1; },
       }) {
    Initializer other = normal;
    spoil(other);
    EXPECT_FALSE(SameInitializer(normal, other));
  }
  Initializer zero{InitializerKind::kConstant, 0.0};
  Initializer negative_zero{InitializerKind::kConstant, -0.0};
  EXPECT_FALSE(SameInitializer(zero, negative_zero)) << "different bytes";
  Initializer nan{InitializerKind::kConstant, std::numeric_limits<double>::quiet_NaN()};
  EXPECT_TRUE(SameInitializer(nan, nan));
  const auto value = std::make_shared<const Tensor>(*Tensor::Zeros({DType::kFloat32, {2}}));
  const auto copy = std::make_shared<const Tensor>(*Tensor::Zeros({DType::kFloat32, {2}}));
  Initializer given{InitializerKind::kValue};
  given.value = value;
  Initializer again = given;
  EXPECT_TRUE(SameInitializer(given, again));
  again.value = copy;
  EXPECT_FALSE(SameInitializer(given, again)) << "another object: not compared by content";
}

// C5: the seeded generators are pinned by golden vectors computed by an
// independent reference (Python, written from types.proto's text of
// RANDOM_GENERATOR_SPLITMIX64_V1), bit for bit in float64 and float32, and
// floored for integers.
TEST(Initializer, C5_SeededGenerators_MatchGoldenVectors) {
  const Initializer normal{InitializerKind::kRandomNormal, 0, 0.0, 1.0, 7};
  const Initializer uniform{InitializerKind::kRandomUniform, 0, -1.0, 1.0, 7};
  auto bits64 = [](const Tensor& t) {
    std::vector<uint64_t> out(t.bytes.size() / 8);
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
    return out;
  };
  auto bits32 = [](const Tensor& t) {
    std::vector<uint32_t> out(t.bytes.size() / 4);
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
    return out;
  };
  auto n64 = MakeInitialValue(normal, {DType::kFloat64, {4}});
  auto n32 = MakeInitialValue(normal, {DType::kFloat32, {4}});
  auto u64 = MakeInitialValue(uniform, {DType::kFloat64, {4}});
  auto u32 = MakeInitialValue(uniform, {DType::kFloat32, {4}});
  auto ints =
      MakeInitialValue({InitializerKind::kRandomUniform, 0, -10.0, 10.0, 7}, {DType::kInt32, {6}});
  ASSERT_OK(n64);
  ASSERT_OK(n32);
  ASSERT_OK(u64);
  ASSERT_OK(u32);
  ASSERT_OK(ints);
  EXPECT_EQ(bits64(*n64), (std::vector<uint64_t>{0x3fefa194ec47d228, 0xbffdd3fde5949e97,
                                                 0x3f700ea29c8645d8, 0xbfe0efc91ba890b4}));
  EXPECT_EQ(bits32(*n32), (std::vector<uint32_t>{0x3f7d0ca7, 0xbfee9fef, 0x3b807515, 0xbf077e49}));
  EXPECT_EQ(bits64(*u64), (std::vector<uint64_t>{0xbfcc341e1ba6cdf8, 0xbfeeecf0ca02f0e8,
                                                 0x3fe9a610202eac4a, 0x3fc53aeb70673e28}));
  EXPECT_EQ(bits32(*u32), (std::vector<uint32_t>{0xbe61a0f1, 0xbf776786, 0x3f4d3081, 0x3e29d75c}));
  std::vector<int32_t> floored(6);
  std::memcpy(floored.data(), ints->bytes.data(), ints->bytes.size());
  EXPECT_EQ(floored, (std::vector<int32_t>{-3, -10, 8, 1, -1, -6}));
}

// C5: over 10^6 draws each generator's sample mean and standard deviation
// lie within 3 standard errors of the distribution's.
TEST(Initializer, C5_SeededGenerators_MomentsWithinThreeStandardErrors) {
  constexpr int64_t kDraws = 1000000;
  auto moments = [](const Tensor& t) {
    double sum = 0, sq = 0;
    const auto* v = reinterpret_cast<const double*>(t.bytes.data());
    for (int64_t i = 0; i < kDraws; ++i) sum += v[i];
    const double mean = sum / kDraws;
    for (int64_t i = 0; i < kDraws; ++i) sq += (v[i] - mean) * (v[i] - mean);
    return std::pair<double, double>{mean, std::sqrt(sq / (kDraws - 1))};
  };
  const double n = kDraws;
  // Normal(mean 1.5, stddev 2): SE(mean) = s / sqrt(n), SE(stddev) = s / sqrt(2n).
  auto normal = MakeInitialValue({InitializerKind::kRandomNormal, 0, 1.5, 2.0, 11},
                                 {DType::kFloat64, {kDraws}});
  ASSERT_OK(normal);
  auto [nm, ns] = moments(*normal);
  EXPECT_NEAR(nm, 1.5, 3 * 2.0 / std::sqrt(n));
  EXPECT_NEAR(ns, 2.0, 3 * 2.0 / std::sqrt(2 * n));
  // Uniform[-1, 3): mean 1, stddev w / sqrt(12) with w = 4; SE(stddev) from
  // the fourth central moment w^4 / 80: sqrt((w^4/80 - s^4) / n) / (2 s).
  auto uniform = MakeInitialValue({InitializerKind::kRandomUniform, 0, -1.0, 3.0, 11},
                                  {DType::kFloat64, {kDraws}});
  ASSERT_OK(uniform);
  auto [um, us] = moments(*uniform);
  const double w = 4, s = w / std::sqrt(12.0);
  EXPECT_NEAR(um, 1.0, 3 * s / std::sqrt(n));
  EXPECT_NEAR(us, s, 3 * std::sqrt((std::pow(w, 4) / 80 - std::pow(s, 4)) / n) / (2 * s));
  auto [lo, hi] =
      std::minmax_element(reinterpret_cast<const double*>(uniform->bytes.data()),
                          reinterpret_cast<const double*>(uniform->bytes.data()) + kDraws);
  EXPECT_GE(*lo, -1.0);
  EXPECT_LT(*hi, 3.0);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// The client's conversions between the API's messages and the public types.
#include "client/convert.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace repvar::client_internal {
namespace {

using ::repvar::testing::StatusIs;

TEST(ClientConvert, InitializerValue_MustFitTheVariable) {
  std::vector<float> v = {1, 2, 3};
  auto init =
      InitializerFromSpec(InitializerSpec::Value(std::span<const float>(v)), DType::kFloat32, {3});
  ASSERT_OK(init);
  EXPECT_EQ(init->kind, InitializerKind::kValue);
  EXPECT_EQ(init->value->bytes.size(), 12u);
  EXPECT_THAT(
      InitializerFromSpec(InitializerSpec::Value(std::span<const float>(v)), DType::kFloat32, {4}),
      StatusIs(absl::StatusCode::kInvalidArgument, "needs 16 bytes"));
  auto seeded = InitializerFromSpec(InitializerSpec::RandomNormal(0, 1, 9), DType::kFloat32, {3});
  EXPECT_EQ(seeded->seed, 9u);
}

TEST(ClientConvert, TensorValue_ChecksumVerified) {
  v1::Tensor t;
  std::string data(8, '\1');
  t.mutable_header()->mutable_spec()->set_dtype(v1::DTYPE_INT32);
  t.mutable_header()->mutable_spec()->add_dims(2);
  t.mutable_header()->set_byte_size(8);
  t.mutable_header()->set_checksum(Checksum(std::as_bytes(std::span(data.data(), 8))));
  t.set_data(data);
  auto v = TensorValueFromProto(t, 4);
  ASSERT_OK(v);
  EXPECT_EQ(v->dtype, DType::kInt32);
  EXPECT_EQ(v->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(v->version, 4);
  t.mutable_header()->set_checksum(1);
  EXPECT_THAT(TensorValueFromProto(t, 4), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(ClientConvert, StepResolution_ToResultAndLines) {
  StepResolution r;
  r.step = 3;
  r.epoch = 11;
  r.state = StepState::kCommitted;
  r.changed.push_back(CommittedVariable{1, "w", 2, 77});
  r.divergences.push_back(Divergence{1, "w", {5, 6}, 5, {1}});
  r.latencies.emplace_back(TaskKey{"tpu_worker", 1}, absl::Milliseconds(12));
  StepResult out = StepResultOf(r);
  ASSERT_EQ(out.changed.size(), 1u);
  EXPECT_EQ(out.changed[0].variable, "w");
  EXPECT_EQ(out.divergences[0].repaired, (std::vector<int32_t>{1}));
  EXPECT_EQ(out.latencies[0].report, absl::Milliseconds(12));
  EXPECT_EQ(ResolutionLine(r),
            "step 3 (epoch 11): committed, 1 variable(s) changed, 1 divergence(s) repaired; "
            "reports: tpu_worker:1 12 ms");
  StepsStatus st;
  st.last_committed_step = 3;
  st.recent.push_back(r);
  std::vector<std::string> lines = StepsLines(st);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "last committed step: 3");
  EXPECT_EQ(lines[1], "no step is open");
}

}  // namespace
}  // namespace repvar::client_internal

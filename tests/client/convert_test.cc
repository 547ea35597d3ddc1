// SPDX-License-Identifier: Apache-2.0
// The client's conversions between the API's messages and the public types.
#include "client/convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "common/rpc/to_proto.h"
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

// A worker's StepReadSmall answer for a variable of the step (S2): taken
// when its spec, its header's size, its bytes and its checksum all agree
// with the step's spec; each fault is DATA_LOSS naming it, the bytes are
// never read past their end.
TEST(ClientConvert, StepValue_SpecSizeAndChecksumChecked_DataLossNamingTheFault) {
  const TensorSpec spec{DType::kInt32, {2}};
  auto answer = [](const std::string& data, int dim, uint64_t byte_size, uint64_t sum) {
    v1::Tensor t;
    t.mutable_header()->mutable_spec()->set_dtype(v1::DTYPE_INT32);
    t.mutable_header()->mutable_spec()->add_dims(dim);
    t.mutable_header()->set_byte_size(byte_size);
    t.mutable_header()->set_checksum(sum);
    t.set_data(data);
    return t;
  };
  const std::string data(8, '\3');
  const uint64_t sum = Checksum(std::as_bytes(std::span(data.data(), 8)));
  const v1::Tensor good = answer(data, 2, 8, sum);
  auto view = CheckedStepValue(good, spec);
  ASSERT_OK(view);
  EXPECT_EQ(view->data(), reinterpret_cast<const std::byte*>(good.data().data())) << "a view";
  EXPECT_EQ(view->size(), 8u);
  EXPECT_THAT(CheckedStepValue(answer(data, 3, 8, sum), spec),
              StatusIs(absl::StatusCode::kDataLoss, "another spec"));
  EXPECT_THAT(CheckedStepValue(answer(data.substr(0, 4), 2, 4, sum), spec),
              StatusIs(absl::StatusCode::kDataLoss, "not 8"));
  EXPECT_THAT(CheckedStepValue(answer(data.substr(0, 4), 2, 8, sum), spec),
              StatusIs(absl::StatusCode::kDataLoss, "not 8"));
  EXPECT_THAT(CheckedStepValue(answer(data, 2, 4, sum), spec),
              StatusIs(absl::StatusCode::kDataLoss, "its header: 4"));
  EXPECT_THAT(CheckedStepValue(answer(data, 2, 8, sum ^ 1), spec),
              StatusIs(absl::StatusCode::kDataLoss, "checksum"));
  EXPECT_THAT(CheckedStepValue(answer(data, 2, 8, 0), spec),
              StatusIs(absl::StatusCode::kDataLoss, "checksum"));
}

// A batched read's answer by column (V6, C1): what the coordinator builds
// from its values is what the client takes, in the order of the names.
ReadResult Read(DType dtype, std::vector<int64_t> dims, uint8_t fill, int64_t version) {
  TensorSpec spec{dtype, std::move(dims)};
  std::vector<std::byte> bytes(static_cast<size_t>(*spec.ByteSize()), std::byte{fill});
  auto t = Tensor::FromBytes(spec, bytes);
  EXPECT_OK(t);
  return ReadResult{version, std::make_shared<const Tensor>(*std::move(t))};
}

TEST(ClientConvert, ReadColumns_EachValueInNameOrder_DistinctSpecsOnce) {
  const std::vector<ReadResult> reads = {
      Read(DType::kFloat32, {4}, 1, 3), Read(DType::kFloat32, {4}, 2, 5),
      Read(DType::kInt64, {2, 3}, 3, 1), Read(DType::kFloat32, {4}, 4, 9)};
  v1::ReadColumns p;
  ReadColumnsToProto(reads, &p);
  EXPECT_EQ(p.specs_size(), 2);
  auto values = ReadColumnsFromProto(p, reads.size());
  ASSERT_OK(values);
  ASSERT_EQ(values->size(), reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    SCOPED_TRACE(i);
    const TensorValue& v = (*values)[i];
    EXPECT_EQ(v.dtype, reads[i].value->spec.dtype);
    EXPECT_EQ(v.shape, reads[i].value->spec.dims);
    EXPECT_EQ(v.version, reads[i].version);
    EXPECT_EQ(v.checksum, reads[i].value->checksum);
    EXPECT_TRUE(std::ranges::equal(v.bytes, reads[i].value->bytes.span()));
  }
}

// A malformed or damaged answer is refused whole, naming what is wrong.
TEST(ClientConvert, ReadColumns_MalformedOrDamaged_DataLossNamingIt) {
  const std::vector<ReadResult> reads = {Read(DType::kFloat32, {4}, 1, 3),
                                         Read(DType::kInt32, {2}, 2, 5)};
  v1::ReadColumns good;
  ReadColumnsToProto(reads, &good);
  ASSERT_OK(ReadColumnsFromProto(good, 2));
  EXPECT_THAT(ReadColumnsFromProto(good, 3),
              StatusIs(absl::StatusCode::kDataLoss, "2 versions for 3 variables"));
  v1::ReadColumns p = good;
  p.set_spec_index(1, 2);
  EXPECT_THAT(ReadColumnsFromProto(p, 2),
              StatusIs(absl::StatusCode::kDataLoss, "spec_index[1] is 2 of 2 specs"));
  p = good;
  p.mutable_data()->pop_back();
  EXPECT_THAT(ReadColumnsFromProto(p, 2),
              StatusIs(absl::StatusCode::kDataLoss, "value 1 is 8 bytes; 7 are left"));
  // Nothing is taken from an answer whose layout does not add up, not even
  // the values before the fault.
  int taken = 0;
  auto take = [&](size_t, const TensorSpec&, int64_t, uint64_t, std::span<const std::byte>) {
    ++taken;
    return absl::OkStatus();
  };
  EXPECT_THAT(ForEachReadColumn(p, 2, take), StatusIs(absl::StatusCode::kDataLoss, "7 are left"));
  p = good;
  p.mutable_data()->push_back('x');
  EXPECT_THAT(ReadColumnsFromProto(p, 2),
              StatusIs(absl::StatusCode::kDataLoss, "1 bytes of data left over"));
  EXPECT_THAT(ForEachReadColumn(p, 2, take), StatusIs(absl::StatusCode::kDataLoss, "left over"));
  EXPECT_EQ(taken, 0);
  ASSERT_OK(ForEachReadColumn(good, 2, take));
  EXPECT_EQ(taken, 2);
  p = good;
  (*p.mutable_data())[0] ^= 1;
  EXPECT_THAT(ReadColumnsFromProto(p, 2),
              StatusIs(absl::StatusCode::kDataLoss, "value 0 received from the coordinator"));
  p = good;
  p.mutable_specs(0)->add_dims(-1);
  EXPECT_THAT(ReadColumnsFromProto(p, 2), StatusIs(absl::StatusCode::kDataLoss));
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
  StepsSummary summary = StepsSummaryOf(st);
  ASSERT_EQ(summary.recent.size(), 1u);
  ASSERT_EQ(summary.recent[0].latencies.size(), 1u);
  EXPECT_EQ(summary.recent[0].latencies[0].report, absl::Milliseconds(12));
}

}  // namespace
}  // namespace repvar::client_internal

// SPDX-License-Identifier: Apache-2.0
// The checkpoint metadata: what is written is read back; values are strings
// (safetensors requires it); a damaged description is DATA_LOSS.
#include "common/io/checkpoint_format.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace repvar::io {
namespace {

using ::repvar::testing::StatusIs;

TEST(CheckpointFormatTest, Metadata_RoundTrips_AllStrings) {
  const std::vector<CheckpointVariable> vars = {
      {"model/w", 7, 0xfedcba9876543210ull, Aggregation::kMean, 8, true, false, {"layers"}},
      {"model/step", 3, std::nullopt, Aggregation::kOnlyFirstReplica, 1, false, true, {}}};
  const auto metadata = CheckpointMetadata(120, vars, {"model/unset"});
  EXPECT_EQ(metadata.at("repvar.format"), "1");
  EXPECT_EQ(metadata.at("repvar.last_committed_step"), "120");
  EXPECT_EQ(metadata.at("repvar.uninitialized"), R"(["model/unset"])");
  auto back = CheckpointVariables(metadata);
  ASSERT_OK(back);
  ASSERT_EQ(back->size(), 2u);
  const CheckpointVariable& w = back->at("model/w");
  EXPECT_EQ(w.version, 7);
  EXPECT_EQ(w.checksum, 0xfedcba9876543210ull);
  EXPECT_EQ(w.aggregation, Aggregation::kMean);
  EXPECT_EQ(w.replica_count, 8);
  EXPECT_EQ(w.collections, std::vector<std::string>{"layers"});
  const CheckpointVariable& s = back->at("model/step");
  EXPECT_FALSE(s.checksum.has_value());
  EXPECT_EQ(s.aggregation, Aggregation::kOnlyFirstReplica);
  EXPECT_FALSE(s.trainable);
  EXPECT_TRUE(s.allow_nonfinite);
}

TEST(CheckpointFormatTest, ForeignFile_NoDescription_Empty) {
  auto none = CheckpointVariables({{"format", "pt"}});
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TEST(CheckpointFormatTest, DamagedDescription_DataLossNamingIt) {
  EXPECT_THAT(CheckpointVariables({{"repvar.variables", "{not json"}}),
              StatusIs(absl::StatusCode::kDataLoss, "not a JSON object"));
  EXPECT_THAT(CheckpointVariables({{"repvar.variables", R"({"w":{"checksum":"xyz"}})"}}),
              StatusIs(absl::StatusCode::kDataLoss, "w: checksum"));
  EXPECT_THAT(CheckpointVariables({{"repvar.variables", R"({"w":{"aggregation":"AVG"}})"}}),
              StatusIs(absl::StatusCode::kDataLoss, "w: unknown aggregation"));
}

}  // namespace
}  // namespace repvar::io

// SPDX-License-Identifier: Apache-2.0
// The scalar board (the web view's curves): the mean of every trainer's value
// per step, refusals that change nothing, and its bounds.
#include "server/core/scalar_board.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace repvar::server {
namespace {

TEST(ScalarBoard, EachStepHoldsTheMeanOfWhatTrainersPublished_SeriesByName) {
  ScalarBoard board;
  ASSERT_TRUE(board.Publish("train/loss", 2, 1.0).ok());
  ASSERT_TRUE(board.Publish("train/loss", 1, 4.0).ok());  // late: kept in step order
  ASSERT_TRUE(board.Publish("train/loss", 2, 3.0).ok());
  ASSERT_TRUE(board.Publish("accuracy", 2, 0.5).ok());
  const std::vector<ScalarSeries> s = board.Snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "accuracy");
  ASSERT_EQ(s[1].name, "train/loss");
  ASSERT_EQ(s[1].points.size(), 2u);
  EXPECT_EQ(s[1].points[0].step, 1);
  EXPECT_EQ(s[1].points[0].value, 4.0);
  EXPECT_EQ(s[1].points[0].count, 1);
  EXPECT_EQ(s[1].points[1].step, 2);
  EXPECT_EQ(s[1].points[1].value, 2.0);
  EXPECT_EQ(s[1].points[1].count, 2);
}

TEST(ScalarBoard, NonFiniteValuesAreKept) {
  ScalarBoard board;
  ASSERT_TRUE(board.Publish("loss", 0, std::nan("")).ok());
  ASSERT_TRUE(board.Publish("loss", 1, INFINITY).ok());
  const std::vector<ScalarSeries> s = board.Snapshot();
  EXPECT_TRUE(std::isnan(s[0].points[0].value));
  EXPECT_TRUE(std::isinf(s[0].points[1].value));
}

TEST(ScalarBoard, BadNameOrStep_InvalidArgument_NothingKept) {
  ScalarBoard board;
  for (const char* name : {"", "has space", "quote\"", "tab\t"}) {
    EXPECT_EQ(board.Publish(name, 1, 1.0).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_EQ(board.Publish(std::string(ScalarBoard::kMaxNameBytes + 1, 'a'), 1, 1.0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(board.Publish(std::string(ScalarBoard::kMaxNameBytes, 'a'), 1, 1.0).ok());
  EXPECT_EQ(board.Publish("loss", -1, 1.0).code(), absl::StatusCode::kInvalidArgument);
  // One bad sample: none of the request is kept.
  EXPECT_EQ(board.Publish({{"loss", 1, 1.0}, {"bad name", 1, 1.0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(board.Snapshot().size(), 1u);
}

TEST(ScalarBoard, PastMaxSeries_ANewName_ResourceExhausted_KnownNamesGoOn) {
  ScalarBoard board;
  for (size_t i = 0; i < ScalarBoard::kMaxSeries; ++i) {
    ASSERT_TRUE(board.Publish(absl::StrCat("s", i), 0, 1.0).ok());
  }
  EXPECT_EQ(board.Publish("one-more", 0, 1.0).code(), absl::StatusCode::kResourceExhausted);
  // All or none: a request with a known name and a new one keeps neither.
  EXPECT_EQ(board.Publish({{"s1", 5, 1.0}, {"one-more", 5, 1.0}}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(board.Snapshot()[1].points.size(), 1u);
  EXPECT_TRUE(board.Publish("s0", 1, 1.0).ok());
  EXPECT_EQ(board.Snapshot().size(), ScalarBoard::kMaxSeries);
}

TEST(ScalarBoard, AFullSeries_KeepsEveryOtherPoint_FirstAndNewestStay) {
  ScalarBoard board;
  const int64_t n = 10 * static_cast<int64_t>(ScalarBoard::kMaxPoints);
  for (int64_t step = 0; step < n; ++step) {
    ASSERT_TRUE(board.Publish("loss", step, static_cast<double>(step)).ok());
  }
  const std::vector<ScalarSeries> snapshot = board.Snapshot();
  const std::vector<ScalarPoint>& points = snapshot[0].points;
  EXPECT_LE(points.size(), ScalarBoard::kMaxPoints);
  EXPECT_GE(points.size(), ScalarBoard::kMaxPoints / 2);
  EXPECT_EQ(points.front().step, 0);
  EXPECT_EQ(points.back().step, n - 1);
  for (size_t i = 1; i < points.size(); ++i) {
    ASSERT_LT(points[i - 1].step, points[i].step);
    EXPECT_EQ(points[i].value, static_cast<double>(points[i].step));
  }
}

}  // namespace
}  // namespace repvar::server

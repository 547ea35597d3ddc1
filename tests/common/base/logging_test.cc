// SPDX-License-Identifier: Apache-2.0
// Log options a daemon is given: levels by name in any case (an unknown
// one refused, not silently "off"), and messages escaped for JSON lines.
#include "common/base/logging.h"

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

TEST(LogLevel, NamesInAnyCase_UnknownRefusedNamingTheLevels) {
  EXPECT_EQ(*ParseLogLevel("DEBUG"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("debug"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("Warning"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("warn"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("off"), spdlog::level::off);
  EXPECT_THAT(ParseLogLevel("verbose").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "trace, debug, info"));
  EXPECT_THAT(ParseLogLevel("").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LogFormat, Unknown_InvalidArgument) {
  EXPECT_THAT(InitLogging({"t", "info", "xml"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "text or json"));
  EXPECT_THAT(InitLogging({"t", "loud", "text"}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(JsonEscape, AnyMessage_ParsesBackAsTheSameString) {
  const std::string messages[] = {"plain",
                                  "say \"hi\"",
                                  "back\\slash",
                                  "line\nbreak\ttab",
                                  std::string("nul\0byte", 8),
                                  "\x01\x1f control",
                                  "ünïcödé ✓"};
  for (const std::string& m : messages) {
    const std::string line = "{\"msg\":\"" + JsonEscape(m) + "\"}";
    auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(parsed.is_discarded()) << line;
    EXPECT_EQ(parsed["msg"].get<std::string>(), m);
  }
  // Bytes that are not UTF-8 still give valid JSON (replaced).
  const std::string line = "{\"msg\":\"" + JsonEscape("bad \xff\xfe byte") + "\"}";
  EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
}

}  // namespace
}  // namespace repvar

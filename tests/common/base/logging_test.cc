// SPDX-License-Identifier: Apache-2.0
// Log options a daemon is given: levels by name in any case (an unknown
// one refused, not silently "off"), and messages escaped for JSON lines.
#include "common/base/logging.h"

#include <gtest/gtest.h>

#include <thread>

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

// Formats one INFO line "hello" as `format` does.
std::string Line(absl::string_view format) {
  auto formatter = LogFormatter(format);
  EXPECT_TRUE(formatter.ok());
  spdlog::details::log_msg msg("test", spdlog::level::info, "hello");
  spdlog::memory_buf_t out;
  (*formatter)->format(msg, out);
  return std::string(out.data(), out.size());
}

TEST(RequestId, OnTheLinesWrittenInItsScope_TextAndJson_ThenThePreviousOne) {
  EXPECT_EQ(CurrentRequestId(), "");
  EXPECT_EQ(Line("text").find("request_id"), std::string::npos) << Line("text");
  EXPECT_FALSE(nlohmann::json::parse(Line("json")).contains("request_id"));
  {
    ScopedRequestId outer("req-1");
    EXPECT_NE(Line("text").find("request_id=req-1 hello"), std::string::npos) << Line("text");
    nlohmann::json j = nlohmann::json::parse(Line("json"));
    EXPECT_EQ(j["request_id"], "req-1");
    EXPECT_EQ(j["msg"], "hello");
    {
      ScopedRequestId inner("req\"2");  // escaped in JSON
      EXPECT_EQ(nlohmann::json::parse(Line("json"))["request_id"], "req\"2");
      // Another thread works for no request.
      std::thread([] { EXPECT_EQ(CurrentRequestId(), ""); }).join();
    }
    EXPECT_EQ(CurrentRequestId(), "req-1");
    ScopedRequestId none("");
    EXPECT_EQ(CurrentRequestId(), "");
  }
  EXPECT_EQ(CurrentRequestId(), "");
  EXPECT_THAT(LogFormatter("xml").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace repvar

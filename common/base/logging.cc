// SPDX-License-Identifier: Apache-2.0
#include "common/base/logging.h"

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/cfg/env.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace repvar {
namespace {

// %* in a pattern: the message, escaped for a JSON string.
class JsonMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        JsonEscape(absl::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }
};

thread_local const std::string* current_request_id = nullptr;

// %R in a pattern: the thread's request id, if any, as the text format
// shows it ("request_id=ID ") or as a JSON member (`,"request_id":"ID"`).
class RequestIdFlag final : public spdlog::custom_flag_formatter {
 public:
  explicit RequestIdFlag(bool json) : json_(json) {}
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    if (current_request_id == nullptr) return;
    const std::string text =
        json_ ? absl::StrCat(",\"request_id\":\"", JsonEscape(*current_request_id), "\"")
              : absl::StrCat("request_id=", *current_request_id, " ");
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RequestIdFlag>(json_);
  }

 private:
  const bool json_;
};

}  // namespace

absl::string_view CurrentRequestId() {
  return current_request_id == nullptr ? absl::string_view() : *current_request_id;
}

ScopedRequestId::ScopedRequestId(std::string id)
    : id_(std::move(id)), previous_(current_request_id) {
  current_request_id = id_.empty() ? nullptr : &id_;
}

ScopedRequestId::~ScopedRequestId() { current_request_id = previous_; }

absl::StatusOr<std::unique_ptr<spdlog::formatter>> LogFormatter(absl::string_view format) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  if (format == "text") {
    formatter->add_flag<RequestIdFlag>('R', false)
        .set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n[%P] %R%v");
  } else if (format == "json") {
    formatter->add_flag<RequestIdFlag>('R', true).add_flag<JsonMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%f%z","level":"%l","logger":"%n","pid":%P%R,"msg":"%*"})");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log format \"", format, "\"; expected text or json"));
  }
  return formatter;
}

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "trace") return spdlog::level::trace;
  if (lower == "debug") return spdlog::level::debug;
  if (lower == "info") return spdlog::level::info;
  if (lower == "warn" || lower == "warning") return spdlog::level::warn;
  if (lower == "error") return spdlog::level::err;
  if (lower == "critical") return spdlog::level::critical;
  if (lower == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level \"", name,
                   "\"; expected trace, debug, info, warn, error, critical or off"));
}

std::string JsonEscape(absl::string_view text) {
  const std::string quoted =
      nlohmann::json(std::string(text))
          .dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

absl::Status InitLogging(const LogOptions& options) {
  auto level = ParseLogLevel(options.level);
  if (!level.ok()) return level.status();
  auto formatter = LogFormatter(options.format);
  if (!formatter.ok()) return formatter.status();
  auto logger = spdlog::stderr_logger_mt(options.name);
  logger->set_formatter(*std::move(formatter));
  logger->set_level(*level);
  spdlog::set_default_logger(logger);
  spdlog::cfg::load_env_levels();
  spdlog::flush_every(std::chrono::seconds(1));
  return absl::OkStatus();
}

}  // namespace repvar

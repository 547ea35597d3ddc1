// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_BASE_LOGGING_H_
#define REPVAR_COMMON_BASE_LOGGING_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spdlog/common.h"
#include "spdlog/formatter.h"

namespace repvar {

struct LogOptions {
  std::string name = "repvar";
  // trace, debug, info, warn (warning), error, critical or off, in any case;
  // $SPDLOG_LEVEL overrides it.
  std::string level = "info";
  // "text": one line per message; "json": one JSON object per line, with
  // the keys time, level, logger, pid and msg.
  std::string format = "text";
};

// The level `name` names. Errors: INVALID_ARGUMENT naming the levels.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name);

// Call once in main(): stderr sink, one pattern for every daemon. Errors:
// INVALID_ARGUMENT (an unknown level or format); nothing changes then.
absl::Status InitLogging(const LogOptions& options);

// The id of the request the calling thread works for ("" when none). Log
// lines written meanwhile carry it (text: "request_id=ID " before the
// message; json: a "request_id" key), and calls made to other daemons on its
// behalf pass it on (x-request-id), so one id follows a request through the
// coordinator and its workers.
absl::string_view CurrentRequestId();

// Makes `id` the calling thread's request id until destroyed (then the
// previous one again). An empty id leaves none.
class ScopedRequestId {
 public:
  explicit ScopedRequestId(std::string id);
  ~ScopedRequestId();
  ScopedRequestId(const ScopedRequestId&) = delete;
  ScopedRequestId& operator=(const ScopedRequestId&) = delete;

 private:
  const std::string id_;
  const std::string* const previous_;
};

// The formatter InitLogging gives the logger for `format` ("text" or
// "json"). Errors: INVALID_ARGUMENT (another format).
absl::StatusOr<std::unique_ptr<spdlog::formatter>> LogFormatter(absl::string_view format);

// `text` as the inside of a JSON string (quotes, backslashes and control
// characters escaped; bytes that are not UTF-8 replaced by U+FFFD).
std::string JsonEscape(absl::string_view text);

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_LOGGING_H_

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_BASE_LOGGING_H_
#define REPVAR_COMMON_BASE_LOGGING_H_

#include <string>

namespace repvar {

struct LogOptions {
  std::string name = "repvar";
  std::string level = "info";  // trace, debug, info, warn, error; SPDLOG_LEVEL overrides
};

// Call once in main(): stderr sink, one pattern for every daemon.
void InitLogging(const LogOptions& options);

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_LOGGING_H_

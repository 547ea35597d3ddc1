// SPDX-License-Identifier: Apache-2.0
#include "common/base/logging.h"

#include "spdlog/cfg/env.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace repvar {

void InitLogging(const LogOptions& options) {
  auto logger = spdlog::stderr_logger_mt(options.name);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n[%P] %v");
  logger->set_level(spdlog::level::from_str(options.level));
  spdlog::set_default_logger(logger);
  spdlog::cfg::load_env_levels();
  spdlog::flush_every(std::chrono::seconds(1));
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// Small pieces every daemon main() uses.
#ifndef REPVAR_COMMON_BASE_DAEMON_H_
#define REPVAR_COMMON_BASE_DAEMON_H_

#include <string>

#include "absl/status/status.h"

namespace repvar {

// Writes "<port>\n" to `path` through a temporary file, fsync and rename, so a
// reader never sees a partial file.
absl::Status WritePortFile(const std::string& path, int port);

// Blocks SIGINT and SIGTERM in the calling thread (call first in main, before
// any thread starts, so every thread inherits the mask).
void BlockShutdownSignals();
// On a crash (SIGSEGV, SIGBUS, SIGABRT — an uncaught exception too) the
// process writes a stack trace to stderr (its log file) before it dies.
void InstallCrashHandler();
// Waits for SIGINT or SIGTERM; returns the signal number.
int WaitForShutdownSignal();

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_DAEMON_H_

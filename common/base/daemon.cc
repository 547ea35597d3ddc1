// SPDX-License-Identifier: Apache-2.0
#include "common/base/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/strings/str_cat.h"

namespace repvar {

absl::Status WritePortFile(const std::string& path, int port) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", tmp, ": ", strerror(errno)));
  std::string text = absl::StrCat(port, "\n");
  bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot write port file ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

void InstallCrashHandler() {
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  // Abseil counts SIGTERM as a failure; here it asks for a clean shutdown
  // (WaitForShutdownSignal takes it), so it keeps its default disposition.
  std::signal(SIGTERM, SIG_DFL);
}

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// The daemons as systemd's Type=notify services see them: a datagram socket
// stands in for $NOTIFY_SOCKET and receives READY=1 once the daemon serves,
// WATCHDOG=1 pings every half of WATCHDOG_USEC, and STOPPING=1 on SIGTERM.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/cluster.h"
#include "tests/testing/temp_dir.h"

namespace repvar {
namespace {

using ::repvar::testing::Scaled;

class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{0, 100000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~NotifySocket() { close(fd_); }

  // Reads datagrams until one contains `what`, or `timeout` passes.
  bool WaitFor(const std::string& what, absl::Duration timeout) {
    for (absl::Time until = absl::Now() + timeout; absl::Now() < until;) {
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n > 0 && absl::StrContains(absl::string_view(buf, n), what)) return true;
    }
    return false;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(SystemdNotify, Coordinator_ReadyWatchdogStopping) {
  testing::TempDir dir;
  NotifySocket sock(dir.path() + "/notify");
  setenv("NOTIFY_SOCKET", (dir.path() + "/notify").c_str(), 1);
  setenv("WATCHDOG_USEC", "200000", 1);
  auto d = testing::Daemon::Start(testing::BinaryPath("server/repvar-coordinator"),
                                  {"--listen_address=127.0.0.1:0", "--ephemeral"}, dir.path(),
                                  "coordinator");
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(sock.WaitFor("READY=1", Scaled(absl::Seconds(10))));
  // Pings every 100 ms: several within a second.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(sock.WaitFor("WATCHDOG=1", Scaled(absl::Seconds(1))));
  (*d)->Kill(SIGTERM);
  EXPECT_TRUE(sock.WaitFor("STOPPING=1", Scaled(absl::Seconds(10))));
  EXPECT_EQ((*d)->Stop(), 0);
}

TEST(SystemdNotify, WithoutNotifySocket_NothingIsSent) {
  // The control: the same daemon without $NOTIFY_SOCKET sends nothing.
  testing::TempDir dir;
  NotifySocket sock(dir.path() + "/notify");
  auto d = testing::Daemon::Start(testing::BinaryPath("server/repvar-coordinator"),
                                  {"--listen_address=127.0.0.1:0", "--ephemeral"}, dir.path(),
                                  "coordinator");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(sock.WaitFor("READY=1", absl::Seconds(1)));
  EXPECT_EQ((*d)->Stop(), 0);
}

}  // namespace
}  // namespace repvar

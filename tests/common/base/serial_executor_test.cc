// SPDX-License-Identifier: Apache-2.0
#include "common/base/serial_executor.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace repvar {
namespace {

TEST(SerialExecutorTest, RunsInOrderOnAnotherThread_DestructorRunsWhatIsLeft) {
  std::vector<int> ran;  // written by the executor's thread only
  std::thread::id where;
  absl::Notification release;
  {
    SerialExecutor e;
    // The first closure holds the thread until everything is scheduled, so
    // the rest is still queued when the destructor starts.
    e.Schedule([&] {
      release.WaitForNotification();
      where = std::this_thread::get_id();
      ran.push_back(0);
    });
    for (int i = 1; i < 5; ++i) e.Schedule([&ran, i] { ran.push_back(i); });
    release.Notify();
  }
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(where, std::this_thread::get_id());
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/base/thread_pool.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace repvar {
namespace {

TEST(ThreadPoolTest, OneThread_RunsInOrderOnAnotherThread_DestructorRunsWhatIsLeft) {
  std::vector<int> ran;  // written by the pool's thread only
  std::thread::id where;
  absl::Notification release;
  {
    ThreadPool pool(1);
    // The first closure holds the thread until everything is scheduled, so
    // the rest is still queued when the destructor starts.
    pool.Schedule([&] {
      release.WaitForNotification();
      where = std::this_thread::get_id();
      ran.push_back(0);
    });
    for (int i = 1; i < 5; ++i) pool.Schedule([&ran, i] { ran.push_back(i); });
    release.Notify();
  }
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(ThreadPoolTest, TwoThreads_RunTwoClosuresAtOnce) {
  absl::Notification first_running, second_ran;
  bool first_saw_second = false;
  {
    ThreadPool pool(2);
    pool.Schedule([&] {
      first_running.Notify();
      // Only a second thread can run the second closure while this waits.
      first_saw_second = second_ran.WaitForNotificationWithTimeout(absl::Seconds(30));
    });
    pool.Schedule([&] {
      first_running.WaitForNotification();
      second_ran.Notify();
    });
  }
  EXPECT_TRUE(first_saw_second);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
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

// Closures that wait on each other: with every thread busy, the next one
// starts a thread instead of queueing behind them (up to the cap).
TEST(ThreadPoolTest, Growing_AClosureScheduledWhileAllAreBusyGetsANewThread_UpToTheCap) {
  absl::Notification release;
  absl::Notification all_waiting;
  std::atomic<int> waiting{0};
  {
    ThreadPool pool(1, 3);
    EXPECT_EQ(pool.threads(), 1);
    for (int i = 0; i < 3; ++i) {
      pool.Schedule([&] {
        if (++waiting == 3) all_waiting.Notify();
        release.WaitForNotification();
      });
    }
    // Three closures run at once: none waits behind another.
    EXPECT_TRUE(all_waiting.WaitForNotificationWithTimeout(absl::Seconds(30)));
    pool.Schedule([] {});  // queued: the cap is reached
    EXPECT_EQ(pool.threads(), 3);
    release.Notify();
  }
  EXPECT_EQ(waiting.load(), 3);
}

TEST(ThreadPoolTest, MoveOnlyClosures) {
  auto value = std::make_unique<int>(7);
  int seen = 0;
  {
    ThreadPool pool(1);
    pool.Schedule([v = std::move(value), &seen] { seen = *v; });
  }
  EXPECT_EQ(seen, 7);
}

}  // namespace
}  // namespace repvar

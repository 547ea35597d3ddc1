// SPDX-License-Identifier: Apache-2.0
// The scheduler runs the primitives of common/base/sync.h one thread at a
// time, from a seed: the same seed the same run, time only when nothing
// can run, and stopped or paused processes.
#include "sim/scheduler.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/base/sync.h"
#include "common/base/thread_pool.h"

namespace repvar::sim {
namespace {

constexpr absl::Time kForever = absl::InfiniteFuture();

// Two threads hand a token back and forth through a CondVar, a third
// sleeps, a fourth waits on a Notification with a deadline: what every
// test below varies.
struct PingPong {
  Mutex mu;
  CondVar cv;
  int turn ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> trace ABSL_GUARDED_BY(mu);
  int finished = 0;

  void Player(int me, int rounds) {
    for (int i = 0; i < rounds; ++i) {
      MutexLock lock(&mu);
      while (turn % 2 != me) cv.Wait(&mu);
      trace.push_back(std::to_string(me));
      ++turn;
      cv.SignalAll();
    }
    ++finished;
  }
};

struct Outcome {
  uint64_t digest = 0;
  std::vector<std::string> order;  // which thread ended when
};

Outcome RunPingPong(uint64_t seed) {
  Random random(seed);
  Scheduler s(&random, {.preempt_on_lock = 0.5});
  PingPong game;
  std::vector<std::string> order;
  const ProcessId p = s.NewProcess("p");
  for (int me = 0; me < 2; ++me) {
    s.Spawn(p, "player", [&, me] {
      game.Player(me, 20);
      order.push_back("player" + std::to_string(me));
    });
  }
  for (int i = 0; i < 4; ++i) {
    s.Spawn(p, "sleeper", [&, i] {
      s.clock()->SleepFor(absl::Milliseconds(1));
      order.push_back("sleeper" + std::to_string(i));
    });
  }
  EXPECT_EQ(s.Run([&] { return game.finished == 2 && order.size() == 6; }, kForever),
            Scheduler::Stop::kDone);
  return {s.digest(), order};
}

TEST(SchedulerTest, SameSeed_SameInterleavingAndDigest) {
  const Outcome a = RunPingPong(7);
  const Outcome b = RunPingPong(7);
  EXPECT_EQ(a.digest, b.digest);
  EXPECT_EQ(a.order, b.order);
}

TEST(SchedulerTest, OtherSeeds_OtherInterleavings) {
  std::set<uint64_t> digests;
  std::set<std::vector<std::string>> orders;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Outcome o = RunPingPong(seed);
    digests.insert(o.digest);
    orders.insert(o.order);
  }
  EXPECT_GT(digests.size(), 15u);
  EXPECT_GT(orders.size(), 5u);
}

TEST(SchedulerTest, TimeMovesOnlyWhenNothingCanRun) {
  Random random(1);
  Scheduler s(&random);
  const absl::Time start = s.Now();
  const ProcessId p = s.NewProcess("p");
  std::vector<absl::Duration> woke;
  Mutex mu;
  bool never = false;  // under mu
  s.Spawn(p, "sleeper", [&] {
    s.clock()->SleepFor(absl::Seconds(30));
    woke.push_back(s.Now() - start);
  });
  s.Spawn(p, "waiter", [&] {
    MutexLock lock(&mu);
    const bool held = mu.AwaitWithDeadline(absl::Condition(&never), s.Now() + absl::Seconds(5));
    woke.push_back(held ? absl::ZeroDuration() : s.Now() - start);
  });
  const auto real_start = absl::Now();
  EXPECT_EQ(s.Run([&] { return woke.size() == 2; }, kForever), Scheduler::Stop::kDone);
  EXPECT_EQ(woke, (std::vector<absl::Duration>{absl::Seconds(5), absl::Seconds(30)}));
  EXPECT_LT(absl::Now() - real_start, absl::Seconds(5));  // simulated, not slept
}

TEST(SchedulerTest, Timers_FireAtTheirTimeOnTheDrivingThread) {
  Random random(1);
  Scheduler s(&random);
  const ProcessId p = s.NewProcess("p");
  const absl::Time start = s.Now();
  std::vector<absl::Duration> fired;
  s.At(p, start + absl::Seconds(2), [&] { fired.push_back(s.Now() - start); });
  s.At(p, start + absl::Seconds(1), [&] {
    fired.push_back(s.Now() - start);
    s.Spawn(p, "spawned", [&] { fired.push_back(absl::Minutes(1)); });
  });
  EXPECT_EQ(s.Run([] { return false; }, kForever), Scheduler::Stop::kIdle);
  EXPECT_EQ(fired,
            (std::vector<absl::Duration>{absl::Seconds(1), absl::Minutes(1), absl::Seconds(2)}));
}

TEST(SchedulerTest, KilledProcess_ItsThreadsAndTimersNeverRunAgain) {
  Random random(3);
  Scheduler s(&random);
  const ProcessId victim = s.NewProcess("victim");
  const ProcessId other = s.NewProcess("other");
  int victim_ticks = 0;
  int other_ticks = 0;
  for (const auto& [p, counter] :
       {std::pair{victim, &victim_ticks}, std::pair{other, &other_ticks}}) {
    s.Spawn(p, "ticker", [&s, ticks = counter] {
      for (int i = 0; i < 10; ++i) {
        s.clock()->SleepFor(absl::Seconds(1));
        ++*ticks;
      }
    });
  }
  bool timer_ran = false;
  s.At(victim, s.Now() + absl::Seconds(8), [&] { timer_ran = true; });
  s.At(other, s.Now() + absl::Milliseconds(3500), [&] { s.Kill(victim); });
  EXPECT_EQ(s.Run([] { return false; }, kForever), Scheduler::Stop::kIdle);
  EXPECT_EQ(victim_ticks, 3);
  EXPECT_EQ(other_ticks, 10);
  EXPECT_FALSE(timer_ran);
  EXPECT_FALSE(s.Alive(victim));
}

TEST(SchedulerTest, PausedProcess_ResumesWhereItStopped) {
  Random random(3);
  Scheduler s(&random);
  const ProcessId p = s.NewProcess("p");
  const absl::Time start = s.Now();
  std::vector<absl::Duration> ticks;
  s.Spawn(p, "ticker", [&] {
    for (int i = 0; i < 3; ++i) {
      s.clock()->SleepFor(absl::Seconds(1));
      ticks.push_back(s.Now() - start);
    }
  });
  const ProcessId nemesis = s.NewProcess("nemesis");
  s.At(nemesis, start + absl::Milliseconds(1500),
       [&] { s.Pause(p, start + absl::Milliseconds(2700)); });
  EXPECT_EQ(s.Run([] { return false; }, kForever), Scheduler::Stop::kIdle);
  // The tick due at 2 s comes when the pause ends; the next a second later.
  EXPECT_EQ(ticks, (std::vector<absl::Duration>{absl::Seconds(1), absl::Milliseconds(2700),
                                                absl::Milliseconds(3700)}));
}

TEST(SchedulerTest, NothingLeftToRun_IdleWithTheWaitersNamed) {
  Random random(1);
  Scheduler s(&random);
  const ProcessId p = s.NewProcess("coordinator");
  Notification never;
  s.Spawn(p, "stuck", [&] { never.WaitForNotification(); });
  EXPECT_EQ(s.Run([] { return false; }, kForever), Scheduler::Stop::kIdle);
  const std::vector<std::string> waiting = s.Waiting();
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_NE(waiting[0].find("coordinator/stuck"), std::string::npos) << waiting[0];
  never.Notify();  // so the thread can end before the scheduler goes
  EXPECT_EQ(s.Run([] { return false; }, kForever), Scheduler::Stop::kIdle);
  EXPECT_TRUE(s.Waiting().empty());
}

TEST(SchedulerTest, TimeLimit_StopsAtIt) {
  Random random(1);
  Scheduler s(&random);
  const ProcessId p = s.NewProcess("p");
  s.Spawn(p, "forever", [&] {
    while (true) s.clock()->SleepFor(absl::Seconds(1));
  });
  const absl::Time until = s.Now() + absl::Seconds(10);
  EXPECT_EQ(s.Run([] { return false; }, until), Scheduler::Stop::kTimeLimit);
  EXPECT_EQ(s.Now(), until);
}

// A check-then-act race: each thread reads the counter in one critical
// section and writes it back in another. The scheduler must find an order
// that loses an update (it tries interleavings, not just one).
TEST(SchedulerTest, FindsALostUpdateRace_InSomeSeed) {
  int lost = 0;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    Random random(seed);
    Scheduler s(&random);
    const ProcessId p = s.NewProcess("p");
    Mutex mu;
    int counter = 0;
    int done = 0;
    for (int i = 0; i < 2; ++i) {
      s.Spawn(p, "adder", [&] {
        int seen;
        {
          MutexLock lock(&mu);
          seen = counter;
        }
        MutexLock lock(&mu);
        counter = seen + 1;
        ++done;
      });
    }
    s.Run([&] { return done == 2; }, kForever);
    if (counter != 2) ++lost;
  }
  EXPECT_GT(lost, 0);
  EXPECT_LT(lost, 50);
}

TEST(SchedulerTest, ThreadPoolAndThreadJoin_RunUnderTheScheduler) {
  Random random(5);
  Scheduler s(&random);
  const ProcessId p = s.NewProcess("p");
  int ran = 0;
  bool joined = false;
  s.Spawn(p, "main", [&] {
    {
      ThreadPool pool(2);
      for (int i = 0; i < 10; ++i) pool.Schedule([&] { ++ran; });
    }  // runs everything, joins
    Thread t([&] { ++ran; });
    t.join();
    joined = true;
  });
  EXPECT_EQ(s.Run([&] { return joined; }, kForever), Scheduler::Stop::kDone);
  EXPECT_EQ(ran, 11);
}

}  // namespace
}  // namespace repvar::sim

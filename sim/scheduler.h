// SPDX-License-Identifier: Apache-2.0
// The simulator's scheduler: threads run one at a time, in an order drawn
// from a seed, on a clock that moves only when no thread can run
// (docs/simulator.md, "Why a seed replays bit for bit").
//
// A simulated thread is a user-space context with its own stack, run on the
// driving thread (the one that calls Run): it runs until it waits (a lock
// held by another thread, a false condition, a deadline ahead, its end) and
// then switches back; the driving thread picks the next among the threads
// that can run and the timers that are due. A hand-over is a context
// switch, not an OS thread's wake-up. Each process of the simulated
// cluster (a coordinator, a worker, a client) owns its threads and timers,
// so a crash stops exactly them.
//
//   thread:  RUNNABLE --picked--> RUNNING --waits--> BLOCKED --condition
//               ^                   |  |                 |     holds or
//               '-----preempted-----'  '--ends--> DONE   |     deadline
//               '----------------------------------------'
//   a killed process's threads never run again (they stay blocked).
//
// Everything here runs on the driving OS thread, so the scheduler needs no
// lock of its own.
#ifndef REPVAR_SIM_SCHEDULER_H_
#define REPVAR_SIM_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/sync.h"
#include "sim/random.h"

namespace repvar::sim {

using ProcessId = int;

struct SchedulerOptions {
  // Chance that a thread taking a free lock gives control back first, so
  // that another thread may run in between (more interleavings tried).
  double preempt_on_lock = 0.1;
  // A run that makes more picks than this without its stop condition is
  // stuck (a livelock): Run returns kTooManySteps.
  uint64_t max_steps = 5'000'000;
};

class Scheduler final : public sync_internal::Cooperative {
 public:
  // `random` decides every pick; it must outlive the scheduler. Only one
  // scheduler may exist in a process at a time.
  Scheduler(Random* random, SchedulerOptions options = {});
  // Threads still blocked are left so (their process is gone): their
  // stacks and records are leaked on purpose.
  ~Scheduler() override;

  // ---- The simulated cluster's processes.
  ProcessId NewProcess(std::string name);
  // Its threads never run again and its timers never fire.
  void Kill(ProcessId p);
  // Its threads and timers wait until `until` (SIGSTOP, then SIGCONT).
  void Pause(ProcessId p, absl::Time until);
  // Lifts a pause now.
  void Resume(ProcessId p);
  bool Alive(ProcessId p) const;
  bool Paused(ProcessId p) const { return processes_.at(p).paused_until > now_; }
  const std::string& ProcessName(ProcessId p) const;

  // Starts `body` on a new thread of `p` (it runs when picked).
  void Spawn(ProcessId p, std::string name, absl::AnyInvocable<void() &&> body);
  // Runs `fn` on the driving thread at `when` (not before now), unless `p`
  // is dead by then. `fn` must not wait: it decides (a message arrives, a
  // fault strikes) and spawns threads to run any code of the cores.
  void At(ProcessId p, absl::Time when, absl::AnyInvocable<void() &&> fn);
  // The process of the running thread (on the driving thread: the timer's).
  ProcessId CurrentProcess() const;
  // On a simulated thread: its process stops (killed, as by its own exit)
  // and the thread never runs again.
  [[noreturn]] void Halt();

  enum class Stop { kDone, kIdle, kDeadlock, kTooManySteps, kTimeLimit };
  // Runs threads and timers until `done()` (checked after every pick)
  // holds (kDone); until nothing is left to run and no timer is pending
  // (kIdle: every thread ended or waits with no deadline, with none of them
  // in a live process: kDeadlock otherwise); or time would pass `until`.
  Stop Run(absl::FunctionRef<bool()> done, absl::Time until);

  // What the threads of live processes wait for, one line each (a
  // deadlock's report).
  std::vector<std::string> Waiting() const;
  // A digest of every pick so far (which thread or timer, at what time).
  uint64_t digest() const { return digest_; }
  uint64_t steps() const { return steps_; }

  // sync_internal::Cooperative
  bool Runs() const override;
  absl::Time Now() const override { return now_; }
  // Both let go of and take `mu` as the hand-over requires, which the
  // thread-safety analysis cannot follow.
  void Lock(absl::Mutex& mu) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  bool Await(absl::Mutex& mu, const absl::Condition& cond,
             absl::Time deadline) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void Start(absl::AnyInvocable<void() &&> body) override;
  sync_internal::HeldLocks& Held() override;

  // The simulation's Clock: Now is the scheduler's; SleepFor waits.
  Clock* clock() { return &clock_; }

 private:
  struct SimThread;
  struct Timer {
    ProcessId process;
    absl::AnyInvocable<void() &&> fn;
  };
  struct Process {
    std::string name;
    bool alive = true;
    absl::Time paused_until = absl::InfinitePast();
  };
  class SimClock final : public Clock {
   public:
    explicit SimClock(Scheduler* s) : s_(s) {}
    absl::Time Now() const override { return s_->now_; }
    void SleepFor(absl::Duration d) override;

   private:
    Scheduler* const s_;
  };

  // The hand-over: the running thread gives control back and waits to be
  // picked again.
  void Yield(SimThread* t);
  // Where every thread's context begins: runs the bodies it is given.
  static void Entry();
  SimThread* NewThread();
  void Activate(SimThread* t);
  void Deactivate(SimThread* t);
  // Whether a blocked thread may go on now (its lock is free, its
  // condition holds or its deadline passed); sets its wait's result.
  bool Ready(SimThread* t) ABSL_NO_THREAD_SAFETY_ANALYSIS;  // tries the waiter's lock
  bool Eligible(const SimThread* t) const;
  void RunThread(SimThread* t);
  Stop Loop(absl::FunctionRef<bool()> done, absl::Time until);
  void FireTimer(std::multimap<std::pair<absl::Time, uint64_t>, Timer>::iterator it);
  // The earliest time at which something waiting can go on.
  absl::Time NextWake() const;
  void Mix(uint64_t a, uint64_t b);

  Random* const random_;
  const SchedulerOptions options_;
  SimClock clock_{this};
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  std::vector<Process> processes_;
  std::vector<SimThread*> threads_;  // by id; never freed (see ~Scheduler)
  std::vector<SimThread*> idle_;     // ended threads, kept to run new bodies
  // The threads that may run again (not ended, their process alive), by id.
  std::vector<SimThread*> active_;
  std::multimap<std::pair<absl::Time, uint64_t>, Timer> timers_;
  uint64_t next_timer_ = 0;
  SimThread* running_ = nullptr;
  ProcessId timer_process_ = -1;  // while a timer runs
  struct Driver;
  std::unique_ptr<Driver> driver_;  // the driving thread's context
  uint64_t digest_ = 0;
  uint64_t steps_ = 0;
  // The thread that last took each lock (a deadlock's report).
  absl::flat_hash_map<const absl::Mutex*, int> taker_;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_SCHEDULER_H_

// SPDX-License-Identifier: Apache-2.0
// The locks, waits and threads of the cores (server/core, worker/core and
// what they use): absl's and the standard library's, except inside the
// cluster simulator, where each wait hands control to its scheduler so that
// one seed decides every interleaving (docs/simulator.md, "Why a seed
// replays bit for bit"). Outside a simulation the difference is one
// predictable branch per call.
//
// Deadlines are absl::Time from the caller's Clock: real time in a daemon,
// the simulator's time in a simulation.
#ifndef REPVAR_COMMON_BASE_SYNC_H_
#define REPVAR_COMMON_BASE_SYNC_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace repvar {

class RankedMutex;

namespace sync_internal {

// The ranked locks a thread holds, in the order it took them
// (common/base/ranked_mutex.h).
struct HeldLocks {
  static constexpr int kMax = 16;
  std::array<const RankedMutex*, kMax> locks{};
  int depth = 0;
};

// What a simulation's scheduler does in place of blocking (sim/scheduler.h
// implements it). Called only on the threads it runs; others are told apart
// by Runs().
class Cooperative {
 public:
  virtual ~Cooperative() = default;
  // Whether the calling thread is one of the scheduler's.
  virtual bool Runs() const = 0;
  virtual absl::Time Now() const = 0;
  // Takes `mu`, giving control back while another thread holds it.
  virtual void Lock(absl::Mutex& mu) = 0;
  // With `mu` held: returns once `cond` holds (true) or `deadline` passed
  // (false), `mu` held again. Gives control back while it waits.
  virtual bool Await(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) = 0;
  // Starts `body` on a thread of the scheduler's.
  virtual void Start(absl::AnyInvocable<void() &&> body) = 0;
  // The calling thread's ranked locks: the scheduler's threads share one OS
  // thread, so a thread_local would be shared by all of them.
  virtual HeldLocks& Held() = 0;
};

// The scheduler of the simulation running in this process, or null.
inline std::atomic<Cooperative*> active{nullptr};

// The scheduler when the calling thread is one of its own.
inline Cooperative* Current() {
  Cooperative* c = active.load(std::memory_order_acquire);
  return c != nullptr && c->Runs() ? c : nullptr;
}

}  // namespace sync_internal

// The time the waits below measure deadlines by: the simulation's inside
// one, absl::Now() otherwise. For a core that turns a timeout into a
// deadline; code with a Clock uses it.
inline absl::Time WaitClockNow() {
  if (sync_internal::Cooperative* c = sync_internal::Current()) return c->Now();
  return absl::Now();
}

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (sync_internal::Cooperative* c = sync_internal::Current()) {
      c->Lock(mu_);
    } else {
      mu_.Lock();
    }
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.TryLock(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }

  // With the lock held: waits until `cond` holds.
  void Await(const absl::Condition& cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    AwaitWithDeadline(cond, absl::InfiniteFuture());
  }
  // With the lock held: waits until `cond` holds (true) or `deadline`
  // passed (false); the lock is held again either way.
  bool AwaitWithDeadline(const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);

 private:
  friend class CondVar;
  mutable absl::Mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits release the mutex and take it again; a wake-up may be spurious, so
// callers loop on their condition.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    WaitWithDeadline(mu, absl::InfiniteFuture());
  }
  // Returns true when `deadline` passed before a signal.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Signal();
  void SignalAll();

 private:
  absl::CondVar cv_;
  std::atomic<uint64_t> signals_{0};  // counted in a simulation only
};

// Notify once; any number of threads wait for it.
class Notification {
 public:
  Notification() = default;
  explicit Notification(bool notified) : notified_(notified) {}
  void Notify();
  bool HasBeenNotified() const { return notified_.load(std::memory_order_acquire); }
  void WaitForNotification() const;
  // Returns whether it was notified by `deadline`.
  bool WaitForNotificationWithDeadline(absl::Time deadline) const;

 private:
  mutable Mutex mu_;
  std::atomic<bool> notified_{false};
};

// A thread that runs `body` (a thread of the simulator's inside one).
// Join before destroying it, as with std::thread.
class Thread {
 public:
  Thread() = default;
  explicit Thread(absl::AnyInvocable<void() &&> body);
  Thread(Thread&&) noexcept = default;
  Thread& operator=(Thread&&) noexcept;
  ~Thread();

  bool joinable() const { return thread_.joinable() || simulated_ != nullptr; }
  void join();

 private:
  struct Simulated;
  std::thread thread_;
  std::shared_ptr<Simulated> simulated_;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_SYNC_H_

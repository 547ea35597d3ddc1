// SPDX-License-Identifier: Apache-2.0
// A mutex with a rank, so that the lock order written in a header is checked
// at run time: a thread may only take a lock whose rank is above every
// ranked lock it holds. A violation is a bug and crashes, naming both locks:
// the order is checked on every acquisition in every build, not only where a
// deadlock happens to strike.
#ifndef REPVAR_COMMON_BASE_RANKED_MUTEX_H_
#define REPVAR_COMMON_BASE_RANKED_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "common/base/sync.h"

namespace repvar {

class ABSL_LOCKABLE RankedMutex {
 public:
  // `name` must outlive the mutex (a string literal).
  RankedMutex(int rank, const char* name) : rank_(rank), name_(name) {}
  RankedMutex(const RankedMutex&) = delete;
  RankedMutex& operator=(const RankedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION();
  void Unlock() ABSL_UNLOCK_FUNCTION();
  // For condition variables and Await (the rank stays held while waiting).
  Mutex* native() ABSL_LOCK_RETURNED(this) { return &mu_; }
  int rank() const { return rank_; }
  const char* name() const { return name_; }

  // Locks outside the ranking that must be taken before any ranked lock
  // (the coordinator's per-variable write locks, which a batch takes by the
  // thousand, in id order) call this first: it crashes when the thread
  // holds a ranked lock.
  static void AssertNoneHeld(const char* taking);

 private:
  const int rank_;
  const char* const name_;
  Mutex mu_;
};

// Scoped lock over a RankedMutex.
class ABSL_SCOPED_LOCKABLE RankedLock {
 public:
  explicit RankedLock(RankedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~RankedLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  RankedLock(const RankedLock&) = delete;
  RankedLock& operator=(const RankedLock&) = delete;

 private:
  RankedMutex* const mu_;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_RANKED_MUTEX_H_

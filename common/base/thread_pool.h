// SPDX-License-Identifier: Apache-2.0
// Runs closures on threads of its own, in the order scheduled (with one
// thread, one at a time): work a caller hands off so that its answer need
// not wait for it.
//
// A pool made with `max_threads` above `threads` grows: a closure scheduled
// while every thread is busy starts another one, up to `max_threads` (the
// threads stay until the pool is destroyed). That is for closures that
// wait on each other (a trainer's commit waiting for the other trainers of
// its host): none of them waits behind one still queued.
#ifndef REPVAR_COMMON_BASE_THREAD_POOL_H_
#define REPVAR_COMMON_BASE_THREAD_POOL_H_

#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "common/base/sync.h"

namespace repvar {

class ThreadPool {
 public:
  explicit ThreadPool(int threads, int max_threads = 0);
  // Runs everything already scheduled, then joins the threads.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(absl::AnyInvocable<void() &&> fn) ABSL_LOCKS_EXCLUDED(mu_);

  // Threads started so far (a test's view of growth).
  int threads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_threads_;
  mutable Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads not running a closure
  // Last: started once the members above exist.
  std::vector<Thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_THREAD_POOL_H_

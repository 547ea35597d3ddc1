// SPDX-License-Identifier: Apache-2.0
// Runs closures on threads of its own, in the order scheduled (with one
// thread, one at a time): work a caller hands off so that its answer need
// not wait for it.
#ifndef REPVAR_COMMON_BASE_THREAD_POOL_H_
#define REPVAR_COMMON_BASE_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace repvar {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  // Runs everything already scheduled, then joins the threads.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // last: started once the members above exist
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_THREAD_POOL_H_

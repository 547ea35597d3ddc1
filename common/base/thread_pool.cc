// SPDX-License-Identifier: Apache-2.0
#include "common/base/thread_pool.h"

#include <algorithm>
#include <utility>

namespace repvar {

ThreadPool::ThreadPool(int threads, int max_threads)
    : max_threads_(std::max({threads, max_threads, 1})) {
  MutexLock lock(&mu_);
  for (int i = 0; i < std::max(threads, 1); ++i) {
    ++idle_;
    threads_.emplace_back([this] { Loop(); });
  }
}

ThreadPool::~ThreadPool() {
  std::vector<Thread> threads;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);  // none starts once stopping
  }
  for (Thread& t : threads) t.join();
}

void ThreadPool::Schedule(absl::AnyInvocable<void() &&> fn) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
  if (!stopping_ && static_cast<size_t>(idle_) < queue_.size() &&
      static_cast<int>(threads_.size()) < max_threads_) {
    ++idle_;  // it takes a closure as soon as it runs
    threads_.emplace_back([this] { Loop(); });
  }
}

int ThreadPool::threads() const {
  MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

bool ThreadPool::ReadyLocked() const { return stopping_ || !queue_.empty(); }

void ThreadPool::Loop() {
  while (true) {
    absl::AnyInvocable<void() &&> fn;
    {
      MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ThreadPool::ReadyLocked));
      if (queue_.empty()) return;  // stopping, and everything ran
      fn = std::move(queue_.front());
      queue_.pop_front();
      --idle_;
    }
    std::move(fn)();
    MutexLock lock(&mu_);
    ++idle_;
  }
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/base/thread_pool.h"

#include <algorithm>
#include <utility>

namespace repvar {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

bool ThreadPool::ReadyLocked() const { return stopping_ || !queue_.empty(); }

void ThreadPool::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ThreadPool::ReadyLocked));
      if (queue_.empty()) return;  // stopping, and everything ran
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace repvar

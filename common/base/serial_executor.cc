// SPDX-License-Identifier: Apache-2.0
#include "common/base/serial_executor.h"

#include <utility>

namespace repvar {

SerialExecutor::SerialExecutor() : thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SerialExecutor::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

bool SerialExecutor::ReadyLocked() const { return stopping_ || !queue_.empty(); }

void SerialExecutor::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SerialExecutor::ReadyLocked));
      if (queue_.empty()) return;  // stopping, and everything ran
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// Runs closures one at a time, in the order scheduled, on a thread of its
// own: work a caller hands off so that its answer need not wait for it.
#ifndef REPVAR_COMMON_BASE_SERIAL_EXECUTOR_H_
#define REPVAR_COMMON_BASE_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace repvar {

class SerialExecutor {
 public:
  SerialExecutor();
  // Runs everything already scheduled, then joins the thread.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Schedule(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_SERIAL_EXECUTOR_H_

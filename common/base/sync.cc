// SPDX-License-Identifier: Apache-2.0
#include "common/base/sync.h"

#include <exception>
#include <utility>

namespace repvar {

using sync_internal::Cooperative;
using sync_internal::Current;

bool Mutex::AwaitWithDeadline(const absl::Condition& cond, absl::Time deadline) {
  if (Cooperative* c = Current()) return c->Await(mu_, cond, deadline);
  return mu_.AwaitWithDeadline(cond, deadline);
}

bool Mutex::AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout) {
  if (Cooperative* c = Current()) return c->Await(mu_, cond, c->Now() + timeout);
  return mu_.AwaitWithTimeout(cond, timeout);
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  Cooperative* c = Current();
  if (c == nullptr) return cv_.WaitWithDeadline(&mu->mu_, deadline);
  const uint64_t seen = signals_.load();
  auto signalled = [this, seen] { return signals_.load() != seen; };
  return !c->Await(mu->mu_, absl::Condition(&signalled), deadline);
}

void CondVar::Signal() {
  if (sync_internal::active.load(std::memory_order_acquire) != nullptr) ++signals_;
  cv_.Signal();
}

void CondVar::SignalAll() {
  if (sync_internal::active.load(std::memory_order_acquire) != nullptr) ++signals_;
  cv_.SignalAll();
}

void Notification::Notify() {
  MutexLock lock(&mu_);
  notified_.store(true, std::memory_order_release);
}

void Notification::WaitForNotification() const {
  WaitForNotificationWithDeadline(absl::InfiniteFuture());
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  if (HasBeenNotified()) return true;
  auto notified = [this] { return notified_.load(std::memory_order_acquire); };
  MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(&notified), deadline);
}

struct Thread::Simulated {
  Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
};

Thread::Thread(absl::AnyInvocable<void() &&> body) {
  Cooperative* c = Current();
  if (c == nullptr) {
    thread_ = std::thread(std::move(body));
    return;
  }
  simulated_ = std::make_shared<Simulated>();
  c->Start([s = simulated_, body = std::move(body)]() mutable {
    std::move(body)();
    MutexLock lock(&s->mu);
    s->done = true;
  });
}

Thread& Thread::operator=(Thread&& other) noexcept {
  if (joinable()) std::terminate();  // as std::thread: join first
  thread_ = std::move(other.thread_);
  simulated_ = std::move(other.simulated_);
  return *this;
}

Thread::~Thread() {
  if (thread_.joinable()) std::terminate();  // as std::thread: join first
}

void Thread::join() {
  if (thread_.joinable()) {
    thread_.join();
    return;
  }
  if (simulated_ == nullptr) return;
  {
    MutexLock lock(&simulated_->mu);
    simulated_->mu.Await(absl::Condition(&simulated_->done));
  }
  simulated_.reset();
}

}  // namespace repvar

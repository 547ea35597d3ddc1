// SPDX-License-Identifier: Apache-2.0
#include "sim/scheduler.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_ADDRESS__)
#define REPVAR_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REPVAR_SIM_ASAN 1
#endif
#endif
#ifdef REPVAR_SIM_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace repvar::sim {

struct Scheduler::SimThread {
  enum class State { kRunnable, kBlocked, kDone };
  enum class Wait { kNone, kLock, kAwait, kSleep };

  int id = 0;
  ProcessId process = 0;
  std::string name;
  State state = State::kRunnable;
  absl::AnyInvocable<void() &&> body;

  // While BLOCKED: what it waits for.
  Wait wait = Wait::kNone;
  absl::Mutex* mu = nullptr;
  const absl::Condition* cond = nullptr;
  absl::Time deadline = absl::InfiniteFuture();

  sync_internal::HeldLocks held;
  ucontext_t context;
  char* mapping = nullptr;  // a guard page, then the stack
};

struct Scheduler::Driver {
  ucontext_t context;
  // The driving thread's stack, for AddressSanitizer.
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
};

namespace {

constexpr size_t kGuardBytes = 4096;
constexpr size_t kStackBytes = size_t{1} << 20;

// The scheduler that drives this OS thread (set by Run), and the one whose
// thread a new context begins (Entry takes no arguments).
thread_local const Scheduler* tl_driving = nullptr;
Scheduler* g_scheduler = nullptr;

// AddressSanitizer must be told of every switch of stacks.
void StartSwitch([[maybe_unused]] void** fake_stack, [[maybe_unused]] const void* bottom,
                 [[maybe_unused]] size_t size) {
#ifdef REPVAR_SIM_ASAN
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#endif
}
void FinishSwitch([[maybe_unused]] void* fake_stack, [[maybe_unused]] const void** bottom_old,
                  [[maybe_unused]] size_t* size_old) {
#ifdef REPVAR_SIM_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#endif
}

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

// Threads that still wait when their scheduler goes: kept reachable, so
// that a leak checker does not report what is left on purpose.
std::vector<void*>& Graveyard() {
  static auto* graves = new std::vector<void*>;
  return *graves;
}

[[noreturn]] void Fatal(const std::string& what) {
  std::fprintf(stderr, "sim scheduler: %s\n", what.c_str());
  std::abort();
}

}  // namespace

Scheduler::Scheduler(Random* random, SchedulerOptions options)
    : random_(random), options_(options), driver_(std::make_unique<Driver>()) {
  sync_internal::Cooperative* none = nullptr;
  if (!sync_internal::active.compare_exchange_strong(none, this)) {
    Fatal("a second scheduler in one process");
  }
  g_scheduler = this;
  // absl's deadlock detector keeps the locks held per OS thread; the
  // simulated threads share one, so it would see their locks as one
  // thread's.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

Scheduler::~Scheduler() {
  for (SimThread* t : threads_) {
    if (t->state == SimThread::State::kDone) {
      munmap(t->mapping, kGuardBytes + kStackBytes);
      delete t;
    } else {
      Graveyard().push_back(t);  // blocked for good: its process is gone
    }
  }
  g_scheduler = nullptr;
  sync_internal::active.store(nullptr);
}

ProcessId Scheduler::NewProcess(std::string name) {
  processes_.push_back(Process{.name = std::move(name)});
  return static_cast<ProcessId>(processes_.size() - 1);
}

void Scheduler::Kill(ProcessId p) {
  processes_.at(p).alive = false;
  std::erase_if(active_, [p](const SimThread* t) { return t->process == p; });
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = it->second.process == p ? timers_.erase(it) : std::next(it);
  }
}

void Scheduler::Pause(ProcessId p, absl::Time until) {
  processes_.at(p).paused_until = std::max(processes_.at(p).paused_until, until);
}

void Scheduler::Resume(ProcessId p) { processes_.at(p).paused_until = absl::InfinitePast(); }

bool Scheduler::Alive(ProcessId p) const { return processes_.at(p).alive; }

const std::string& Scheduler::ProcessName(ProcessId p) const { return processes_.at(p).name; }

void Scheduler::Spawn(ProcessId p, std::string name, absl::AnyInvocable<void() &&> body) {
  SimThread* t;
  if (!idle_.empty()) {
    t = idle_.front();
    idle_.erase(idle_.begin());
  } else {
    t = NewThread();
  }
  t->process = p;
  t->name = std::move(name);
  t->body = std::move(body);
  t->state = SimThread::State::kRunnable;
  t->wait = SimThread::Wait::kNone;
  if (processes_.at(p).alive) Activate(t);
}

void Scheduler::Activate(SimThread* t) {
  auto at = std::lower_bound(active_.begin(), active_.end(), t,
                             [](const SimThread* a, const SimThread* b) { return a->id < b->id; });
  active_.insert(at, t);
}

void Scheduler::Deactivate(SimThread* t) { std::erase(active_, t); }

Scheduler::SimThread* Scheduler::NewThread() {
  auto* t = new SimThread;
  t->id = static_cast<int>(threads_.size());
  threads_.push_back(t);
  void* mapping = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (mapping == MAP_FAILED) Fatal("no memory for a thread's stack");
  t->mapping = static_cast<char*>(mapping);
  if (mprotect(t->mapping, kGuardBytes, PROT_NONE) != 0) Fatal("cannot guard a thread's stack");
  getcontext(&t->context);
  t->context.uc_stack.ss_sp = t->mapping + kGuardBytes;
  t->context.uc_stack.ss_size = kStackBytes;
  t->context.uc_link = nullptr;
  makecontext(&t->context, &Scheduler::Entry, 0);
  return t;
}

void Scheduler::Entry() {
  Scheduler* s = g_scheduler;
  SimThread* t = s->running_;
  FinishSwitch(nullptr, &s->driver_->stack_bottom, &s->driver_->stack_size);
  while (true) {
    std::move(t->body)();
    t->body = nullptr;
    t->state = SimThread::State::kDone;
    s->idle_.push_back(t);
    s->Deactivate(t);
    s->Yield(t);  // picked again with a new body
  }
}

void Scheduler::At(ProcessId p, absl::Time when, absl::AnyInvocable<void() &&> fn) {
  timers_.emplace(std::pair{std::max(when, now_), next_timer_++}, Timer{p, std::move(fn)});
}

ProcessId Scheduler::CurrentProcess() const {
  if (running_ != nullptr) return running_->process;
  return timer_process_;
}

void Scheduler::Halt() {
  if (!Runs()) Fatal("Halt on a thread the simulator does not run");
  SimThread* t = running_;
  Kill(t->process);
  t->state = SimThread::State::kBlocked;
  t->wait = SimThread::Wait::kSleep;
  t->deadline = absl::InfiniteFuture();
  while (true) Yield(t);  // never picked again: its process is dead
}

bool Scheduler::Runs() const { return tl_driving == this && running_ != nullptr; }

sync_internal::HeldLocks& Scheduler::Held() { return running_->held; }

void Scheduler::Yield(SimThread* t) {
  running_ = nullptr;
  void* fake_stack = nullptr;
  StartSwitch(&fake_stack, driver_->stack_bottom, driver_->stack_size);
  swapcontext(&t->context, &driver_->context);
  FinishSwitch(fake_stack, nullptr, nullptr);
}

void Scheduler::Lock(absl::Mutex& mu) {
  SimThread* t = running_;
  if (random_->Chance(options_.preempt_on_lock)) {
    t->state = SimThread::State::kRunnable;
    Yield(t);
  }
  while (!mu.TryLock()) {
    t->state = SimThread::State::kBlocked;
    t->wait = SimThread::Wait::kLock;
    t->mu = &mu;
    t->cond = nullptr;
    t->deadline = absl::InfiniteFuture();
    Yield(t);
  }
  taker_[&mu] = t->id;
}

bool Scheduler::Await(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) {
  SimThread* t = running_;
  while (true) {
    if (cond.Eval()) return true;
    if (now_ >= deadline) return false;
    t->state = SimThread::State::kBlocked;
    t->wait = SimThread::Wait::kAwait;
    t->mu = &mu;
    t->cond = &cond;
    t->deadline = deadline;
    mu.Unlock();
    Yield(t);
    // Picked because the lock was free and nothing has run since.
    if (!mu.TryLock()) Fatal(absl::StrCat(t->name, ": its lock was taken while it was picked"));
    taker_[&mu] = t->id;
  }
}

void Scheduler::Start(absl::AnyInvocable<void() &&> body) {
  Spawn(CurrentProcess(), "thread", std::move(body));
}

void Scheduler::SimClock::SleepFor(absl::Duration d) {
  if (!s_->Runs()) Fatal("SleepFor on a thread the simulator does not run");
  SimThread* t = s_->running_;
  t->state = SimThread::State::kBlocked;
  t->wait = SimThread::Wait::kSleep;
  t->mu = nullptr;
  t->cond = nullptr;
  t->deadline = s_->now_ + d;
  s_->Yield(t);
}

bool Scheduler::Ready(SimThread* t) {
  switch (t->wait) {
    case SimThread::Wait::kNone:
      return true;
    case SimThread::Wait::kSleep:
      return now_ >= t->deadline;
    case SimThread::Wait::kLock:
      if (!t->mu->TryLock()) return false;
      t->mu->Unlock();
      return true;
    case SimThread::Wait::kAwait: {
      if (!t->mu->TryLock()) return false;
      const bool holds = t->cond->Eval();
      t->mu->Unlock();
      return holds || now_ >= t->deadline;
    }
  }
  return false;
}

bool Scheduler::Eligible(const SimThread* t) const {
  const Process& p = processes_[t->process];
  return t->state != SimThread::State::kDone && p.alive && p.paused_until <= now_;
}

void Scheduler::RunThread(SimThread* t) {
  Mix(absl::ToUnixMicros(now_), static_cast<uint64_t>(t->id) << 1);
  t->state = SimThread::State::kRunnable;
  t->wait = SimThread::Wait::kNone;
  running_ = t;
  void* fake_stack = nullptr;
  StartSwitch(&fake_stack, t->mapping + kGuardBytes, kStackBytes);
  swapcontext(&driver_->context, &t->context);
  FinishSwitch(fake_stack, nullptr, nullptr);
  running_ = nullptr;
}

void Scheduler::FireTimer(std::multimap<std::pair<absl::Time, uint64_t>, Timer>::iterator it) {
  Mix(absl::ToUnixMicros(now_), (it->first.second << 1) | 1);
  Timer timer = std::move(it->second);
  timers_.erase(it);
  timer_process_ = timer.process;
  std::move(timer.fn)();
  timer_process_ = -1;
}

absl::Time Scheduler::NextWake() const {
  absl::Time next = absl::InfiniteFuture();
  auto wake = [&](ProcessId p, absl::Time at) {
    next = std::min(next, std::max(at, processes_[p].paused_until));
  };
  for (const auto& [key, timer] : timers_) {
    if (key.first >= next) break;  // in time order: none later is earlier
    if (processes_[timer.process].alive) wake(timer.process, key.first);
  }
  for (const SimThread* t : active_) {
    if (t->state == SimThread::State::kRunnable) {
      wake(t->process, now_);  // paused
    } else if (t->wait == SimThread::Wait::kSleep || t->wait == SimThread::Wait::kAwait) {
      wake(t->process, t->deadline);
    }
  }
  return next;
}

Scheduler::Stop Scheduler::Run(absl::FunctionRef<bool()> done, absl::Time until) {
  const Scheduler* const outer = tl_driving;
  tl_driving = this;
  const Stop stop = Loop(done, until);
  tl_driving = outer;
  return stop;
}

Scheduler::Stop Scheduler::Loop(absl::FunctionRef<bool()> done, absl::Time until) {
  std::vector<SimThread*> ready;
  std::vector<std::multimap<std::pair<absl::Time, uint64_t>, Timer>::iterator> due;
  while (true) {
    if (done()) return Stop::kDone;
    if (++steps_ > options_.max_steps) return Stop::kTooManySteps;
    ready.clear();
    due.clear();
    for (SimThread* t : active_) {
      if (!Eligible(t)) continue;
      if (t->state == SimThread::State::kRunnable || Ready(t)) ready.push_back(t);
    }
    for (auto it = timers_.begin(); it != timers_.end() && it->first.first <= now_; ++it) {
      const Process& p = processes_[it->second.process];
      if (p.paused_until <= now_) due.push_back(it);
    }
    if (const size_t n = ready.size() + due.size(); n > 0) {
      const size_t k = random_->Uniform(n);
      if (k < ready.size()) {
        RunThread(ready[k]);
      } else {
        FireTimer(due[k - ready.size()]);
      }
      continue;
    }
    const absl::Time next = NextWake();
    if (next == absl::InfiniteFuture()) return Stop::kIdle;
    if (next > until) {
      now_ = until;
      return Stop::kTimeLimit;
    }
    now_ = next;
  }
}

std::vector<std::string> Scheduler::Waiting() const {
  std::vector<std::string> lines;
  for (const SimThread* t : threads_) {
    if (t->state == SimThread::State::kDone || !processes_[t->process].alive) continue;
    if (t->state == SimThread::State::kRunnable) {
      lines.push_back(
          absl::StrCat(processes_[t->process].name, "/", t->name, " (thread ", t->id, ") may run"));
      continue;
    }
    const char* what = t->wait == SimThread::Wait::kLock    ? "a lock"
                       : t->wait == SimThread::Wait::kSleep ? "time to pass"
                                                            : "a condition";
    std::string holder;
    if (t->wait == SimThread::Wait::kLock) {
      if (auto it = taker_.find(t->mu); it != taker_.end()) {
        const SimThread* h = threads_[it->second];
        holder =
            absl::StrCat(" (last taken by ", processes_[h->process].name, "/", h->name, ", thread ",
                         h->id, processes_[h->process].alive ? "" : ", dead", ")");
      }
    }
    lines.push_back(absl::StrCat(processes_[t->process].name, "/", t->name, " (thread ", t->id,
                                 ") waits for ", what, holder,
                                 t->deadline == absl::InfiniteFuture()
                                     ? ""
                                     : absl::StrCat(" until ", absl::FormatTime(t->deadline))));
  }
  return lines;
}

void Scheduler::Mix(uint64_t a, uint64_t b) {
  digest_ = Mix64(digest_ ^ Mix64(a + 0x9e3779b97f4a7c15 * (b + 1)));
}

}  // namespace repvar::sim

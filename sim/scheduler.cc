// SPDX-License-Identifier: Apache-2.0
#include "sim/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace repvar::sim {

struct Scheduler::SimThread {
  enum class State { kRunnable, kBlocked, kDone };
  enum class Wait { kNone, kLock, kAwait, kSleep };

  int id = 0;
  ProcessId process = 0;
  std::string name;
  State state = State::kRunnable;
  absl::AnyInvocable<void() &&> body;
  bool quit = false;  // an idle carrier told to end (~Scheduler)

  // While BLOCKED: what it waits for.
  Wait wait = Wait::kNone;
  absl::Mutex* mu = nullptr;
  const absl::Condition* cond = nullptr;
  absl::Time deadline = absl::InfiniteFuture();

  std::binary_semaphore go{0};
  std::thread os;
};

namespace {

// The simulated thread running on this OS thread, and its scheduler.
thread_local void* tl_thread = nullptr;
thread_local const Scheduler* tl_scheduler = nullptr;

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
    : random_(random), options_(options) {
  sync_internal::Cooperative* none = nullptr;
  if (!sync_internal::active.compare_exchange_strong(none, this)) {
    Fatal("a second scheduler in one process");
  }
}

Scheduler::~Scheduler() {
  for (SimThread* t : threads_) {
    if (t->state == SimThread::State::kDone) {
      t->quit = true;
      t->go.release();
      t->os.join();
      delete t;
    } else {
      t->os.detach();  // blocked for good: its process is gone
      Graveyard().push_back(t);
    }
  }
  sync_internal::active.store(nullptr);
}

ProcessId Scheduler::NewProcess(std::string name) {
  processes_.push_back(Process{.name = std::move(name)});
  return static_cast<ProcessId>(processes_.size() - 1);
}

void Scheduler::Kill(ProcessId p) {
  processes_.at(p).alive = false;
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
    t = new SimThread;
    t->id = static_cast<int>(threads_.size());
    threads_.push_back(t);
    t->os = std::thread([this, t] {
      tl_thread = t;
      tl_scheduler = this;
      t->go.acquire();
      while (!t->quit) {
        std::move(t->body)();
        t->body = nullptr;
        t->state = SimThread::State::kDone;
        idle_.push_back(t);
        driver_.release();
        t->go.acquire();
      }
    });
  }
  t->process = p;
  t->name = std::move(name);
  t->body = std::move(body);
  t->state = SimThread::State::kRunnable;
  t->wait = SimThread::Wait::kNone;
}

void Scheduler::At(ProcessId p, absl::Time when, absl::AnyInvocable<void() &&> fn) {
  timers_.emplace(std::pair{std::max(when, now_), next_timer_++}, Timer{p, std::move(fn)});
}

ProcessId Scheduler::CurrentProcess() const {
  if (running_ != nullptr) return running_->process;
  return timer_process_;
}

void Scheduler::Halt() {
  auto* t = static_cast<SimThread*>(tl_thread);
  if (t == nullptr || tl_scheduler != this) Fatal("Halt on a thread the simulator does not run");
  Kill(t->process);
  t->state = SimThread::State::kBlocked;
  t->wait = SimThread::Wait::kSleep;
  t->deadline = absl::InfiniteFuture();
  while (true) Yield(t);  // never picked again: its process is dead
}

bool Scheduler::Runs() const { return tl_scheduler == this && tl_thread != nullptr; }

void Scheduler::Yield(SimThread* t) {
  running_ = nullptr;
  driver_.release();
  t->go.acquire();
}

void Scheduler::Lock(absl::Mutex& mu) {
  auto* t = static_cast<SimThread*>(tl_thread);
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
  auto* t = static_cast<SimThread*>(tl_thread);
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
  auto* t = static_cast<SimThread*>(tl_thread);
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
  t->go.release();
  driver_.acquire();
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
    if (processes_[timer.process].alive) wake(timer.process, key.first);
  }
  for (const SimThread* t : threads_) {
    if (t->state == SimThread::State::kDone || !processes_[t->process].alive) continue;
    if (t->state == SimThread::State::kRunnable) {
      wake(t->process, now_);  // paused
    } else if (t->wait == SimThread::Wait::kSleep || t->wait == SimThread::Wait::kAwait) {
      wake(t->process, t->deadline);
    }
  }
  return next;
}

Scheduler::Stop Scheduler::Run(absl::FunctionRef<bool()> done, absl::Time until) {
  std::vector<SimThread*> ready;
  std::vector<std::multimap<std::pair<absl::Time, uint64_t>, Timer>::iterator> due;
  while (true) {
    if (done()) return Stop::kDone;
    if (++steps_ > options_.max_steps) return Stop::kTooManySteps;
    ready.clear();
    due.clear();
    for (SimThread* t : threads_) {
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

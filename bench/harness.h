// SPDX-License-Identifier: Apache-2.0
// The benchmarks' harness (repvar_bench, grpc_step_floor): trainer threads
// and a process's CPU time, the same on both sides of a comparison.
#ifndef REPVAR_BENCH_HARNESS_H_
#define REPVAR_BENCH_HARNESS_H_

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <semaphore>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace repvar::bench {

// The trainers of a step: one long-lived thread per worker, as real trainers
// are long-lived processes (creating and joining 32 threads costs 4-5 ms on
// this VM). `Run(fn)` runs fn(w) on every trainer at once and returns when
// all have returned.
class Trainers {
 public:
  explicit Trainers(int n) : n_(n) {
    for (int w = 0; w < n; ++w) go_.push_back(std::make_unique<std::binary_semaphore>(0));
    for (int w = 0; w < n; ++w) threads_.emplace_back([this, w] { Loop(w); });
  }
  int size() const { return n_; }
  ~Trainers() {
    stop_ = true;
    for (auto& go : go_) go->release();
    for (std::thread& t : threads_) t.join();
  }

  // Runs fn(w) on every trainer w and returns when all have. Each trainer
  // is woken on its own (no herd of 32 threads on one lock): the harness's
  // own CPU, taken from the 2 cores the cluster runs on, stays small.
  void Run(const std::function<void(int)>& fn) {
    fn_ = &fn;  // published to the trainers by the releases below
    remaining_.store(n_);
    for (auto& go : go_) go->release();
    done_.acquire();
    fn_ = nullptr;
  }

 private:
  void Loop(int w) {
    while (true) {
      go_[w]->acquire();
      if (stop_) return;
      (*fn_)(w);
      if (remaining_.fetch_sub(1) == 1) done_.release();
    }
  }

  const int n_;
  std::vector<std::unique_ptr<std::binary_semaphore>> go_;
  std::binary_semaphore done_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* fn_ = nullptr;
  std::vector<std::thread> threads_;
};

// CPU seconds (user + system) process `pid` has used, from /proc.
inline double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  // The fields after the command name (which ends with ')') start at the
  // 3rd; utime is the 14th, stime the 15th.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  long ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stol(field);
  }
  return static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Context switches (voluntary and not) of every thread process `pid` has
// now, from /proc: on this VM each costs more CPU than most of the work of
// a small call (bench/README.md), so the small-op figures count them.
inline long ContextSwitches(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  long total = 0;
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
    std::ifstream f(task.path() / "status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.starts_with("voluntary_ctxt_switches:") ||
          line.starts_with("nonvoluntary_ctxt_switches:")) {
        total += std::stol(line.substr(line.find(':') + 1));
      }
    }
  }
  return total;
}

}  // namespace repvar::bench

#endif  // REPVAR_BENCH_HARNESS_H_

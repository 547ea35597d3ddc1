// SPDX-License-Identifier: Apache-2.0
// The benchmarks' harness (repvar_bench, grpc_step_floor): trainer threads
// and a process's CPU time, the same on both sides of a comparison.
#ifndef REPVAR_BENCH_HARNESS_H_
#define REPVAR_BENCH_HARNESS_H_

#include <unistd.h>

#include <atomic>
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

}  // namespace repvar::bench

#endif  // REPVAR_BENCH_HARNESS_H_

// SPDX-License-Identifier: Apache-2.0
// The benchmarks' trainer threads (repvar_bench, grpc_step_floor): the same
// harness on both sides of a comparison.
#ifndef REPVAR_BENCH_TRAINERS_H_
#define REPVAR_BENCH_TRAINERS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <semaphore>
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

}  // namespace repvar::bench

#endif  // REPVAR_BENCH_TRAINERS_H_

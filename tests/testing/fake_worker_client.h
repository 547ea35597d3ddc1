// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_
#define REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/core/worker_client.h"

namespace repvar::testing {

// The workers as the coordinator core sees them, in memory: records what
// each was sent and fails the workers the test tells it to. A call completes
// at once (its `done` runs before the call returns) unless the test holds
// it: then it waits in a queue until the test completes it (Ray's
// queued-callback fakes). Thread-safe: the coordinator calls from many
// threads.
class FakeWorkerClient final : public server::WorkerClient {
 public:
  struct Held {
    int64_t version = 0;
    uint64_t checksum = 0;
    uint64_t incarnation = 0;
    std::shared_ptr<const Tensor> value;
  };

  void WriteReplicasAsync(const server::WorkerTarget& target,
                          const std::vector<ReplicaWrite>& writes, Done done) override {
    bool held = false;
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      held = manual_;
      for (const auto& w : writes) held = held || (hold_ != 0 && w.variable_id == hold_);
    }
    auto shared_done = std::make_shared<Done>(std::move(done));
    std::function<void()> call = [this, target, writes, done = shared_done]() mutable {
      std::move (*done)(Write(target, writes));
    };
    std::function<void()> cancel = [done = shared_done] {
      std::move (*done)(absl::CancelledError("cancelled: the worker was declared dead"));
    };
    Dispatch(target.task.ToString(), std::move(call), std::move(cancel), held);
  }
  // Held calls to `target` end at once with CANCELLED, as gRPC ends them.
  void CancelCalls(const server::WorkerTarget& target) override {
    std::vector<std::function<void()>> cancels;
    {
      absl::MutexLock lock(&mu_);
      ++cancels_;
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->task == target.task.ToString()) {
          cancels.push_back(std::move(it->cancel));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& c : cancels) c();
  }
  int cancels() {
    absl::MutexLock lock(&mu_);
    return cancels_;
  }
  void ReadReplicaAsync(const server::WorkerTarget& target, uint64_t variable_id, int32_t replica,
                        int64_t, ReadDone done) override {
    absl::StatusOr<ReplicaValue> r = Read(target, variable_id, replica);
    std::move(done)(std::move(r));
  }
  void DropVariableAsync(const server::WorkerTarget& target, uint64_t variable_id,
                         Done done) override {
    absl::Status dropped = absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      if (auto f = failures_.find(target.task.ToString()); f != failures_.end()) {
        dropped = f->second;
      }
      for (auto it = held_.begin(); dropped.ok() && it != held_.end();) {
        if (std::get<0>(it->first) == target.task.ToString() &&
            std::get<1>(it->first) == variable_id) {
          it = held_.erase(it);
        } else {
          ++it;
        }
      }
    }
    std::move(done)(std::move(dropped));
  }

  void ListReplicasAsync(const server::WorkerTarget& target, uint64_t fence_floor,
                         absl::Time /*deadline*/, ListDone done) override {
    absl::StatusOr<std::vector<HeldReplica>> out;
    {
      absl::MutexLock lock(&mu_);
      ++lists_;
      uint64_t& floor = floors_[target.task.ToString()];
      floor = std::max(floor, fence_floor);
      auto f = failures_.find(target.task.ToString());
      if (f != failures_.end()) {
        out = f->second;
      } else {
        std::vector<HeldReplica> held;
        for (const auto& [key, h] : held_) {
          // A new incarnation is a new process: it holds nothing of the old one.
          if (std::get<0>(key) != target.task.ToString() || h.incarnation != target.incarnation) {
            continue;
          }
          held.push_back(HeldReplica{std::get<1>(key), std::get<2>(key), h.version, h.checksum});
        }
        out = std::move(held);
      }
    }
    std::move(done)(std::move(out));
  }

  // Makes `task` hold `held` as replica `replica` of `variable_id` (what a
  // write the coordinator never heard back from may leave).
  void Plant(const std::string& task, uint64_t variable_id, int32_t replica, Held held) {
    absl::MutexLock lock(&mu_);
    held_[{task, variable_id, replica}] = std::move(held);
  }
  int lists() {
    absl::MutexLock lock(&mu_);
    return lists_;
  }
  // The highest fence a write to `task` carried (0: none yet).
  uint64_t fence(const std::string& task) {
    absl::MutexLock lock(&mu_);
    auto it = fences_.find(task);
    return it == fences_.end() ? 0 : it->second;
  }

  // Parks every write of `variable_id` until ReleaseWrites() (a write in
  // flight).
  void HoldWritesOf(uint64_t variable_id) {
    absl::MutexLock lock(&mu_);
    hold_ = variable_id;
  }
  // Completes the parked writes and stops parking.
  void ReleaseWrites() {
    {
      absl::MutexLock lock(&mu_);
      hold_ = 0;
    }
    CompleteAll();
  }
  // Every later write waits until the test completes it.
  void SetManual(bool manual) {
    absl::MutexLock lock(&mu_);
    manual_ = manual;
  }
  // Writes waiting to complete.
  int parked() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(queue_.size());
  }
  // Completes the oldest waiting write; false when none waits.
  bool CompleteNext() {
    std::function<void()> call;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return false;
      call = std::move(queue_.front().run);
      queue_.pop_front();
    }
    call();
    return true;
  }
  void CompleteAll() {
    while (CompleteNext()) {
    }
  }

  // Every write to `task` fails with DEADLINE_EXCEEDED as far as the
  // coordinator can tell, but is kept: LandLate() applies it afterwards, as
  // a worker paused mid-write does when it resumes (fenced as a worker
  // fences, unless `fenced` is false: the negative control).
  void LoseAnswersOf(const std::string& task) {
    absl::MutexLock lock(&mu_);
    lose_answers_ = task;
  }
  // Applies the kept writes; returns how many of them landed.
  int LandLate(bool fenced = true) {
    std::vector<std::pair<server::WorkerTarget, std::vector<ReplicaWrite>>> late;
    {
      absl::MutexLock lock(&mu_);
      lose_answers_.clear();
      late.swap(late_);
    }
    int landed = 0;
    for (auto& [target, writes] : late) {
      if (!fenced) {
        for (ReplicaWrite& w : writes) w.fence = UINT64_MAX;
      }
      absl::MutexLock lock(&mu_);
      landed += Apply(target, writes).ok() ? 1 : 0;
    }
    return landed;
  }

  // Every call to `task` ("job:task") fails with `status` until cleared.
  void Fail(const std::string& task, absl::Status status) {
    absl::MutexLock lock(&mu_);
    failures_[task] = std::move(status);
  }
  void Heal(const std::string& task) {
    absl::MutexLock lock(&mu_);
    failures_.erase(task);
  }
  // The distinct value objects (Tensors) the last write call to `task`
  // carried, however many writes named them.
  size_t DistinctValuesLastSent(const std::string& task) {
    absl::MutexLock lock(&mu_);
    return last_values_[task];
  }

  std::optional<Held> Get(const std::string& task, uint64_t variable_id, int32_t replica) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find({task, variable_id, replica});
    if (it == held_.end()) return std::nullopt;
    return it->second;
  }
  // What a worker does when it installs a committed step value.
  void Install(const std::string& task, uint64_t variable_id, int32_t replica, int64_t version,
               const Tensor& value) {
    absl::MutexLock lock(&mu_);
    Held& h = held_[{task, variable_id, replica}];
    h.version = version;
    h.checksum = value.checksum;
    h.value = std::make_shared<const Tensor>(*Tensor::FromBytes(value.spec, value.bytes.span()));
  }
  int reads() {
    absl::MutexLock lock(&mu_);
    return reads_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // (task, collective) of every write that asked for the data plane.
  std::vector<std::pair<std::string, CollectiveSpec>> collectives() {
    absl::MutexLock lock(&mu_);
    return collectives_;
  }

 private:
  struct Pending {
    std::string task;
    std::function<void()> run;
    std::function<void()> cancel;
  };
  void Dispatch(std::string task, std::function<void()> call, std::function<void()> cancel,
                bool held) {
    if (!held) {
      call();
      return;
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back(Pending{std::move(task), std::move(call), std::move(cancel)});
  }

  absl::Status Write(const server::WorkerTarget& target, const std::vector<ReplicaWrite>& writes) {
    absl::MutexLock lock(&mu_);
    std::set<const Tensor*> values;
    for (const auto& w : writes) values.insert(w.value.get());
    last_values_[target.task.ToString()] = values.size();
    auto f = failures_.find(target.task.ToString());
    if (f != failures_.end()) return f->second;
    if (target.task.ToString() == lose_answers_) {
      late_.push_back({target, writes});
      return absl::DeadlineExceededError("no answer in time");
    }
    return Apply(target, writes);
  }

  absl::Status Apply(const server::WorkerTarget& target, const std::vector<ReplicaWrite>& writes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Fenced as a worker fences (worker/core/replica_store.h).
    for (const auto& w : writes) {
      const uint64_t floor = std::max(floors_[target.task.ToString()],
                                      variable_fences_[{target.task.ToString(), w.variable_id}]);
      if (w.fence < floor) return absl::AbortedError("superseded by a later write");
    }
    for (const auto& w : writes) {
      uint64_t& vf = variable_fences_[{target.task.ToString(), w.variable_id}];
      vf = std::max(vf, w.fence);
      uint64_t& tf = fences_[target.task.ToString()];
      tf = std::max(tf, w.fence);
      if (w.collective) collectives_.push_back({target.task.ToString(), *w.collective});
      for (int32_t r : w.replicas) {
        auto copy = Tensor::FromBytes(w.value->spec, w.value->bytes.span());
        held_[{target.task.ToString(), w.variable_id, r}] =
            Held{w.version, w.value->checksum, target.incarnation,
                 std::make_shared<const Tensor>(*std::move(copy))};
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ReplicaValue> Read(const server::WorkerTarget& target, uint64_t variable_id,
                                    int32_t replica) {
    absl::MutexLock lock(&mu_);
    ++reads_;
    auto f = failures_.find(target.task.ToString());
    if (f != failures_.end()) return f->second;
    auto it = held_.find({target.task.ToString(), variable_id, replica});
    if (it == held_.end()) return absl::NotFoundError("no such replica");
    return ReplicaValue{it->second.version, it->second.value};
  }

  absl::Mutex mu_;
  std::map<std::tuple<std::string, uint64_t, int32_t>, Held> held_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  int cancels_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
  int lists_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> fences_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> floors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> last_values_ ABSL_GUARDED_BY(mu_);
  std::string lose_answers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<server::WorkerTarget, std::vector<ReplicaWrite>>> late_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, uint64_t>, uint64_t> variable_fences_ ABSL_GUARDED_BY(mu_);
  uint64_t hold_ ABSL_GUARDED_BY(mu_) = 0;
  bool manual_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<std::string, CollectiveSpec>> collectives_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_

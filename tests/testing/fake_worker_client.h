// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_
#define REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
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

  void WriteReplicasAsync(const server::WorkerTarget& target, std::vector<ReplicaWrite> writes,
                          Done done) override {
    bool held = false;
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      held = manual_;
      for (const auto& w : writes) held = held || (hold_ != 0 && w.variable_id == hold_);
    }
    std::function<void()> call = [this, target, writes = std::move(writes),
                                  done = std::make_shared<Done>(std::move(done))]() mutable {
      std::move (*done)(Write(target, writes));
    };
    Dispatch(std::move(call), held);
  }
  void ReadReplicaAsync(const server::WorkerTarget& target, uint64_t variable_id, int32_t replica,
                        int64_t, ReadDone done) override {
    absl::StatusOr<ReplicaValue> r = Read(target, variable_id, replica);
    std::move(done)(std::move(r));
  }
  void DropVariableAsync(const server::WorkerTarget& target, uint64_t variable_id,
                         Done done) override {
    {
      absl::MutexLock lock(&mu_);
      for (auto it = held_.begin(); it != held_.end();) {
        if (std::get<0>(it->first) == target.task.ToString() &&
            std::get<1>(it->first) == variable_id) {
          it = held_.erase(it);
        } else {
          ++it;
        }
      }
    }
    std::move(done)(absl::OkStatus());
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
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    call();
    return true;
  }
  void CompleteAll() {
    while (CompleteNext()) {
    }
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
  void Dispatch(std::function<void()> call, bool held) {
    if (!held) {
      call();
      return;
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(call));
  }

  absl::Status Write(const server::WorkerTarget& target, const std::vector<ReplicaWrite>& writes) {
    absl::MutexLock lock(&mu_);
    auto f = failures_.find(target.task.ToString());
    if (f != failures_.end()) return f->second;
    for (const auto& w : writes) {
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
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hold_ ABSL_GUARDED_BY(mu_) = 0;
  bool manual_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<std::string, CollectiveSpec>> collectives_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_

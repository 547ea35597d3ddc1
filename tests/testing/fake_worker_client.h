// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_
#define REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/synchronization/mutex.h"
#include "server/worker_client.h"

namespace repvar::testing {

// Records what each worker was sent, in memory, and fails the workers the
// test tells it to. Thread-safe: the coordinator calls workers in parallel.
class FakeWorkerClient final : public server::WorkerClient {
 public:
  struct Held {
    int64_t version = 0;
    uint64_t checksum = 0;
    uint64_t incarnation = 0;
    std::shared_ptr<const Tensor> value;
  };

  absl::Status WriteReplicas(const server::WorkerTarget& target,
                             std::span<const ReplicaWrite> writes) override {
    absl::MutexLock lock(&mu_);
    bool held = false;
    for (const auto& w : writes) held = held || w.variable_id == hold_;
    if (held) {  // HoldWritesOf() parks these writes here
      ++waiting_;
      mu_.Await(absl::Condition(
          +[](uint64_t* hold) { return *hold == 0; }, &hold_));
      --waiting_;
    }
    ++calls_;
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
  absl::StatusOr<ReplicaValue> ReadReplica(const server::WorkerTarget& target, uint64_t variable_id,
                                           int32_t replica) override {
    absl::MutexLock lock(&mu_);
    ++reads_;
    auto f = failures_.find(target.task.ToString());
    if (f != failures_.end()) return f->second;
    auto it = held_.find({target.task.ToString(), variable_id, replica});
    if (it == held_.end()) return absl::NotFoundError("no such replica");
    return ReplicaValue{it->second.version, it->second.value};
  }
  absl::Status DropVariable(const server::WorkerTarget& target, uint64_t variable_id) override {
    absl::MutexLock lock(&mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      if (std::get<0>(it->first) == target.task.ToString() &&
          std::get<1>(it->first) == variable_id) {
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
    return absl::OkStatus();
  }

  // Parks every write of `variable_id` until ReleaseWrites() (a write in
  // flight).
  void HoldWritesOf(uint64_t variable_id) {
    absl::MutexLock lock(&mu_);
    hold_ = variable_id;
  }
  void ReleaseWrites() {
    absl::MutexLock lock(&mu_);
    hold_ = 0;
  }
  // Writes parked by HoldWritesOf().
  int parked() {
    absl::MutexLock lock(&mu_);
    return waiting_;
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
  absl::Mutex mu_;
  std::map<std::tuple<std::string, uint64_t, int32_t>, Held> held_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hold_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::string, CollectiveSpec>> collectives_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_FAKE_WORKER_CLIENT_H_

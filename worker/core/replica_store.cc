// SPDX-License-Identifier: Apache-2.0
#include "worker/core/replica_store.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"

namespace repvar::worker {

absl::Status ReplicaStore::Apply(std::vector<ReplicaWrite> items) {
  // Old values are released after the lock is dropped (munmap can be slow).
  std::vector<std::shared_ptr<const Tensor>> released;
  bool fenced = false;
  {
    MutexLock lock(&mu_);
    REPVAR_RETURN_IF_ERROR(ApplyLocked(items, released, fenced));
    changes_.fetch_add(1, std::memory_order_release);
  }
  if (listener_ != nullptr && fenced) listener_->Written(items);
  return absl::OkStatus();
}

absl::StatusOr<StoredReplica> ReplicaStore::First(uint64_t variable_id) const {
  MutexLock lock(&mu_);
  auto it = replicas_.lower_bound({variable_id, INT32_MIN});
  if (it == replicas_.end() || it->first.first != variable_id) {
    return absl::NotFoundError(absl::StrCat("variable id ", variable_id, " is not held here"));
  }
  return it->second;
}

absl::Status ReplicaStore::ApplyLocked(std::vector<ReplicaWrite>& items,
                                       std::vector<std::shared_ptr<const Tensor>>& released,
                                       bool& fenced) {
  for (const ReplicaWrite& item : items) {
    if (item.fence == 0) continue;
    auto f = fences_.find(item.variable_id);
    const uint64_t floor = std::max(fence_floor_, f == fences_.end() ? 0 : f->second);
    if (item.fence < floor && !BugSeeded(SeededBug::kFencesIgnored)) {
      return absl::AbortedError(absl::StrCat(
          "write of ", item.name, " version ", item.version, " (fence ", item.fence,
          ") was superseded by a later write or repair (fence ", floor, "); nothing applied"));
    }
  }
  for (ReplicaWrite& item : items) {
    if (item.fence != 0) {
      fenced = true;
      uint64_t& f = fences_[item.variable_id];
      f = std::max(f, item.fence);
    }
    for (int32_t r : item.replicas) {
      StoredReplica& s = replicas_[{item.variable_id, r}];
      if (s.value) released.push_back(std::move(s.value));
      s = StoredReplica{item.variable_id,     item.name, r, item.version,
                        item.value->checksum, item.value};
    }
  }
  applied_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<StoredReplica> ReplicaStore::WaitFor(uint64_t variable_id, int32_t replica,
                                                    int64_t min_version,
                                                    absl::Time deadline) const {
  MutexLock lock(&mu_);
  bool timed_out = false;
  while (true) {
    // Looked up again after each wait: a Drop meanwhile erases the entry.
    auto it = replicas_.find({variable_id, replica});
    if (it == replicas_.end()) {
      return absl::NotFoundError(
          absl::StrCat("replica ", replica, " of variable id ", variable_id, " is not held here"));
    }
    if (it->second.version >= min_version) return it->second;
    if (timed_out) {
      return absl::UnavailableError(absl::StrCat("replica ", replica, " of variable id ",
                                                 variable_id, " is at version ", it->second.version,
                                                 ", not yet ", min_version));
    }
    ++waiting_;
    timed_out = applied_.WaitWithDeadline(&mu_, deadline);
    --waiting_;
  }
}

int ReplicaStore::Waiting() const {
  MutexLock lock(&mu_);
  return waiting_;
}

absl::StatusOr<StoredReplica> ReplicaStore::Get(uint64_t variable_id, int32_t replica) const {
  MutexLock lock(&mu_);
  auto it = replicas_.find({variable_id, replica});
  if (it == replicas_.end()) {
    return absl::NotFoundError(
        absl::StrCat("replica ", replica, " of variable id ", variable_id, " is not held here"));
  }
  return it->second;
}

void ReplicaStore::Drop(uint64_t variable_id) {
  std::vector<std::shared_ptr<const Tensor>> released;
  {
    MutexLock lock(&mu_);
    auto it = replicas_.lower_bound({variable_id, INT32_MIN});
    while (it != replicas_.end() && it->first.first == variable_id) {
      released.push_back(std::move(it->second.value));
      it = replicas_.erase(it);
    }
    changes_.fetch_add(1, std::memory_order_release);
    applied_.SignalAll();  // a WaitFor for a replica dropped ends now
  }
  if (listener_ != nullptr) listener_->Dropped(variable_id);
}

std::vector<StoredReplica> ReplicaStore::FenceAndList(uint64_t floor) {
  MutexLock lock(&mu_);
  fence_floor_ = std::max(fence_floor_, floor);
  std::vector<StoredReplica> out;
  for (const auto& [key, r] : replicas_) out.push_back(r);
  return out;
}

std::vector<StoredReplica> ReplicaStore::List() const {
  MutexLock lock(&mu_);
  std::vector<StoredReplica> out;
  for (const auto& [key, r] : replicas_) out.push_back(r);
  return out;
}

uint64_t ReplicaStore::BytesHeld() const {
  MutexLock lock(&mu_);
  std::set<const Tensor*> seen;
  uint64_t total = 0;
  for (const auto& [key, r] : replicas_) {
    if (seen.insert(r.value.get()).second) total += r.value->bytes.size();
  }
  return total;
}

}  // namespace repvar::worker

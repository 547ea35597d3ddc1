// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_CORE_REPLICA_STORE_H_
#define REPVAR_WORKER_CORE_REPLICA_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "common/base/sync.h"
#include "common/model/replica_write.h"
#include "common/tensor/tensor.h"

namespace repvar::worker {

struct StoredReplica {
  uint64_t variable_id = 0;
  std::string name;
  int32_t replica = 0;
  int64_t version = 0;
  uint64_t checksum = 0;
  std::shared_ptr<const Tensor> value;
};

// Told, after the fact and before the caller goes on, of what changes the
// value of a replica other than a step's install (LocalReads).
class ReplicaListener {
 public:
  virtual ~ReplicaListener() = default;
  // The coordinator's writes (items with a fence) were applied.
  virtual void Written(const std::vector<ReplicaWrite>& items) = 0;
  virtual void Dropped(uint64_t variable_id) = 0;
};

// The replicas this worker holds, in resident memory. A cross-replica write
// gives every local replica of a variable the same immutable value, so the
// bytes are held once per worker; readers keep a reference to the version
// they read, so a concurrent write never tears a read. The coordinator is the
// authority on versions: the store keeps what it is told, except a write
// fenced off by a later one (ReplicaWrite::fence). Thread-safe.
class ReplicaStore {
 public:
  // Applies all items or none (they are validated by the caller). Items
  // with a fence (the coordinator's writes) are refused with ABORTED when a
  // write with a higher fence of the same variable was applied here, even
  // if the variable was dropped since; items without one (this worker's
  // installs of a step's result) are not fenced.
  absl::Status Apply(std::vector<ReplicaWrite> items) ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: NOT_FOUND.
  absl::StatusOr<StoredReplica> Get(uint64_t variable_id, int32_t replica) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The local replica of `variable_id` with the lowest index. Errors:
  // NOT_FOUND.
  absl::StatusOr<StoredReplica> First(uint64_t variable_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Set once, before any write: told of every write with a fence and every
  // drop.
  void set_listener(ReplicaListener* listener) { listener_ = listener; }
  // The replica once it holds at least `min_version` (a step's value is
  // installed right after the step commits), waiting until `deadline`.
  // Errors: NOT_FOUND (also as soon as the variable is dropped while
  // waiting), UNAVAILABLE (still older at the deadline).
  absl::StatusOr<StoredReplica> WaitFor(uint64_t variable_id, int32_t replica, int64_t min_version,
                                        absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);
  // Reads in WaitFor waiting for a newer version now.
  int Waiting() const ABSL_LOCKS_EXCLUDED(mu_);
  void Drop(uint64_t variable_id) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<StoredReplica> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // Raises the floor below which every fenced write is refused to `floor`
  // (never lowers it), then lists, atomically: no write with a lower fence
  // lands after the list was taken.
  std::vector<StoredReplica> FenceAndList(uint64_t floor) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes of distinct tensors held.
  uint64_t BytesHeld() const ABSL_LOCKS_EXCLUDED(mu_);
  // How many Applies and Drops have completed: while it stays the same, so
  // do the replicas held.
  uint64_t Changes() const { return changes_.load(std::memory_order_acquire); }

 private:
  // Apply's checks and changes, under the lock.
  absl::Status ApplyLocked(std::vector<ReplicaWrite>& items,
                           std::vector<std::shared_ptr<const Tensor>>& released, bool& fenced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ReplicaListener* listener_ = nullptr;
  mutable Mutex mu_;
  mutable CondVar applied_;  // Apply() ran
  std::atomic<uint64_t> changes_{0};
  // Ordered (a variable's replicas are adjacent), a few replicas per
  // allocated node rather than one; B-trees also grow without rehashing.
  absl::btree_map<std::pair<uint64_t, int32_t>, StoredReplica> replicas_ ABSL_GUARDED_BY(mu_);
  // The highest fence applied per variable id; kept after a drop, so that a
  // delayed write cannot bring a dropped variable back (16 bytes per id).
  absl::btree_map<uint64_t, uint64_t> fences_ ABSL_GUARDED_BY(mu_);
  uint64_t fence_floor_ ABSL_GUARDED_BY(mu_) = 0;  // for every variable
  mutable int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_REPLICA_STORE_H_

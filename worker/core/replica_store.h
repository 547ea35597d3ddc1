// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_CORE_REPLICA_STORE_H_
#define REPVAR_WORKER_CORE_REPLICA_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

// The replicas this worker holds, in resident memory. A cross-replica write
// gives every local replica of a variable the same immutable value, so the
// bytes are held once per worker; readers keep a reference to the version
// they read, so a concurrent write never tears a read. The coordinator is the
// authority on versions: the store keeps what it is told. Thread-safe.
class ReplicaStore {
 public:
  // Applies all items or none (they are validated by the caller).
  void Apply(std::vector<ReplicaWrite> items) ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: NOT_FOUND.
  absl::StatusOr<StoredReplica> Get(uint64_t variable_id, int32_t replica) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The replica once it holds at least `min_version` (a step's value is
  // installed right after the step commits), waiting until `deadline`.
  // Errors: NOT_FOUND, UNAVAILABLE (still older at the deadline).
  absl::StatusOr<StoredReplica> WaitFor(uint64_t variable_id, int32_t replica, int64_t min_version,
                                        absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);
  void Drop(uint64_t variable_id) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<StoredReplica> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes of distinct tensors held.
  uint64_t BytesHeld() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  mutable absl::CondVar applied_;  // Apply() ran
  std::map<std::pair<uint64_t, int32_t>, StoredReplica> replicas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_REPLICA_STORE_H_

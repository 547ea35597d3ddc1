// SPDX-License-Identifier: Apache-2.0
// The pure decisions of a cross-replica write (docs/architecture.md, "The
// write path"): which replicas each live worker is sent, and what the
// workers' answers mean for the record. No lock, no I/O: tested directly.
#ifndef REPVAR_SERVER_CORE_REPLICATION_PLAN_H_
#define REPVAR_SERVER_CORE_REPLICATION_PLAN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/model/replica_write.h"
#include "common/tensor/tensor.h"
#include "server/core/cluster_state.h"
#include "server/core/record.h"
#include "server/core/worker_client.h"

namespace repvar::server {

// One variable's new value, as a write decided it: version n+1 of `id`.
struct PlannedWrite {
  uint64_t id = 0;
  std::string name;
  int64_t version = 0;
  std::shared_ptr<const Tensor> value;
};

// What one live worker is sent: every replica it holds of every write.
struct WriteBatch {
  WorkerTarget target;
  std::vector<ReplicaWrite> writes;
};

// The writes grouped by live worker, in task order, each carrying `fence`.
// Variables created together share a placement list, so a batch of many
// writes groups once per list, not per write. Deleted variables and dead
// workers are left out.
std::vector<WriteBatch> GroupByWorker(const ClusterState& state,
                                      const std::vector<PlannedWrite>& writes, uint64_t fence);

// What the workers' answers mean, per worker: which acknowledged their
// batch (they hold the new version of every replica they were sent), which
// did not answer (their contents are unknown), each by the incarnation it
// was sent to, and why. A worker's batch holds every write of the call for
// every replica it has, so a replica's answer is its worker's: nothing here
// grows with the replicas. `prepared`: the fence of the write's
// WritePrepared (0: none).
struct Delivery {
  absl::flat_hash_map<TaskKey, uint64_t> acknowledged;
  absl::flat_hash_map<TaskKey, uint64_t> unanswered;
  std::vector<std::string> failures;
  uint64_t prepared = 0;
};

// Folds `statuses` (one per batch, in order) and the WritePrepared's sync
// (`prepared_durable`) into a Delivery.
Delivery FoldAnswers(const std::vector<WriteBatch>& batches,
                     const std::vector<absl::Status>& statuses,
                     const absl::Status& prepared_durable, uint64_t prepared);

// The replicas of `v` on the workers of `answered` (Delivery::acknowledged
// or ::unanswered) that are still live under the incarnation that
// answered: an acknowledgement from a worker declared dead since is not
// recorded.
std::vector<Holder> LiveHolders(const ClusterState& state, const VariableRecord& v,
                                const absl::flat_hash_map<TaskKey, uint64_t>& answered);
std::vector<Holder> LiveHolders(const ClusterState& state, const VariableRecord& v,
                                const std::vector<Holder>& holders);
// The replicas of `v` that are not live holders by `acknowledged`, in
// order: what a committed write records as Holders::AllBut, whose size
// does not grow with the replicas that took it.
std::vector<int32_t> NotLiveHolders(const ClusterState& state, const VariableRecord& v,
                                    const absl::flat_hash_map<TaskKey, uint64_t>& acknowledged);

// The record that settles `writes` as `delivery` left them (C2, F7): each
// variable's new version with the replicas that hold it when every live
// replica acknowledged (and the request's `outcome`); otherwise the
// replicas that took it (or may have) marked STALE and the variable
// flagged for resync. A WritePrepared is resolved either way.
Record SettleWrites(const ClusterState& state, const std::vector<PlannedWrite>& writes,
                    const Delivery& delivery, const std::map<uint64_t, Initializer>& initializers,
                    const std::optional<RequestRecorded>& outcome);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_REPLICATION_PLAN_H_

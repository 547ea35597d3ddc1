// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_WORKER_CLIENT_H_
#define REPVAR_SERVER_WORKER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/replica_write.h"
#include "server/membership.h"

namespace repvar::server {

// The worker a call is meant for. A worker refuses calls carrying another
// incarnation (fencing).
struct WorkerTarget {
  TaskKey task;
  std::string address;
  uint64_t incarnation = 0;
};

// What the coordinator needs from a worker: the test seam between the core
// and the network. Implementations are thread-safe; calls block until the
// worker answers or the call's deadline passes.
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  // Writes every item, in order, in one exchange. OK means the worker holds
  // all of them (each verified by checksum). Errors: UNAVAILABLE or
  // DEADLINE_EXCEEDED (unreachable), ABORTED (stale incarnation), others as
  // the worker says.
  virtual absl::Status WriteReplicas(const WorkerTarget& target,
                                     std::span<const ReplicaWrite> writes) = 0;
  // One replica's value and version as the worker holds it (committed
  // values only). Errors: NOT_FOUND, UNAVAILABLE, ABORTED.
  struct ReplicaValue {
    int64_t version = 0;
    std::shared_ptr<const Tensor> value;
  };
  virtual absl::StatusOr<ReplicaValue> ReadReplica(const WorkerTarget& target, uint64_t variable_id,
                                                   int32_t replica) = 0;
  // Forgets a deleted variable. Best effort.
  virtual absl::Status DropVariable(const WorkerTarget& target, uint64_t variable_id) = 0;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_WORKER_CLIENT_H_

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_CORE_WORKER_CLIENT_H_
#define REPVAR_SERVER_CORE_WORKER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/sync.h"
#include "common/model/replica_write.h"
#include "common/model/task.h"
#include "common/tensor/tensor.h"

namespace repvar::server {

// The worker a call is meant for. A worker refuses calls carrying another
// incarnation (fencing).
struct WorkerTarget {
  TaskKey task;
  std::string address;
  uint64_t incarnation = 0;
};

// What the coordinator needs from a worker: the test seam between the core
// and the network. Every call is asynchronous: it returns at once and `done`
// runs exactly once, on any thread (possibly before the call returns), when
// the worker answered or the call's deadline passed. A broadcast to N
// workers therefore costs no thread per worker (see CallGroup).
// Implementations are thread-safe.
class WorkerClient {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  struct ReplicaValue {
    int64_t version = 0;
    std::shared_ptr<const Tensor> value;
  };
  using ReadDone = absl::AnyInvocable<void(absl::StatusOr<ReplicaValue>) &&>;
  // A replica as the worker holds it.
  struct HeldReplica {
    uint64_t variable_id = 0;
    int32_t replica = 0;
    int64_t version = 0;
    uint64_t checksum = 0;
  };
  using ListDone = absl::AnyInvocable<void(absl::StatusOr<std::vector<HeldReplica>>) &&>;

  virtual ~WorkerClient() = default;
  // Writes every item, in order, in one exchange. OK means the worker holds
  // all of them (each verified by checksum). Errors: UNAVAILABLE or
  // DEADLINE_EXCEEDED (unreachable), ABORTED (stale incarnation), others as
  // the worker says. The callee copies what it keeps of `writes`.
  virtual void WriteReplicasAsync(const WorkerTarget& target,
                                  const std::vector<ReplicaWrite>& writes, Done done) = 0;
  // One replica's committed value as the worker holds it, once it holds at
  // least `min_version` (a step's value is installed right after the step
  // commits). Errors: NOT_FOUND, UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED.
  virtual void ReadReplicaAsync(const WorkerTarget& target, uint64_t variable_id, int32_t replica,
                                int64_t min_version, ReadDone done) = 0;
  // Forgets a deleted variable.
  virtual void DropVariableAsync(const WorkerTarget& target, uint64_t variable_id, Done done) = 0;
  // Ends every call in flight to `target` at once (its `done` runs with
  // CANCELLED): the worker was declared dead or superseded, so waiting for
  // the call's own deadline would only delay the failure.
  virtual void CancelCalls(const WorkerTarget& target) = 0;
  // Every replica the worker holds, with its version and checksum: what
  // repair compares with the committed state. The worker first refuses
  // every later write fenced below `fence_floor` (ReplicaWrite::fence), so
  // nothing sent before it can land after the list. Errors: UNAVAILABLE,
  // ABORTED (another incarnation), DEADLINE_EXCEEDED.
  virtual void ListReplicasAsync(const WorkerTarget& target, uint64_t fence_floor,
                                 absl::Time deadline, ListDone done) = 0;
};

// Waits for a group of asynchronous calls: hand Callback(i) to call i, then
// Wait() blocks until every call finished and returns their statuses. The
// callbacks share the group's state, so a late one never touches freed
// memory. Thread-safe.
class CallGroup {
 public:
  explicit CallGroup(size_t calls) : state_(std::make_shared<State>(calls)) {}

  WorkerClient::Done Callback(size_t i) {
    return [state = state_, i](absl::Status s) {
      MutexLock lock(&state->mu);
      state->statuses[i] = std::move(s);
      --state->pending;
    };
  }
  std::vector<absl::Status> Wait() {
    MutexLock lock(&state_->mu);
    state_->mu.Await(absl::Condition(
        +[](size_t* pending) { return *pending == 0; }, &state_->pending));
    return state_->statuses;
  }

 private:
  struct State {
    explicit State(size_t calls) : statuses(calls), pending(calls) {}
    Mutex mu;
    std::vector<absl::Status> statuses ABSL_GUARDED_BY(mu);
    size_t pending ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_WORKER_CLIENT_H_

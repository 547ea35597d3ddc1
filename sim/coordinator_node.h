// SPDX-License-Identifier: Apache-2.0
// The coordinator's host in the simulation: a process running the real
// server::Coordinator over the simulated disk, with the daemon's ticker
// and repairer, reaching the workers through SimWorkerClient (the
// simulation's adapter in place of server/rpc/grpc_worker_client).
//
//   DOWN --Start--> RECOVERING --Recover OK--> SERVING --Crash--> DOWN
//                        '--Crash (or a failed sync)--'
//
// A crash leaves the process's threads waiting forever and its objects
// allocated; the disk keeps what it synced. Start builds everything anew
// on a new process, as a restarted daemon does.
#ifndef REPVAR_SIM_COORDINATOR_NODE_H_
#define REPVAR_SIM_COORDINATOR_NODE_H_

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/coordinator.h"
#include "sim/network.h"

namespace repvar::sim {

class World;

class CoordinatorNode {
 public:
  explicit CoordinatorNode(World* world);
  ~CoordinatorNode();
  CoordinatorNode(const CoordinatorNode&) = delete;
  CoordinatorNode& operator=(const CoordinatorNode&) = delete;

  void Start();
  // Kills the process (a crash or SIGKILL); the disk loses what it had not
  // synced.
  void Crash();
  bool up() const;
  ProcessId process() const;

  // The core serving in process `callee` (the one a call was delivered to):
  // UNAVAILABLE while it recovers or once it is gone.
  absl::StatusOr<server::Coordinator*> Serving(ProcessId callee);
  // The serving core, or null.
  server::Coordinator* core();

 private:
  struct Process;
  void Main(Process* p);

  World* const world_;
  std::vector<std::unique_ptr<Process>> processes_;  // every one started; never freed
  Process* current_ = nullptr;
};

// The coordinator's calls to workers over the simulated network: each
// handled by the worker node's process (WorkerNode), answered once.
class SimWorkerClient final : public server::WorkerClient {
 public:
  SimWorkerClient(World* world, ProcessId coordinator) : world_(world), me_(coordinator) {}

  void WriteReplicasAsync(const server::WorkerTarget& target,
                          const std::vector<ReplicaWrite>& writes, Done done) override;
  void ReadReplicaAsync(const server::WorkerTarget& target, uint64_t variable_id, int32_t replica,
                        int64_t min_version, ReadDone done) override;
  void DropVariableAsync(const server::WorkerTarget& target, uint64_t variable_id,
                         Done done) override;
  void CancelCalls(const server::WorkerTarget& target) override;
  void ListReplicasAsync(const server::WorkerTarget& target, uint64_t fence_floor,
                         absl::Time deadline, ListDone done) override;

 private:
  // A call's `done` that runs once, whichever comes first: its answer or
  // CancelCalls of its target.
  template <typename T>
  absl::AnyInvocable<void(absl::StatusOr<T>) &&> Tracked(
      const server::WorkerTarget& target, absl::AnyInvocable<void(absl::StatusOr<T>) &&> done);

  World* const world_;
  const ProcessId me_;
  // Calls in flight by target (task and incarnation): how to cancel each.
  uint64_t next_call_ = 0;
  std::map<std::pair<TaskKey, uint64_t>, std::map<uint64_t, std::function<void()>>> in_flight_;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_COORDINATOR_NODE_H_

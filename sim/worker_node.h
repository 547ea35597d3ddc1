// SPDX-License-Identifier: Apache-2.0
// A worker host in the simulation: a process running the real worker core
// (ReplicaStore, StepTable, StepResolver, the write sessions, WorkerAgent)
// with the simulated data plane, reaching the coordinator through
// SimCoordinatorLink (the simulation's adapter in place of
// worker/rpc/grpc_coordinator_link). Its handlers answer the coordinator's
// calls as worker/rpc/replicas_service does.
//
//   DOWN --Start--> UP (a new incarnation, an empty store; the agent
//   registers) --Crash, or superseded (FENCED)--> DOWN
#ifndef REPVAR_SIM_WORKER_NODE_H_
#define REPVAR_SIM_WORKER_NODE_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/model/replica_write.h"
#include "server/core/worker_client.h"
#include "sim/network.h"
#include "worker/core/replica_store.h"
#include "worker/core/step_table.h"

namespace repvar::sim {

class World;

class WorkerNode {
 public:
  WorkerNode(World* world, NodeId node, std::string job, int32_t task, int devices);
  ~WorkerNode();
  WorkerNode(const WorkerNode&) = delete;
  WorkerNode& operator=(const WorkerNode&) = delete;

  void Start();
  void Crash();
  bool up() const;
  ProcessId process() const;
  uint64_t incarnation() const;
  const TaskKey& task() const { return task_; }
  NodeId node() const { return node_; }
  // The running process's replicas and steps (null when down).
  worker::ReplicaStore* store();
  worker::StepTable* steps();
  // The local read table of the latest process that kept one, as a trainer
  // on the host maps it: still there after that process died (empty: none).
  std::span<const std::byte> local_table() const;

  // ---- The coordinator's calls, handled by process `callee` (the one the
  // network delivered to: a call meant for an earlier incarnation finds a
  // later one, which refuses it).
  void WriteReplicas(ProcessId callee, uint64_t incarnation,
                     const std::vector<ReplicaWrite>& writes,
                     const Network::Answer<uint64_t>& answer);
  void ReadReplica(ProcessId callee, uint64_t variable_id, int32_t replica, int64_t min_version,
                   absl::Time deadline,
                   const Network::Answer<server::WorkerClient::ReplicaValue>& answer);
  void DropVariable(ProcessId callee, uint64_t incarnation, uint64_t variable_id,
                    const Network::Answer<Nothing>& answer);
  struct Listed {
    uint64_t incarnation = 0;
    std::vector<server::WorkerClient::HeldReplica> replicas;
  };
  void ListReplicas(ProcessId callee, uint64_t incarnation, uint64_t fence_floor,
                    const Network::Answer<Listed>& answer);

 private:
  struct Process;
  Process* ByProcess(ProcessId p);
  void RunAgent(Process* p);

  World* const world_;
  const NodeId node_;
  const TaskKey task_;
  const int devices_;
  std::vector<std::unique_ptr<Process>> processes_;  // every one started; never freed
  Process* current_ = nullptr;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_WORKER_NODE_H_

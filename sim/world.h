// SPDX-License-Identifier: Apache-2.0
// One simulated cluster for one seed: a coordinator host, worker hosts and
// client hosts on the simulated network and disk, a workload, a nemesis
// that injects faults, and the invariants checked after every event
// (docs/simulator.md).
//
// A seed runs in phases:
//
//   SETUP     the coordinator and the workers start; a client creates and
//             initializes the variables (no faults yet)
//   STORM     the clients' operations run while the nemesis strikes
//   HEAL      every fault is lifted: dead processes restart, partitions
//             heal, the network and the disk behave
//   CONVERGE  the cluster must settle: every worker live, every replica
//             of every variable up to date, within a bound of simulated
//             time; then the histories are checked
#ifndef REPVAR_SIM_WORLD_H_
#define REPVAR_SIM_WORLD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "common/model/task.h"
#include "server/core/cluster_state.h"
#include "sim/data_plane.h"
#include "sim/disk.h"
#include "sim/history.h"
#include "sim/network.h"
#include "sim/random.h"
#include "sim/scheduler.h"

namespace repvar::sim {

class CoordinatorNode;
class WorkerNode;
class ClientNode;
class TrainerNode;

struct WorldOptions {
  uint64_t seed = 1;
  int workers = 3;
  int devices_per_worker = 2;
  int clients = 2;
  int variables = 3;
  int ops_per_client = 40;
  // Replicated steps the trainers take in the storm, over `step_variables`
  // variables of their own (0 steps: no trainers).
  int steps = 6;
  int step_variables = 4;
  // The nemesis's faults in the storm (0: none).
  int faults = 4;
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  // Simulated time the whole seed may take before it counts as stuck.
  absl::Duration time_limit = absl::Minutes(20);
  // Cross-replica writes of large values over the simulated data plane.
  bool data_plane = true;
  // Workers keep local read tables and clients read from them (C8): 1 on,
  // 0 off, -1 decided by the seed (half the seeds).
  int local_reads = -1;
  // Print every event as it happens (replaying one seed).
  bool verbose = false;
};

// What one seed did.
struct SeedResult {
  uint64_t seed = 0;
  bool ok = true;
  std::string invariant;  // the first broken one
  std::string detail;
  uint64_t digest = 0;  // of the whole history and every scheduling pick
  uint64_t steps = 0;   // scheduling picks
  absl::Duration simulated;
};

class World {
 public:
  explicit World(WorldOptions options);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  SeedResult Run();

  // ---- For the nodes.
  Scheduler& scheduler() { return scheduler_; }
  Network& network() { return network_; }
  Random& random() { return random_; }
  Disk& disk() { return disk_; }
  DataPlaneHub& hub() { return hub_; }
  History& history() { return history_; }
  StepReads& step_reads() { return step_reads_; }
  const WorldOptions& options() const { return options_; }
  // Whether this seed's workers serve local reads (WorldOptions::local_reads).
  bool local_reads() const { return local_reads_; }
  CoordinatorNode& coordinator() { return *coordinator_; }
  static constexpr NodeId kCoordinatorNode = 0;
  // Worker hosts are nodes 1..workers; node of task t is t + 1.
  WorkerNode* WorkerAt(NodeId node);
  NodeId NodeOfTask(const TaskKey& task) const { return task.task + 1; }
  int worker_count() const { return static_cast<int>(workers_.size()); }
  // The coordinator's state as its log has it: every record appended, in
  // commit order, applied here as it is appended.
  const server::ClusterState& mirror() const { return *mirror_; }

  // A broken invariant: the seed fails with the first one (the run goes on
  // to its end so that its history stays whole).
  void Fail(const std::string& invariant, const std::string& detail);
  bool failed() const { return failure_.has_value(); }
  // A line of the history (hashed into the digest; printed when verbose).
  void Log(const std::string& line);
  // A line printed when verbose, outside the digest (so that replaying
  // with --verbose reproduces the digest).
  void Trace(const std::string& line);

 private:
  void StartCluster();
  void CrashCoordinator();
  // The disk's sync failed: the coordinator exits and its supervisor
  // restarts it.
  void OnSyncError();
  void PlanNemesis(ProcessId nemesis);
  // Fault `kind` (of 9) against worker `w` (when it names one), lasting
  // `lasting`: 0-3 crash or pause the coordinator or a worker, 4-6 cut a
  // worker off or make the network lossy or slow, 7 fails a sync, 8 crashes
  // every worker and restarts them together (a registration storm).
  void Strike(ProcessId nemesis, int kind, int w, absl::Duration lasting);
  void StrikeProcess(ProcessId nemesis, int kind, int w, absl::Duration lasting);
  void StrikeNetwork(ProcessId nemesis, int kind, int w, absl::Duration lasting);
  void RegistrationStorm(ProcessId nemesis, absl::Duration lasting);
  void Heal();
  bool Converged();
  // Checks after every scheduling pick (cheap ones) and at the end.
  void CheckAfterEvent();
  void CheckReplicaTruth();
  // What CheckReplicaTruth reads, in brief: while it stays the same, so
  // does the check's answer.
  void ReplicaTruthInputs(std::vector<uint64_t>& inputs);
  void CheckAtEnd();
  void CheckReplicasAtRest();
  // Runs until `done` or `limit` of simulated time; false on the latter.
  bool RunPhase(absl::FunctionRef<bool()> done, absl::Duration limit);
  SeedResult Result();

  const WorldOptions options_;
  Random random_;
  bool local_reads_ = false;
  Scheduler scheduler_;
  Network network_;
  Disk disk_;
  uint64_t mirror_changes_ = 0;           // records applied to mirror_, or a new mirror_
  std::vector<uint64_t> checked_inputs_;  // ReplicaTruthInputs at the last check
  std::vector<uint64_t> inputs_;
  DataPlaneHub hub_;
  History history_;
  StepReads step_reads_;
  std::unique_ptr<server::ClusterState> mirror_;
  std::unique_ptr<CoordinatorNode> coordinator_;
  std::vector<std::unique_ptr<WorkerNode>> workers_;
  std::vector<std::unique_ptr<ClientNode>> clients_;
  std::unique_ptr<TrainerNode> trainers_;
  ProcessId supervisor_ = 0;
  std::optional<std::pair<std::string, std::string>> failure_;
  std::string unconverged_;
  uint64_t log_digest_ = 0;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_WORLD_H_

// SPDX-License-Identifier: Apache-2.0
#include "sim/coordinator_node.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sim/worker_node.h"
#include "sim/world.h"

namespace repvar::sim {

struct CoordinatorNode::Process {
  ProcessId id = -1;
  std::unique_ptr<SimWorkerClient> workers;
  std::unique_ptr<server::Coordinator> core;
  bool serving = false;
};

CoordinatorNode::CoordinatorNode(World* world) : world_(world) {}

// The processes' objects stay: a killed process's threads may still point
// into them (Scheduler leaks those threads).
CoordinatorNode::~CoordinatorNode() {
  for (auto& p : processes_) static_cast<void>(p.release());
}

void CoordinatorNode::Start() {
  auto p = std::make_unique<Process>();
  p->id = world_->network().Start(World::kCoordinatorNode, "coordinator");
  current_ = p.get();
  processes_.push_back(std::move(p));
  Process* raw = current_;
  world_->scheduler().Spawn(raw->id, "main", [this, raw] { Main(raw); });
  world_->Log(absl::StrCat("coordinator started (process ", raw->id, ")"));
}

void CoordinatorNode::Main(Process* p) {
  // As the daemon: the core over the state log, recovered before it serves;
  // then the ticker on this thread and the repairer beside it.
  Scheduler& s = world_->scheduler();
  server::CoordinatorOptions options;
  options.membership.heartbeat_timeout = world_->options().heartbeat_timeout;
  // Without local reads no lease is granted, and none is waited for after
  // a restart.
  if (!world_->local_reads()) options.membership.read_lease = absl::ZeroDuration();
  options.replication.data_plane = world_->options().data_plane;
  options.replication.data_plane_min_bytes = 1;
  options.replication.verify_timeout = absl::Seconds(2);
  options.max_inflight_bytes = uint64_t{1} << 30;
  p->workers = std::make_unique<SimWorkerClient>(world_, p->id);
  p->core =
      std::make_unique<server::Coordinator>(options, s.clock(), p->workers.get(), &world_->disk());
  if (absl::Status r = p->core->Recover(); !r.ok()) {
    world_->Fail("F3 recovery", absl::StrCat("the coordinator could not recover: ", r.ToString()));
    return;
  }
  p->serving = true;
  world_->Log("coordinator serving");
  server::Coordinator* core = p->core.get();
  s.Spawn(p->id, "repairer", [&s, core] {
    while (true) {
      s.clock()->SleepFor(absl::Seconds(2));
      core->ResyncStale();
    }
  });
  const absl::Duration period =
      std::min(world_->options().heartbeat_timeout / 10, absl::Milliseconds(100));
  while (true) {
    core->Tick(s.Now());
    s.clock()->SleepFor(period);
  }
}

void CoordinatorNode::Crash() {
  if (current_ == nullptr) return;
  world_->scheduler().Kill(current_->id);
  world_->Log(absl::StrCat("coordinator crashed (process ", current_->id, ")"));
  current_ = nullptr;
}

bool CoordinatorNode::up() const { return current_ != nullptr; }

ProcessId CoordinatorNode::process() const { return current_ == nullptr ? -1 : current_->id; }

absl::StatusOr<server::Coordinator*> CoordinatorNode::Serving(ProcessId callee) {
  if (current_ == nullptr || current_->id != callee || !current_->serving) {
    return absl::UnavailableError("the coordinator is not serving (starting or gone)");
  }
  return current_->core.get();
}

server::Coordinator* CoordinatorNode::core() {
  return current_ != nullptr && current_->serving ? current_->core.get() : nullptr;
}

// ---- SimWorkerClient

template <typename T>
absl::AnyInvocable<void(absl::StatusOr<T>) &&> SimWorkerClient::Tracked(
    const server::WorkerTarget& target, absl::AnyInvocable<void(absl::StatusOr<T>) &&> done) {
  using Once = std::optional<absl::AnyInvocable<void(absl::StatusOr<T>) &&>>;
  auto once = std::make_shared<Once>(std::move(done));
  const auto key = std::pair{target.task, target.incarnation};
  const uint64_t id = next_call_++;
  in_flight_[key][id] = [this, once] {
    if (!once->has_value()) return;
    auto d = std::move(**once);
    once->reset();
    world_->scheduler().Spawn(me_, "cancelled", [d = std::move(d)]() mutable {
      std::move(d)(absl::CancelledError("call cancelled: the worker was declared dead"));
    });
  };
  return [this, once, key, id](absl::StatusOr<T> result) mutable {
    if (auto it = in_flight_.find(key); it != in_flight_.end()) {
      it->second.erase(id);
      if (it->second.empty()) in_flight_.erase(it);
    }
    if (!once->has_value()) return;
    auto d = std::move(**once);
    once->reset();
    std::move(d)(std::move(result));
  };
}

void SimWorkerClient::WriteReplicasAsync(const server::WorkerTarget& target,
                                         const std::vector<ReplicaWrite>& writes, Done done) {
  const NodeId node = world_->NodeOfTask(target.task);
  World* w = world_;
  world_->network().Call<uint64_t>(
      me_, node, world_->scheduler().Now() + absl::Seconds(30), "WriteReplicas",
      [w, node, target, writes](ProcessId callee, Network::Answer<uint64_t> answer) {
        w->WorkerAt(node)->WriteReplicas(callee, target.incarnation, writes, answer);
      },
      Tracked<uint64_t>(target, [done = std::move(done)](absl::StatusOr<uint64_t> r) mutable {
        std::move(done)(r.status());
      }));
}

void SimWorkerClient::ReadReplicaAsync(const server::WorkerTarget& target, uint64_t variable_id,
                                       int32_t replica, int64_t min_version, ReadDone done) {
  const NodeId node = world_->NodeOfTask(target.task);
  World* w = world_;
  const absl::Time deadline = world_->scheduler().Now() + absl::Seconds(30);
  world_->network().Call<ReplicaValue>(
      me_, node, deadline, "ReadReplica",
      [w, node, variable_id, replica, min_version, deadline](ProcessId callee,
                                                             Network::Answer<ReplicaValue> answer) {
        w->WorkerAt(node)->ReadReplica(callee, variable_id, replica, min_version, deadline, answer);
      },
      Tracked<ReplicaValue>(target, std::move(done)));
}

void SimWorkerClient::DropVariableAsync(const server::WorkerTarget& target, uint64_t variable_id,
                                        Done done) {
  const NodeId node = world_->NodeOfTask(target.task);
  World* w = world_;
  world_->network().Call<Nothing>(
      me_, node, world_->scheduler().Now() + absl::Seconds(30), "DropVariable",
      [w, node, target, variable_id](ProcessId callee, Network::Answer<Nothing> answer) {
        w->WorkerAt(node)->DropVariable(callee, target.incarnation, variable_id, answer);
      },
      Tracked<Nothing>(target, [done = std::move(done)](absl::StatusOr<Nothing> r) mutable {
        std::move(done)(r.status());
      }));
}

void SimWorkerClient::ListReplicasAsync(const server::WorkerTarget& target, uint64_t fence_floor,
                                        absl::Time deadline, ListDone done) {
  const NodeId node = world_->NodeOfTask(target.task);
  World* w = world_;
  using Listed = WorkerNode::Listed;
  world_->network().Call<Listed>(
      me_, node, std::min(deadline, world_->scheduler().Now() + absl::Seconds(30)),
      "GetReplicaStatus",
      [w, node, target, fence_floor](ProcessId callee, Network::Answer<Listed> answer) {
        w->WorkerAt(node)->ListReplicas(callee, target.incarnation, fence_floor, answer);
      },
      Tracked<Listed>(target, [target, done = std::move(done)](absl::StatusOr<Listed> r) mutable {
        if (!r.ok()) return std::move(done)(r.status());
        if (r->incarnation != target.incarnation) {
          return std::move(done)(absl::AbortedError(
              absl::StrCat("incarnation ", r->incarnation, " answered, not ", target.incarnation)));
        }
        std::move(done)(std::move(r->replicas));
      }));
}

void SimWorkerClient::CancelCalls(const server::WorkerTarget& target) {
  auto it = in_flight_.find(std::pair{target.task, target.incarnation});
  if (it == in_flight_.end()) return;
  std::map<uint64_t, std::function<void()>> calls = std::move(it->second);
  in_flight_.erase(it);
  for (auto& [id, cancel] : calls) cancel();
}

}  // namespace repvar::sim

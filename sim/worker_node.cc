// SPDX-License-Identifier: Apache-2.0
#include "sim/worker_node.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/base/thread_pool.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/to_proto.h"
#include "repvar/v1/step.pb.h"
#include "repvar/v1/worker.pb.h"
#include "server/rpc/step_info_cache.h"
#include "sim/coordinator_node.h"
#include "sim/data_plane.h"
#include "sim/world.h"
#include "worker/core/local_reads.h"
#include "worker/core/step_resolver.h"
#include "worker/core/worker_agent.h"
#include "worker/core/write_sessions.h"

namespace repvar::sim {
namespace {

constexpr size_t kMaxInlineBytes = 64 << 10;  // as the coordinator's client sends

// A step message as the wire carries it: through its proto and back, so
// that what the proto leaves out is left out here too.
absl::StatusOr<std::variant<StepPlan, StepResolution>> OverTheWire(const StepPlan& plan) {
  v1::StepPlan proto;
  PlanToProto(plan, &proto);
  return PlanFromProto(proto);
}

// In the short form workers get.
StepResolution OverTheWire(const StepResolution& r, bool whole = false) {
  v1::StepResolution proto;
  StepResolutionToProto(r, &proto, /*short_form=*/!whole);
  return ResolutionFromProto(proto);
}

// What the coordinator's GetStep answers, through its proto and back: the
// header alone when the caller holds the layout (server/rpc's cache).
StepInfo Described(const server::SharedStep& step, uint64_t known_layout) {
  server::StepInfoCache cache;
  v1::StepInfo proto;
  cache.Answer(step, known_layout, /*shared_lists=*/true, &proto);
  auto back = StepInfoFromProto(proto);
  return back.ok() ? *std::move(back) : StepInfo{};
}

// The worker's calls to the coordinator over the simulated network, each
// handled as server/rpc/workers_service handles it.
class SimCoordinatorLink final : public worker::CoordinatorLink, public worker::StepLink {
 public:
  explicit SimCoordinatorLink(World* world) : world_(world) {}

  absl::StatusOr<absl::Duration> Register(const WorkerRegistration& reg) override {
    return Call<absl::Duration>(
        "RegisterWorker", absl::Minutes(5),
        [reg](server::Coordinator* core, Network::Answer<absl::Duration> answer) {
          auto version = core->RegisterWorker(reg);
          if (!version.ok()) return answer(version.status());
          answer(core->registry().membership_options().heartbeat_timeout / 4);
        });
  }
  absl::StatusOr<worker::HeartbeatAnswer> Heartbeat(const TaskKey& task, uint64_t incarnation,
                                                    bool read_lease,
                                                    const std::vector<HeldValue>& held) override {
    return Call<worker::HeartbeatAnswer>(
        "Heartbeat", absl::Seconds(5),
        [task, incarnation, read_lease, held](server::Coordinator* core,
                                              Network::Answer<worker::HeartbeatAnswer> answer) {
          auto grant = core->Heartbeat(task, incarnation, read_lease, held);
          if (!grant.ok()) return answer(grant.status());
          answer(worker::HeartbeatAnswer{grant->read_lease, grant->confirmed});
        });
  }
  absl::StatusOr<StepInfo> GetStep(uint64_t epoch, uint64_t known_layout) override {
    return Call<StepInfo>(
        "GetStep", absl::Seconds(30),
        [epoch, known_layout](server::Coordinator* core, Network::Answer<StepInfo> answer) {
          auto step = core->GetStep(epoch);
          if (!step.ok()) return answer(step.status());
          answer(Described(*step, known_layout));
        });
  }
  absl::StatusOr<std::variant<StepPlan, StepResolution>> ReportStep(
      const WorkerReport& report, absl::Duration timeout) override {
    using Plan = std::variant<StepPlan, StepResolution>;
    return Call<Plan>(
        "ReportStep", timeout, [report](server::Coordinator* core, Network::Answer<Plan> answer) {
          if (absl::Status s = core->ReportStep(report); !s.ok()) return answer(s);
          core->WhenStepPlanned(
              report.epoch, report.detailed,
              [answer, step = report.step, epoch = report.epoch](
                  absl::StatusOr<std::variant<StepPlan, server::StepCoordinator::SharedResolution>>
                      got) {
                if (!got.ok()) return answer(got.status());
                if (auto* plan = std::get_if<StepPlan>(&*got)) return answer(OverTheWire(*plan));
                // As the service: the resolution inside a plan message.
                v1::StepPlan proto;
                proto.set_step(step);
                proto.set_epoch(epoch);
                StepResolutionToProto(*std::get<server::StepCoordinator::SharedResolution>(*got),
                                      proto.mutable_resolution(), /*short_form=*/true);
                answer(PlanFromProto(proto));
              });
        });
  }
  absl::StatusOr<StepResolution> FinishStep(const WorkerFinish& finish,
                                            absl::Duration timeout) override {
    return Call<StepResolution>(
        "FinishStep", timeout,
        [finish](server::Coordinator* core, Network::Answer<StepResolution> answer) {
          if (absl::Status s = core->FinishStep(finish); !s.ok()) return answer(s);
          core->WhenStepResolved(
              finish.epoch, [answer](absl::StatusOr<server::StepCoordinator::SharedResolution> r) {
                if (!r.ok()) return answer(r.status());
                answer(OverTheWire(**r));
              });
        });
  }
  absl::StatusOr<StepResolution> WaitStep(uint64_t epoch, absl::Duration timeout,
                                          bool whole) override {
    // As the real link: a coordinator being restarted is waited for.
    Scheduler& s = world_->scheduler();
    const absl::Time deadline = s.Now() + timeout;
    while (true) {
      auto r = Call<StepResolution>(
          "WaitStep", std::max(deadline - s.Now(), absl::ZeroDuration()) + absl::Seconds(5),
          [epoch, whole](server::Coordinator* core, Network::Answer<StepResolution> answer) {
            core->WhenStepResolved(
                epoch,
                [answer, whole](absl::StatusOr<server::StepCoordinator::SharedResolution> got) {
                  if (!got.ok()) return answer(got.status());
                  answer(OverTheWire(**got, whole));
                });
          });
      if (!absl::IsUnavailable(r.status()) || s.Now() >= deadline) return r;
      s.clock()->SleepFor(absl::Milliseconds(100));
    }
  }

 private:
  // A call to the coordinator, handled by `serve` on a thread of its
  // process (UNAVAILABLE when it does not serve).
  template <typename T>
  absl::StatusOr<T> Call(const char* name, absl::Duration timeout,
                         std::function<void(server::Coordinator*, Network::Answer<T>)> serve) {
    World* w = world_;
    return world_->network().CallAndWait<T>(
        World::kCoordinatorNode, world_->scheduler().Now() + timeout, name,
        [w, serve](ProcessId callee, Network::Answer<T> answer) {
          auto core = w->coordinator().Serving(callee);
          if (!core.ok()) return answer(core.status());
          serve(*core, answer);
        });
  }

  World* const world_;
};

}  // namespace

struct WorkerNode::Process {
  ProcessId id = -1;
  uint64_t incarnation = 0;
  bool ready = false;  // its objects built: it serves
  worker::ReplicaStore store;
  std::unique_ptr<SimCoordinatorLink> link;
  std::unique_ptr<SimCollectives> collectives;
  std::unique_ptr<worker::StepResolver> resolver;
  std::unique_ptr<worker::StepTable> steps;
  std::unique_ptr<worker::WorkerAgent> agent;
  std::unique_ptr<ThreadPool> root_broadcasts;
  std::vector<uint64_t> table;  // the local read table's memory (8-aligned)
  std::unique_ptr<worker::LocalReads> local_reads;
};

namespace {
constexpr size_t kTableSlots = 64;
constexpr size_t kTableArena = 16 << 10;
}  // namespace

WorkerNode::WorkerNode(World* world, NodeId node, std::string job, int32_t task, int devices)
    : world_(world), node_(node), task_{std::move(job), task}, devices_(devices) {}

// The processes' objects stay: a killed process's threads may still point
// into them (Scheduler leaks those threads).
WorkerNode::~WorkerNode() {
  for (auto& p : processes_) static_cast<void>(p.release());
}

void WorkerNode::Start() {
  auto p = std::make_unique<Process>();
  Scheduler& s = world_->scheduler();
  p->id = world_->network().Start(node_, absl::StrCat("worker", task_.task));
  // As NewIncarnation: the start time above 12 random bits.
  p->incarnation =
      (static_cast<uint64_t>(absl::ToUnixMicros(s.Now())) << 12) | world_->random().Uniform(4096);
  current_ = p.get();
  processes_.push_back(std::move(p));
  Process* raw = current_;
  s.Spawn(raw->id, "main", [this, raw] { RunAgent(raw); });
  world_->Log(absl::StrCat("worker ", task_.task, " started (process ", raw->id, ", incarnation ",
                           raw->incarnation, ")"));
}

void WorkerNode::RunAgent(Process* p) {
  // The daemon's objects, built on the process's own thread (their pools
  // start threads of it), then its agent's loop.
  Scheduler& s = world_->scheduler();
  worker::WorkerIdentity identity{task_.job, task_.task, p->incarnation, {}};
  WorkerRegistration reg{
      task_.job, task_.task, absl::StrCat("worker", task_.task, ":1"), p->incarnation, {}};
  for (int d = 0; d < devices_; ++d) {
    identity.accelerators.push_back(absl::StrCat("TPU:", d));
    reg.devices.push_back(
        absl::StrCat("/job:", task_.job, "/replica:0/task:", task_.task, "/device:TPU:", d));
  }
  p->link = std::make_unique<SimCoordinatorLink>(world_);
  p->collectives = std::make_unique<SimCollectives>(&world_->hub(), node_);
  p->resolver = std::make_unique<worker::StepResolver>(identity, &p->store, p->link.get(),
                                                       p->collectives.get());
  p->steps =
      std::make_unique<worker::StepTable>(identity, &p->store, p->link.get(), p->resolver.get());
  p->root_broadcasts = std::make_unique<ThreadPool>(1, 4);  // as ReplicasService's
  if (world_->local_reads()) {
    p->table.assign(LocalReadTableBytes(kTableSlots, kTableArena) / 8, 0);
    p->local_reads = std::make_unique<worker::LocalReads>(
        std::as_writable_bytes(std::span(p->table)), kTableSlots, &p->store,
        [&s] { return absl::ToUnixNanos(s.Now()); });
    p->store.set_listener(p->local_reads.get());
    p->resolver->set_local_reads(p->local_reads.get());
  }
  p->agent = std::make_unique<worker::WorkerAgent>(reg, p->link.get(), p->local_reads.get());
  p->ready = true;
  while (true) {
    const absl::Time next = p->agent->Tick(s.Now());
    if (p->agent->state() == worker::WorkerAgent::State::kFenced) {
      world_->Log(absl::StrCat("worker ", task_.task, " superseded: its process exits"));
      if (current_ == p) current_ = nullptr;
      s.Halt();
    }
    s.clock()->SleepFor(std::max(next - s.Now(), absl::ZeroDuration()));
  }
}

void WorkerNode::Crash() {
  if (current_ == nullptr) return;
  world_->scheduler().Kill(current_->id);
  world_->Log(absl::StrCat("worker ", task_.task, " crashed (process ", current_->id, ")"));
  current_ = nullptr;
}

bool WorkerNode::up() const { return current_ != nullptr; }
ProcessId WorkerNode::process() const { return current_ == nullptr ? -1 : current_->id; }
uint64_t WorkerNode::incarnation() const { return current_ == nullptr ? 0 : current_->incarnation; }
worker::ReplicaStore* WorkerNode::store() {
  return current_ != nullptr && current_->ready ? &current_->store : nullptr;
}
worker::StepTable* WorkerNode::steps() {
  return current_ != nullptr && current_->ready ? current_->steps.get() : nullptr;
}

std::span<const std::byte> WorkerNode::local_table() const {
  for (auto p = processes_.rbegin(); p != processes_.rend(); ++p) {
    if (!(*p)->table.empty()) return std::as_bytes(std::span((*p)->table));
  }
  return {};
}

WorkerNode::Process* WorkerNode::ByProcess(ProcessId id) {
  for (const auto& p : processes_) {
    if (p->id == id) return p->ready ? p.get() : nullptr;
  }
  return nullptr;
}

void WorkerNode::WriteReplicas(ProcessId callee, uint64_t incarnation,
                               const std::vector<ReplicaWrite>& writes,
                               const Network::Answer<uint64_t>& answer) {
  Process* p = ByProcess(callee);
  if (p == nullptr) return answer(absl::UnavailableError("the worker is starting"));
  bool all_small = true;
  for (const ReplicaWrite& w : writes) {
    all_small &= !w.collective && w.value->bytes.size() <= kMaxInlineBytes;
  }
  if (all_small) {
    // WriteSmallReplicas: the values whole in one message.
    v1::WriteSmallReplicasRequest proto;
    SmallWritesToProto(incarnation, writes, &proto);
    absl::StatusOr<SmallReplicaWrites> parsed = SmallWritesFromProto(proto);
    if (!parsed.ok()) return answer(parsed.status());
    return answer(worker::ApplySmallWrites(p->incarnation, *std::move(parsed), &p->store));
  }
  // WriteReplicas: a header per write, its bytes inline unless the data
  // plane brings them.
  worker::ReplicaWriteSession session(p->incarnation, &p->store, p->collectives.get(), nullptr,
                                      p->root_broadcasts.get());
  for (const ReplicaWrite& w : writes) {
    ReplicaWriteHeader h{incarnation, w,
                         TensorHeader{w.value->spec, w.value->bytes.size(), w.value->checksum}};
    h.write.value = nullptr;
    const bool over_data_plane = w.collective && w.collective->rank != w.collective->root;
    std::span<const std::byte> inline_data;
    if (!over_data_plane) inline_data = w.value->bytes.span();
    if (absl::Status s = session.OnHeader(std::move(h), inline_data); !s.ok()) return answer(s);
  }
  answer(session.Finish());
}

void WorkerNode::ReadReplica(ProcessId callee, uint64_t variable_id, int32_t replica,
                             int64_t min_version, absl::Time deadline,
                             const Network::Answer<server::WorkerClient::ReplicaValue>& answer) {
  Process* p = ByProcess(callee);
  if (p == nullptr) return answer(absl::UnavailableError("the worker is starting"));
  // As the service: give up early enough that "not yet" reaches the caller.
  const absl::Time now = world_->scheduler().Now();
  const absl::Duration left = deadline - now;
  const absl::Time until =
      now + std::min(left - std::min(left / 2, absl::Seconds(1)), absl::Seconds(10));
  auto r = p->store.WaitFor(variable_id, replica, min_version, until);
  if (!r.ok()) return answer(r.status());
  answer(server::WorkerClient::ReplicaValue{r->version, r->value});
}

void WorkerNode::DropVariable(ProcessId callee, uint64_t incarnation, uint64_t variable_id,
                              const Network::Answer<Nothing>& answer) {
  Process* p = ByProcess(callee);
  if (p == nullptr) return answer(absl::UnavailableError("the worker is starting"));
  if (incarnation != p->incarnation) {
    return answer(absl::AbortedError("drop meant for another incarnation"));
  }
  p->store.Drop(variable_id);
  answer(Nothing{});
}

void WorkerNode::ListReplicas(ProcessId callee, uint64_t incarnation, uint64_t fence_floor,
                              const Network::Answer<Listed>& answer) {
  Process* p = ByProcess(callee);
  if (p == nullptr) return answer(absl::UnavailableError("the worker is starting"));
  if (fence_floor != 0 && incarnation != p->incarnation) {
    return answer(absl::AbortedError(absl::StrCat("fence meant for incarnation ", incarnation,
                                                  "; this worker is ", p->incarnation)));
  }
  Listed out{p->incarnation, {}};
  for (const worker::StoredReplica& r : p->store.FenceAndList(fence_floor)) {
    out.replicas.push_back({r.variable_id, r.replica, r.version, r.checksum});
  }
  answer(std::move(out));
}

}  // namespace repvar::sim

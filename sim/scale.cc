// SPDX-License-Identifier: Apache-2.0
#include "sim/scale.h"

#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/status_util.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/to_proto.h"
#include "server/core/coordinator.h"
#include "server/rpc/step_info_cache.h"

namespace repvar::sim {
namespace {

constexpr absl::Duration kBarrierTimeout = absl::Minutes(5);
constexpr int kCreateBatch = 1000;

class ManualClock final : public Clock {
 public:
  absl::Time Now() const override { return now_; }
  void SleepFor(absl::Duration d) override { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

// Replicas that acknowledge every call at once and keep nothing: the run
// measures the coordinator, not the workers.
class AckingWorkers final : public server::WorkerClient {
 public:
  void WriteReplicasAsync(const server::WorkerTarget&, const std::vector<ReplicaWrite>&,
                          Done done) override {
    std::move(done)(absl::OkStatus());
  }
  void ReadReplicaAsync(const server::WorkerTarget&, uint64_t, int32_t, int64_t,
                        ReadDone done) override {
    std::move(done)(absl::NotFoundError("the scale run's workers keep no values"));
  }
  void DropVariableAsync(const server::WorkerTarget&, uint64_t, Done done) override {
    std::move(done)(absl::OkStatus());
  }
  void CancelCalls(const server::WorkerTarget&) override {}
  void ListReplicasAsync(const server::WorkerTarget&, uint64_t, absl::Time,
                         ListDone done) override {
    std::move(done)(std::vector<HeldReplica>());
  }
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double ResidentMib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  return 0;
}

double HeapInUseMib() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd) / (1 << 20);
}

// The coordinator's CPU, summed over the sections it is running in.
class CpuMeter {
 public:
  void Start() { started_ = ProcessCpuSeconds(); }
  void Stop() { seconds_ += ProcessCpuSeconds() - started_; }
  double Take() { return std::exchange(seconds_, 0.0); }

 private:
  double started_ = 0;
  double seconds_ = 0;
};

// What one host's worker sends each step, summarized by the workers' code
// once: every step changes every variable and the replicas agree, so only
// the header changes from step to step.
struct HostMessages {
  v1::ReportStepRequest report;
  v1::FinishStepRequest finish;
};

class ScaleRun {
 public:
  explicit ScaleRun(const ScaleOptions& o) : o_(o), rss_before_(ResidentMib()) {
    server::CoordinatorOptions options;
    options.membership.heartbeat_timeout = absl::Hours(1);  // the run's clock barely moves
    core_ = std::make_unique<server::Coordinator>(options, &clock_, &workers_);
  }

  absl::StatusOr<ScaleResult> Run() {
    ScaleResult result;
    REPVAR_RETURN_IF_ERROR(RegisterHosts());
    result.register_cpu_s = meter_.Take();
    REPVAR_RETURN_IF_ERROR(CreateVariables());
    result.create_init_cpu_s = meter_.Take();
    HeartbeatRound();
    result.heartbeat_round_cpu_s = meter_.Take();
    REPVAR_RETURN_IF_ERROR(RunSteps(result));
    hosts_.clear();  // the workers' messages: not the coordinator's
    hosts_.shrink_to_fit();
    result.rss_mib = ResidentMib() - rss_before_;
    result.heap_mib = HeapInUseMib() - heap_before_;
    return result;
  }

 private:
  TaskKey Host(int h) const { return TaskKey{"tpu_worker", h}; }

  absl::Status RegisterHosts();
  absl::Status CreateVariables();
  void HeartbeatRound();
  absl::Status RunSteps(ScaleResult& result);
  absl::Status BeginStep(int64_t step, uint64_t* bytes, server::SharedStep* begun);
  void SummarizeHosts(const StepInfo& info);
  absl::Status Report(const StepInfo& info, uint64_t* bytes);
  absl::Status Finish(const StepInfo& info, uint64_t* bytes);

  const ScaleOptions o_;
  const double rss_before_;
  const double heap_before_ = HeapInUseMib();
  ManualClock clock_;
  AckingWorkers workers_;
  std::unique_ptr<server::Coordinator> core_;
  server::StepInfoCache step_answers_;
  CpuMeter meter_;
  uint64_t layout_known_ = 0;  // the layout the trainers hold
  std::vector<HostMessages> hosts_;
};

absl::Status ScaleRun::RegisterHosts() {
  for (int h = 0; h < o_.hosts; ++h) {
    WorkerRegistration r{"tpu_worker", h, absl::StrCat("host", h, ":1"), 1, {}};
    for (int d = 0; d < o_.accelerators; ++d) {
      r.devices.push_back(absl::StrCat("/job:tpu_worker/replica:0/task:", h, "/device:TPU:", d));
    }
    meter_.Start();
    absl::StatusOr<int64_t> registered = core_->RegisterWorker(r);
    meter_.Stop();
    if (!registered.ok()) return registered.status();
  }
  return absl::OkStatus();
}

absl::Status ScaleRun::CreateVariables() {
  for (int first = 0; first < o_.variables; first += kCreateBatch) {
    std::vector<CreateItem> items;
    std::vector<InitializeItem> inits;
    for (int i = first; i < std::min(o_.variables, first + kCreateBatch); ++i) {
      CreateItem item;
      item.def.name = absl::StrCat("layer", i / 4, "/w", i % 4);
      item.def.tensor = TensorSpec{DType::kFloat32, {o_.elements}};
      item.def.replica_count = o_.hosts * o_.accelerators;
      item.def.aggregation = Aggregation::kMean;
      item.initializer.kind = InitializerKind::kConstant;
      item.initializer.constant = 0.5;
      inits.push_back(InitializeItem{item.def.name, std::nullopt});
      items.push_back(std::move(item));
    }
    meter_.Start();
    absl::Status s = core_->CreateVariables({}, items, VariableDetail::kBasic).status();
    if (s.ok()) s = core_->Initialize({}, inits).status();
    meter_.Stop();
    REPVAR_RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

void ScaleRun::HeartbeatRound() {
  meter_.Start();
  for (int h = 0; h < o_.hosts; ++h) (void)core_->Heartbeat(Host(h), 1);
  clock_.SleepFor(absl::Seconds(1));
  core_->Tick(clock_.Now());
  meter_.Stop();
}

// Every trainer (one per accelerator) begins the step: the first opens
// it, the others join; each gets the step's header once it holds the
// layout.
absl::Status ScaleRun::BeginStep(int64_t step, uint64_t* bytes, server::SharedStep* begun) {
  v1::BeginStepRequest req;
  req.set_step(step);
  req.set_barrier_timeout_ms(absl::ToInt64Milliseconds(kBarrierTimeout));
  req.set_known_layout(layout_known_);
  req.set_shared_lists(true);
  const std::string wire = req.SerializeAsString();
  for (int t = 0; t < o_.hosts * o_.accelerators; ++t) {
    meter_.Start();
    v1::BeginStepRequest parsed;
    parsed.ParseFromString(wire);
    absl::StatusOr<server::SharedStep> got = t == 0 ? core_->BeginStep(step, kBarrierTimeout)
                                                    : *core_->JoinOpenStep(step, kBarrierTimeout);
    v1::StepInfo answer;
    if (got.ok()) {
      step_answers_.Answer(*got, parsed.known_layout(), parsed.shared_lists(), &answer);
    }
    const size_t answer_bytes = answer.ByteSizeLong();
    meter_.Stop();
    if (!got.ok()) return got.status();
    *bytes += wire.size() + answer_bytes;
    if (t == 0) *begun = *got;
  }
  layout_known_ = begun->info->layout_id;
  return absl::OkStatus();
}

// The workers' side, not measured: each host's report and finish from its
// replicas (one per accelerator of each variable), as SummarizeReport and
// SummarizeFinish make them.
void ScaleRun::SummarizeHosts(const StepInfo& info) {
  std::vector<std::vector<uint32_t>> held(info.participants.size());
  for (uint32_t i = 0; i < info.variables.size(); ++i) {
    for (int32_t p : info.variables[i].replica_participant) {
      if (p < 0) continue;
      std::vector<uint32_t>& h = held[static_cast<size_t>(p)];
      if (h.empty() || h.back() != i) h.push_back(i);
    }
  }
  hosts_.assign(info.participants.size(), HostMessages{});
  for (size_t p = 0; p < held.size(); ++p) {
    std::vector<ReplicaReport> changed;
    std::vector<PreparedVariable> values;
    for (uint32_t i : held[p]) {
      const StepVariable& v = info.variables[i];
      changed.push_back(ReplicaReport{v.id, 0, v.id * 0x9e3779b97f4a7c15, -1});
      values.push_back(PreparedVariable{v.id, v.id ^ 0x5bd1e995, -1, -1});
    }
    WorkerReport report =
        SummarizeReport(info.variables, static_cast<int32_t>(p), std::move(changed), false);
    WorkerFinish finish =
        SummarizeFinish(info.variables, static_cast<int32_t>(p), std::move(values));
    report.task = finish.task = info.participants[p].task;
    report.incarnation = finish.incarnation = info.participants[p].incarnation;
    ReportToProto(report, &hosts_[p].report);
    FinishToProto(finish, &hosts_[p].finish);
  }
}

// Each host's worker reports; each gets the plan when the last report is in.
absl::Status ScaleRun::Report(const StepInfo& info, uint64_t* bytes) {
  for (HostMessages& host : hosts_) {
    host.report.set_step(info.step);
    host.report.set_epoch(info.epoch);
    const std::string wire = host.report.SerializeAsString();
    *bytes += wire.size();
    meter_.Start();
    v1::ReportStepRequest req;
    req.ParseFromString(wire);
    absl::StatusOr<WorkerReport> report = ReportFromProto(req);
    absl::Status s = report.ok() ? core_->ReportStep(*report) : report.status();
    if (s.ok()) {
      core_->WhenStepPlanned(info.epoch, false, [bytes](auto got) {
        if (!got.ok() || !std::holds_alternative<StepPlan>(*got)) return;
        v1::StepPlan plan;
        PlanToProto(std::get<StepPlan>(*got), &plan);
        *bytes += plan.SerializeAsString().size();
      });
    }
    meter_.Stop();
    REPVAR_RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

// Each host's worker finishes; each gets the short resolution when the last
// finish is in. The step must commit.
absl::Status ScaleRun::Finish(const StepInfo& info, uint64_t* bytes) {
  absl::Status outcome = absl::InternalError("no resolution");
  for (HostMessages& host : hosts_) {
    host.finish.set_step(info.step);
    host.finish.set_epoch(info.epoch);
    const std::string wire = host.finish.SerializeAsString();
    *bytes += wire.size();
    meter_.Start();
    v1::FinishStepRequest req;
    req.ParseFromString(wire);
    absl::StatusOr<WorkerFinish> finish = FinishFromProto(req);
    absl::Status s = finish.ok() ? core_->FinishStep(*finish) : finish.status();
    if (s.ok()) {
      core_->WhenStepResolved(info.epoch, [bytes, &outcome](auto got) {
        if (!got.ok()) {
          outcome = got.status();
          return;
        }
        outcome = (*got)->state == StepState::kCommitted ? absl::OkStatus() : (*got)->status;
        v1::StepResolution resolution;
        StepResolutionToProto(**got, &resolution, /*short_form=*/true);
        *bytes += resolution.SerializeAsString().size();
      });
    }
    meter_.Stop();
    REPVAR_RETURN_IF_ERROR(s);
  }
  return outcome;
}

// One step that warms up (the trainers learn the layout), then the measured
// ones.
absl::Status ScaleRun::RunSteps(ScaleResult& result) {
  std::vector<double> cpu_ms;
  uint64_t bytes = 0;
  for (int64_t step = 1; step <= o_.steps + 1; ++step) {
    uint64_t step_bytes = 0;
    server::SharedStep begun;
    REPVAR_RETURN_IF_ERROR(BeginStep(step, &step_bytes, &begun));
    if (step == 1) SummarizeHosts(*begun.info);
    REPVAR_RETURN_IF_ERROR(Report(*begun.info, &step_bytes));
    REPVAR_RETURN_IF_ERROR(Finish(*begun.info, &step_bytes));
    const double seconds = meter_.Take();
    if (step == 1) continue;
    cpu_ms.push_back(seconds * 1e3);
    bytes += step_bytes;
  }
  std::sort(cpu_ms.begin(), cpu_ms.end());
  result.step_cpu_ms = cpu_ms[cpu_ms.size() / 2];
  result.bytes_per_host_step = static_cast<double>(bytes) / o_.steps / o_.hosts;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScaleResult> RunScale(const ScaleOptions& options) {
  if (options.hosts < 1 || options.accelerators < 1 || options.variables < 1 || options.steps < 1 ||
      options.elements < 1) {
    return absl::InvalidArgumentError("hosts, accelerators, variables, elements, steps: >= 1");
  }
  return ScaleRun(options).Run();
}

}  // namespace repvar::sim

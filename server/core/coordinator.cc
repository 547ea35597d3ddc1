// SPDX-License-Identifier: Apache-2.0
#include "server/core/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/seeded_bug.h"
#include "common/base/status_util.h"
#include "spdlog/spdlog.h"

namespace repvar::server {

void Coordinator::SetDraining(bool draining) {
  if (draining_.exchange(draining) == draining) return;
  spdlog::info(draining ? "draining: new changes are refused until resumed"
                        : "resumed: changes are served again");
}

namespace {

RegistryOptions RegistryOptionsOf(const CoordinatorOptions& o) {
  RegistryOptions r;
  r.membership = o.membership;
  r.max_variable_bytes = o.max_variable_bytes;
  r.state.outcome_capacity = o.idempotency_capacity;
  r.state.outcome_window = o.idempotency_window;
  return r;
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, Clock* clock, WorkerClient* workers,
                         StateLog* log)
    : clock_(clock),
      workers_(workers),
      budget_(options.max_inflight_bytes),
      owned_log_(log == nullptr ? std::make_unique<VolatileStateLog>() : nullptr),
      log_(log != nullptr ? log : owned_log_.get()),
      registry_(RegistryOptionsOf(options), clock, log_),
      groups_(static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMicros(clock->Now())))),
      steps_(clock, &registry_, &groups_),
      replication_(options.replication, clock, &registry_, log_, &steps_, &groups_, workers,
                   &budget_) {}

absl::Status Coordinator::Recover() {
  REPVAR_RETURN_IF_ERROR(registry_.Recover());
  steps_.Recovered();
  // What the workers hold may not be what was recorded: a write in flight
  // when we stopped may have reached some of them.
  if (!BugSeeded(SeededBug::kNotVerifiedAtRecovery)) replication_.VerifyAll();
  // A join the earlier run did not finish is finished now: resynced, then
  // listed (F2).
  for (const LiveTask& t : registry_.Joining()) {
    replication_.Rejoin(t.key);
    REPVAR_RETURN_IF_ERROR(registry_.Joined(t.key, t.incarnation));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Coordinator::RegisterWorker(const WorkerRegistration& reg) {
  std::optional<LiveTask> superseded;
  REPVAR_RETURN_IF_ERROR(registry_.Register(reg, &superseded, /*joining=*/true).status());
  if (superseded) {
    // The old process is gone for us: its calls end now, its step fails.
    workers_->CancelCalls({superseded->key, superseded->address, superseded->incarnation});
    steps_.Tick(clock_->Now(), {*superseded});
  }
  // Listed only once what it holds was verified and resynced (F2).
  const TaskKey key{reg.job, reg.task};
  replication_.Rejoin(key);
  REPVAR_RETURN_IF_ERROR(registry_.Joined(key, reg.incarnation));
  return registry_.Snapshot().version;
}

absl::StatusOr<HeartbeatGrant> Coordinator::Heartbeat(const TaskKey& key, uint64_t incarnation,
                                                      bool read_lease,
                                                      const std::vector<HeldValue>& held) {
  return registry_.Heartbeat(key, incarnation, read_lease, held);
}

void Coordinator::Tick(absl::Time now) {
  std::vector<LiveTask> dead = registry_.CheckHeartbeats(now);
  // F1: what was waiting on a dead worker fails now, not at its deadline.
  for (const LiveTask& t : dead) workers_->CancelCalls({t.key, t.address, t.incarnation});
  steps_.Tick(now, dead);
}

absl::StatusOr<WriteResult> Coordinator::Assign(const RequestKey& key, const Assignment& item) {
  REPVAR_RETURN_IF_ERROR(RefuseIfDraining());
  REPVAR_ASSIGN_OR_RETURN(std::vector<WriteResult> r, replication_.Assign(key, {item}));
  return r.front();
}

absl::StatusOr<Coordinator::Cut> Coordinator::TakeCut(absl::Time deadline) {
  REPVAR_ASSIGN_OR_RETURN(WriteHold hold, HoldWrites(deadline));
  Cut cut{std::move(hold), 0, {}, {}};
  cut.last_committed_step = LastCommittedStep();
  for (VariableView& v : ListVariables("")) {
    if (v.initialized) {
      cut.variables.push_back(std::move(v));
    } else {
      cut.uninitialized.push_back(v.def.name);
    }
  }
  return cut;
}

absl::StatusOr<ReadResult> Coordinator::ReadInCut(const VariableView& v) {
  auto read = replication_.Read(v.def.name);
  if (!read.ok()) {
    return absl::Status(read.status().code(),
                        absl::StrCat("checkpoint: ", read.status().message()));
  }
  if (read->version != v.version || read->value->checksum != v.checksum) {
    return absl::InternalError(absl::StrCat("checkpoint: variable ", v.def.name,
                                            " changed under the hold (version ", v.version, " -> ",
                                            read->version, ")"));
  }
  return read;
}

}  // namespace repvar::server

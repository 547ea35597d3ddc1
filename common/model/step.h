// SPDX-License-Identifier: Apache-2.0
// Replicated steps (docs/contract.md S1-S5) as the coordinator, the workers and the
// trainers all see them: a step's layout, the workers' reports, the plan of
// collectives the barrier decides, the workers' results and the resolution.
// The state machine that moves a step along is server/core/step_barrier.h.
#ifndef REPVAR_COMMON_MODEL_STEP_H_
#define REPVAR_COMMON_MODEL_STEP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/shared_vector.h"
#include "common/model/index_ranges.h"
#include "common/model/task.h"
#include "common/tensor/tensor.h"
#include "repvar/types.h"

namespace repvar {

struct StepParticipant {
  TaskKey task;
  // The coordinator's; a worker's copy of a step holds only the digest
  // (IncarnationDigest), which is what travels.
  uint64_t incarnation = 0;
  std::string address;
  uint64_t incarnation_digest = 0;
};

struct StepVariable {
  uint64_t id = 0;
  std::string name;
  Aggregation aggregation = Aggregation::kNone;
  TensorSpec spec;
  // Per replica: index into StepInfo::participants, or -1 when its worker is
  // not live or its replica is not up to date (it sits the step out).
  SharedVector<int32_t> replica_participant;
  bool allow_nonfinite = false;
};

// A step variable's committed version and checksum when the step began.
struct VariableBegin {
  int64_t version = 0;
  uint64_t checksum = 0;
};

struct StepInfo {
  int64_t step = 0;
  uint64_t epoch = 0;
  StepState state = StepState::kOpen;
  absl::Duration barrier_timeout;
  absl::Time begun;
  std::vector<StepParticipant> participants;  // sorted by task: the rank order
  // By id. Shared by the steps begun at one layout (copy on write).
  SharedVector<StepVariable> variables;
  // The coordinator's alone (never sent): one per variable, in the same
  // order. Shared by the steps begun while no value changed.
  SharedVector<VariableBegin> begin;
  // Names participants + variables without the begin versions (see
  // repvar.v1.StepInfo): equal ids, equal layouts.
  uint64_t layout_id = 0;
  // Set when the sender left participants and variables out because the
  // receiver said it holds layout `layout_id` already.
  bool layout_omitted = false;
  // Live tasks holding a replica of a step variable that take no part in the
  // step (not up to date: being resynced). Not part of the layout.
  std::vector<TaskKey> sitting_out;
};

// The layout id of `info` (participants and variables, begin versions and
// checksums left out).
uint64_t LayoutId(const StepInfo& info);

// A step's digests (docs/architecture.md, "A step"): the wrapping sum of
// DigestTerm(id, checksum) over a set of variables.
uint64_t DigestTerm(uint64_t variable_id, uint64_t checksum);
// The participant that reports the checksum of `var`, the variable at
// `index` in its step's layout: the holder of replica `index mod replicas`
// when it takes part, else of the first replica that does; -1 when none
// does. Spreads the variables evenly over the holders.
int32_t ReporterOf(const StepVariable& var, uint32_t index);

struct VariableChecksum {
  uint64_t variable_id = 0;
  uint64_t checksum = 0;
  friend bool operator==(const VariableChecksum&, const VariableChecksum&) = default;
};

// A trainer's in-step write of one local replica, as its header announces
// it. A trainer's calls name the step as BeginStep described it; a worker
// holding layout `layout_id` already needs not ask the coordinator.
struct StepWriteHeader {
  int64_t step = 0;
  uint64_t epoch = 0;
  uint64_t variable_id = 0;
  int32_t replica = 0;
  TensorHeader tensor;
  uint64_t layout_id = 0;
  absl::Duration barrier_timeout;
};

struct ReplicaReport {
  uint64_t variable_id = 0;
  int32_t replica = 0;
  uint64_t checksum = 0;
  int64_t first_nonfinite = -1;
  friend bool operator==(const ReplicaReport&, const ReplicaReport&) = default;
};

// A worker's one report for a step, a summary of its replicas whose value
// changed (docs/architecture.md, "A step").
struct WorkerReport {
  int64_t step = 0;
  uint64_t epoch = 0;
  TaskKey task;
  uint64_t incarnation = 0;
  // Layout indices of the variables changed uniformly here: SUM/MEAN, any
  // local replica changed; NONE/ONLY_FIRST_REPLICA, every local replica
  // taking part changed, to one finite value (or allowed non-finite).
  IndexRanges changed;
  // Sum of DigestTerm over the NONE/ONLY_FIRST_REPLICA variables in
  // `changed`, with the value their local replicas hold.
  uint64_t digest = 0;
  // The checksums of the NONE/ONLY_FIRST_REPLICA variables in `changed`
  // this worker is the reporter of (ReporterOf), by id.
  std::vector<VariableChecksum> shard;
  // The other changed NONE/ONLY_FIRST_REPLICA replicas, one by one; with
  // `detailed` (the barrier asked), every changed one.
  std::vector<ReplicaReport> replicas;
  bool detailed = false;
};

// A worker's report from its changed replicas, each a replica this worker (participant `me`) holds
// in the step of layout `variables`: the summary docs/architecture.md ("A step") describes;
// `detailed` lists every NONE/ONLY_FIRST_REPLICA replica too. The header fields (step, epoch, task,
// incarnation) are left to the caller.
WorkerReport SummarizeReport(const SharedVector<StepVariable>& variables, int32_t me,
                             std::vector<ReplicaReport> changed, bool detailed);

struct StepCollective {
  enum class Kind { kAllreduce = 1, kBroadcast = 2 };
  Kind kind = Kind::kAllreduce;
  uint32_t tag = 0;
  IndexRanges variables;  // layout indices; a broadcast's one variable
  int32_t root = 0;       // broadcast: the rank holding the winning value
  int32_t source_replica = 0;
  uint64_t checksum = 0;
  std::vector<int32_t> targets;  // broadcast: replicas to overwrite
};

// What every participant runs after the barrier. Ranks are the step's
// participants in StepInfo order: a worker's rank is its index there.
struct StepPlan {
  int64_t step = 0;
  uint64_t epoch = 0;
  std::string group;
  absl::Duration timeout;
  std::vector<StepCollective> collectives;
  // Layout indices of the variables the step changes or repairs.
  IndexRanges changed;
  // Not a plan: the barrier asks every worker for its report again, with
  // every changed replica listed (a digest did not hold).
  bool send_detail = false;
};

struct PreparedVariable {
  uint64_t variable_id = 0;
  uint64_t checksum = 0;
  int64_t first_nonfinite = -1;
  int32_t nonfinite_replica = -1;  // a local replica whose own value was non-finite
};

// A worker's values after the plan, summarized as its report is.
struct WorkerFinish {
  int64_t step = 0;
  uint64_t epoch = 0;
  TaskKey task;
  uint64_t incarnation = 0;
  IndexRanges held;                     // the plan's changed variables this worker holds
  uint64_t digest = 0;                  // sum of DigestTerm over `held`, with the values here
  std::vector<VariableChecksum> shard;  // those of `held` it is the reporter of
  // Those of `held` whose value is non-finite where the variable refuses it.
  std::vector<PreparedVariable> nonfinite;
  std::string error;  // non-empty: the worker could not run the plan
};

// A worker's finish from the values of the plan's changed variables it
// holds (checksum, and the non-finite element where there is one).
// Header fields and `error` are left to the caller.
WorkerFinish SummarizeFinish(const SharedVector<StepVariable>& variables, int32_t me,
                             std::vector<PreparedVariable> values);

struct Divergence {
  uint64_t variable_id = 0;
  std::string name;
  std::vector<uint64_t> replica_checksums;  // per replica (begin value if unreported)
  uint64_t chosen_checksum = 0;
  std::vector<int32_t> repaired;
};

struct CommittedVariable {
  uint64_t variable_id = 0;
  std::string name;
  int64_t version = 0;
  uint64_t checksum = 0;
};

// A step's outcome. Workers get the short form (`short_form`): the changed
// variables as layout ranges with their digest, without the per-variable
// list and the latencies, which grow with the variables and the workers.
struct StepResolution {
  int64_t step = 0;
  uint64_t epoch = 0;
  StepState state = StepState::kFailed;
  absl::Status status;
  std::vector<std::pair<TaskKey, absl::Duration>> latencies;  // report time from begin
  std::vector<Divergence> divergences;
  std::vector<CommittedVariable> changed;
  // The variables that moved to version + 1, as layout indices of layout
  // `layout_id`, and the sum of DigestTerm over them with their committed
  // checksums.
  IndexRanges changed_ranges;
  uint64_t changed_digest = 0;
  uint64_t layout_id = 0;
  bool short_form = false;
};

// The durable-ready record of one committed step: which variables now hold
// which (version, checksum). Every replica of a variable holds it but those
// that sat the step out and those whose participant is no longer live under
// the incarnation that took part. One per step (docs/architecture.md: one
// fsync).
struct StepRecord {
  struct Variable {
    uint64_t id = 0;
    int64_t version = 0;
    uint64_t checksum = 0;
    bool changed = false;              // false: only repaired, version kept
    uint32_t index = 0;                // in the layout
    std::vector<int32_t> sitting_out;  // replicas on no participant, sorted
  };
  int64_t step = 0;
  uint64_t epoch = 0;
  std::shared_ptr<const StepInfo> layout;  // participants and replica_participant
  std::vector<Variable> variables;
};

struct StepEvent {
  enum class Kind { kBegun = 1, kReported = 2, kStragglers = 3, kAggregating = 4, kResolved = 5 };
  int64_t seq = 0;
  Kind kind = Kind::kBegun;
  int64_t step = 0;
  uint64_t epoch = 0;
  TaskKey task;                                      // kReported
  std::vector<std::string> missing;                  // kStragglers
  std::shared_ptr<const StepResolution> resolution;  // kResolved: shared, never copied
  absl::Time at;
};

struct ParticipantProgress {
  TaskKey task;
  bool reported = false;
  bool finished = false;
  absl::Duration report_latency;
  std::string last_activity;
};

// The open step's progress and the last resolutions (repvarctl steps).
struct StepsStatus {
  std::optional<StepInfo> open;
  std::vector<ParticipantProgress> progress;
  std::vector<StepResolution> recent;  // newest last
  int64_t last_committed_step = 0;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_STEP_H_

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_CORE_PLAN_RUNNER_H_
#define REPVAR_WORKER_CORE_PLAN_RUNNER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/step.h"
#include "worker/core/data_plane.h"
#include "worker/core/replica_store.h"
#include "worker/core/step_table.h"

namespace repvar::worker {

// What a plan's collectives leave this worker with.
struct PlanOutput {
  // Variable id -> the value every local participating replica ends with,
  // for the variables the collectives decided.
  std::map<uint64_t, std::shared_ptr<const Tensor>> values;
  // SUM/MEAN: the first non-finite element of each reduced value (-1: none),
  // found in the pass that applied the reduction.
  std::map<uint64_t, int64_t> reduced_nonfinite;
};

// Runs a step plan's collectives in order (docs/contract.md S4), with this
// worker's rank = its participant index:
//   ALLREDUCE  one fused buffer for the listed SUM/MEAN variables: each
//              local replica adds (local - begin) in replica order, the
//              workers sum the buffers in a fixed ring order, and every
//              worker applies the sum to the same begin value with the same
//              code, so every replica ends bit-identical. Variables of one
//              dtype that every participant holds go through
//              Collectives::ReduceApply instead, which may fold those
//              passes into the ring (each sum then applied once, by one
//              member, and the applied bytes shared): the same bits;
//   BROADCAST  the root sends the winning replica's value (NONE repair,
//              ONLY_FIRST_REPLICA); every member checks its checksum.
// The begin value of a participating replica is its committed value here
// (only up-to-date replicas take part). Stateless; thread-compatible.
class PlanRunner {
 public:
  // A value this runner makes of at least this size (a reduced or a
  // received one) is written into shared memory, so that a trainer on this
  // host maps it after the step without a copy (StepTable::Map lends a
  // shared buffer as it is and copies any other; the trainers' libraries
  // map values of 1 MiB and more).
  static constexpr size_t kSharedValueBytes = 1 << 20;
  static bool Shared(const TensorSpec& spec) {
    const absl::StatusOr<int64_t> bytes = spec.ByteSize();
    return bytes.ok() && static_cast<size_t>(*bytes) >= kSharedValueBytes;
  }

  PlanRunner(ReplicaStore* store, Collectives* collectives)
      : store_(store), collectives_(collectives) {}

  // Errors: INVALID_ARGUMENT (a malformed plan), UNAVAILABLE (a collective
  // failed), DATA_LOSS (a broadcast arrived with a bad checksum),
  // OUT_OF_RANGE (an integer sum overflowed), RESOURCE_EXHAUSTED.
  absl::StatusOr<PlanOutput> Run(const LocalStep& step, const StepPlan& plan) const;

 private:
  absl::Status RunAllreduce(const LocalStep& s, const CollectiveSpec& spec, const StepCollective& c,
                            PlanOutput& out) const;
  // A variable's begin value here (null: no local replica) and its local
  // replicas' step-local values in replica order. Errors: as BeginValue,
  // FAILED_PRECONDITION (a local value of another spec).
  struct LocalValues {
    std::shared_ptr<const Tensor> begin;
    std::vector<std::shared_ptr<const Tensor>> written;
  };
  absl::StatusOr<LocalValues> LocalValuesOf(const LocalStep& s, const StepVariable& var) const;
  // An ALLREDUCE of variables of one dtype that every participant holds.
  absl::Status RunFolded(const LocalStep& s, const CollectiveSpec& spec,
                         const std::vector<const StepVariable*>& vars, PlanOutput& out) const;
  absl::Status RunBroadcast(const LocalStep& s, const CollectiveSpec& spec, const StepCollective& c,
                            PlanOutput& out) const;
  absl::StatusOr<std::shared_ptr<const Tensor>> BeginValue(uint64_t id, int32_t replica) const;

  ReplicaStore* const store_;
  Collectives* const collectives_;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_PLAN_RUNNER_H_

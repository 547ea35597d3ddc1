// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_CORE_STEP_RESOLVER_H_
#define REPVAR_WORKER_CORE_STEP_RESOLVER_H_

#include "common/base/thread_pool.h"
#include "common/model/step.h"
#include "worker/core/coordinator_link.h"
#include "worker/core/local_reads.h"
#include "worker/core/plan_runner.h"
#include "worker/core/replica_store.h"
#include "worker/core/step_table.h"

namespace repvar::worker {

// Takes a step every local device committed to its resolution
// (docs/contract.md S3-S4):
//
//   report   one per step: a summary of the local replicas whose value
//            changed (their layout ranges, a digest, the checksums this
//            worker reports, the exceptions replica by replica); again in
//            detail when the barrier asks
//   barrier  the coordinator answers with the plan, or with the resolution
//            when there is nothing to run
//   plan     PlanRunner runs the collectives; the worker finishes with the
//            value each changed variable ends with here
//   install  a COMMITTED resolution installs the new values with their
//            versions; a FAILED one leaves the replicas exactly as committed
//
// When the coordinator refuses or a call is lost, the resolver asks for the
// resolution (WaitStep) rather than guessing. Stateless between steps;
// thread-compatible (the step table runs one step at a time).
//
// ResolveAsync leaves no thread waiting for the barrier: the report goes
// out and the call returns. An answer that is the resolution (the report
// path: nothing to run) is installed on the thread that receives it; a
// plan, or a refusal to ask about, goes on on the resolver's own threads,
// which may wait on the network.
class StepResolver final : public Resolver {
 public:
  StepResolver(WorkerIdentity me, ReplicaStore* store, StepLink* link, Collectives* collectives)
      : me_(std::move(me)), store_(store), link_(link), runner_(store, collectives) {}

  StepResolution Resolve(const LocalStep& step) override;
  void ResolveAsync(const LocalStep& step, Done done) override;
  // Set once, before any step: nothing is read locally from before the
  // report until the resolution installs the step's values.
  void set_local_reads(LocalReads* local_reads) { local_reads_ = local_reads; }

 private:
  // Resolve, with the step's local reads suspended.
  StepResolution ResolveSuspended(const LocalStep& s);
  // What follows the report: install the resolution, or run the plan and
  // finish, or ask how the step ended after a refusal.
  // `detailed`: the answer is to a detailed report (StepPlan::send_detail).
  StepResolution AfterReport(const LocalStep& s, StepLink::ReportAnswer answer,
                             bool detailed = false);
  // Asks the coordinator how the step ended; installs a commit.
  StepResolution Ask(const LocalStep& s, const absl::Status& why, const StepPlan& plan,
                     const PlanOutput& prepared);
  // The summary (docs/architecture.md, "A step"); `detailed`: every changed
  // NONE/ONLY_FIRST_REPLICA replica listed too.
  WorkerReport BuildReport(const LocalStep& s, bool detailed) const;
  WorkerFinish BuildFinish(const LocalStep& s, const StepPlan& plan, PlanOutput& prepared) const;
  // What every local participating replica of `var` ends with.
  absl::StatusOr<std::shared_ptr<const Tensor>> FinalValue(const LocalStep& s,
                                                           const StepVariable& var,
                                                           const PlanOutput& prepared) const;
  // Variable id -> the (version, checksum) its local replicas get.
  using Targets = std::map<uint64_t, std::pair<int64_t, uint64_t>>;
  // A short-form resolution's targets and the list its trainers get
  // (`holds_all`: whether this host holds every changed variable); false
  // (logged) when they do not add up to its digest or layout.
  bool ShortFormTargets(const LocalStep& s, const StepResolution& res, const PlanOutput& prepared,
                        Targets& target, std::vector<CommittedVariable>& changed_here,
                        bool& holds_all) const;
  // Installs a committed step; a short-form resolution gets the list of
  // the changed variables this worker holds (for its trainers).
  void Install(const LocalStep& s, const StepPlan& plan, StepResolution& res,
               const PlanOutput& prepared) const;

  // Suspends local reads (the whole table); `done` ends the suspension.
  Done SuspendLocalReads(const LocalStep& s, Done done);
  // After Install: the values the resolution committed here (`committed`)
  // readable, the rest as they were; local reads served again.
  void ResumeLocalReads(const LocalStep& s, const StepPlan& plan, const Targets& committed) const;

  const WorkerIdentity me_;
  LocalReads* local_reads_ = nullptr;
  ReplicaStore* const store_;
  StepLink* const link_;
  const PlanRunner runner_;
  // Where plans run and refusals are asked about (ResolveAsync). It grows:
  // a step whose plan waits out a dead peer does not hold up the next.
  ThreadPool blocking_{1, 8};
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_STEP_RESOLVER_H_

// SPDX-License-Identifier: Apache-2.0
// A worker's side of replicated steps (DESIGN.md S2-S4): the step-local
// copies trainers write, the one report per step, the plan's collectives and
// the install of committed values. No gRPC here: the coordinator is reached
// through StepLink and other workers through Collectives (the test seams).
// Step descriptions, plans and resolutions are the API's messages, used as
// plain data.
//
// Per step (by epoch), on this worker:
//
//   (unknown) --first trainer call--> OPEN: set up from the layout the call
//          names when this worker holds it (Hint), else from GetStep
//   OPEN: trainers read (their own writes, else the committed value) and
//         write step-local copies, through the socket or in place through
//         leased shared buffers (Map/Unmap); committed replicas stay untouched
//   OPEN --every local accelerator committed (one trainer per host, or one
//          per device)--> RESOLVING: the committing thread sends the report,
//          waits for the barrier, runs the plan's collectives, finishes
//   RESOLVING --resolution--> DONE: COMMITTED installs the new values with
//          their versions; FAILED drops the copies (replicas stay exactly as
//          committed). Every trainer's Commit returns the same resolution.
//   OPEN --Discard, or a newer epoch appears--> DONE (ABORTED locally)
//
// Thread-safe: trainers call from gRPC threads.
#ifndef REPVAR_WORKER_LOCAL_STEPS_H_
#define REPVAR_WORKER_LOCAL_STEPS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "repvar/v1/coordinator.pb.h"
#include "worker/data_plane.h"
#include "worker/replica_store.h"

namespace repvar::worker {

// What the worker's steps need from the coordinator. Calls block.
class StepLink {
 public:
  virtual ~StepLink() = default;
  // Errors: NOT_FOUND (unknown epoch), UNAVAILABLE.
  // `known_layout`: the layout this worker holds (0: none); the answer then
  // omits it when unchanged (see repvar.v1.StepInfo).
  virtual absl::StatusOr<v1::StepInfo> GetStep(uint64_t epoch, uint64_t known_layout) = 0;
  // Sends the report; answers when the barrier resolves.
  virtual absl::StatusOr<v1::StepPlan> ReportStep(const v1::ReportStepRequest& req,
                                                  absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::StepResolution> FinishStep(const v1::FinishStepRequest& req,
                                                        absl::Duration timeout) = 0;
  // DEADLINE_EXCEEDED when not resolved within `timeout`.
  virtual absl::StatusOr<v1::StepResolution> WaitStep(uint64_t epoch, absl::Duration timeout) = 0;
};

struct WorkerIdentity {
  std::string job;
  int32_t task = 0;
  uint64_t incarnation = 0;
  std::vector<std::string> accelerators;  // this host's, as "TYPE:ID"
};

class LocalSteps {
 public:
  LocalSteps(WorkerIdentity me, ReplicaStore* store, StepLink* link, Collectives* collectives)
      : me_(std::move(me)), store_(store), link_(link), collectives_(collectives) {}

  // What a trainer says about a step it calls for (from its BeginStep): when
  // this worker does not know `epoch` yet but holds the layout `layout_id`,
  // the step is set up from it without asking the coordinator. Otherwise a
  // no-op (the first call then fetches the step).
  void Hint(int64_t step, uint64_t epoch, uint64_t layout_id, absl::Duration barrier_timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // S2: a step-local write of one local replica. Errors: FAILED_PRECONDITION
  // (step not open here, variable not in the step, replica sitting the step
  // out), NOT_FOUND (no such local replica), INVALID_ARGUMENT (spec, epoch of
  // another step).
  absl::Status Write(int64_t step, uint64_t epoch, uint64_t variable_id, int32_t replica,
                     std::shared_ptr<const Tensor> value) ABSL_LOCKS_EXCLUDED(mu_);
  // Many writes of one step, all or none (the first refusal is returned).
  struct WriteItem {
    uint64_t variable_id = 0;
    int32_t replica = 0;
    std::shared_ptr<const Tensor> value;
  };
  absl::Status WriteMany(int64_t step, uint64_t epoch, std::vector<WriteItem> items)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The step's view of a local replica (epoch 0: the committed value).
  absl::StatusOr<StoredReplica> Read(uint64_t epoch, uint64_t variable_id, int32_t replica)
      ABSL_LOCKS_EXCLUDED(mu_);
  // S3/S4: commits `devices` ("TPU:0" or full names; empty: all of this
  // host's). The call that completes the host runs the report and the plan;
  // every call answers with the resolution. A FAILED resolution is returned
  // as a value, not an error. Errors: INVALID_ARGUMENT (unknown device),
  // DEADLINE_EXCEEDED (other trainers of this host did not commit in time).
  absl::StatusOr<v1::StepResolution> Commit(int64_t step, uint64_t epoch,
                                            const std::vector<std::string>& devices,
                                            absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops an open step's copies (the trainer aborted). Idempotent.
  void Discard(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);

  // In-place access for a trainer on this host: lends a shared buffer
  // (Buffer::AllocateShared) holding the step's view of a local replica
  // (read), or one to fill (write; `initialize` copies the current view in
  // first). A write lease becomes the step-local copy on Unmap(publish).
  // Errors: as Write (the replica must be writable in this step for write
  // leases), RESOURCE_EXHAUSTED.
  struct Lease {
    uint64_t id = 0;
    int fd = -1;
    uint64_t byte_size = 0;
    uint64_t checksum = 0;
    int64_t version = 0;
  };
  absl::StatusOr<Lease> Map(int64_t step, uint64_t epoch, uint64_t variable_id, int32_t replica,
                            bool write, bool initialize) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns the checksum of a published write: `checksum` when the publisher
  // gave one, else computed here. Errors: NOT_FOUND (no such lease), others
  // as Write.
  absl::StatusOr<uint64_t> Unmap(uint64_t lease, bool publish,
                                 std::optional<uint64_t> checksum = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class Phase { kOpen, kResolving, kDone };
  // Participants and variables of a step, parsed once and kept while
  // membership and the variable set stay the same.
  struct Layout {
    v1::StepInfo info;              // participants and variables only
    int32_t me = -1;                // participant index
    std::map<uint64_t, int> vars;   // id -> index in info.variables
    std::vector<TensorSpec> specs;  // parsed, per info.variables
  };
  struct Step {
    v1::StepInfo info;  // step, epoch, state, timeout (no layout)
    std::shared_ptr<const Layout> layout;
    std::map<std::pair<uint64_t, int32_t>, std::shared_ptr<const Tensor>> written;
    std::set<std::string> committed;  // devices
    Phase phase = Phase::kOpen;
    std::optional<v1::StepResolution> resolution;
    // Filled by the resolving thread: first non-finite element of reduced values.
    std::map<uint64_t, int64_t> reduced_nonfinite;
  };

  absl::StatusOr<std::shared_ptr<Step>> Find(int64_t step, uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Records a new step (ends any older open one). Returns the one recorded
  // first when another thread won.
  std::shared_ptr<Step> AddLocked(uint64_t epoch, std::shared_ptr<Step> s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<const Layout>> ParseLayout(v1::StepInfo& info) const;
  // Runs report, plan and install for `s`; returns the resolution.
  v1::StepResolution Resolve(Step& s);
  // The collectives of `plan`: the values this worker's replicas end with.
  absl::StatusOr<std::map<uint64_t, std::shared_ptr<const Tensor>>> RunPlan(
      Step& s, const v1::StepPlan& plan);
  // What every local participating replica of `var` ends with.
  absl::StatusOr<std::shared_ptr<const Tensor>> FinalValue(
      Step& s, const v1::StepVariable& var,
      const std::map<uint64_t, std::shared_ptr<const Tensor>>& prepared);
  void Install(Step& s, const v1::StepPlan& plan, const v1::StepResolution& res,
               const std::map<uint64_t, std::shared_ptr<const Tensor>>& prepared);
  std::vector<int32_t> LocalReplicas(const Step& s, const v1::StepVariable& var) const;
  absl::Status CheckWrite(const Step& s, const WriteItem& item) const;
  // Ends the leases of a step that is over (their buffers return to the pool).
  void DropLeasesLocked(uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::StepResolution LocalFailure(const Step& s, const absl::Status& status) const;

  const WorkerIdentity me_;
  ReplicaStore* const store_;
  StepLink* const link_;
  Collectives* const collectives_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<uint64_t, std::shared_ptr<Step>> steps_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Layout> layout_ ABSL_GUARDED_BY(mu_);  // the last one seen
  struct Lent {
    int64_t step = 0;
    uint64_t epoch = 0;
    uint64_t variable_id = 0;
    int32_t replica = 0;
    bool write = false;
    std::shared_ptr<Tensor> writable;     // write leases: the buffer being filled
    std::shared_ptr<const Tensor> value;  // read leases: held so the bytes stay put
  };
  std::map<uint64_t, Lent> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_LOCAL_STEPS_H_

// SPDX-License-Identifier: Apache-2.0
// A worker's side of replicated steps (docs/contract.md S2-S4), as trainers call it:
// the steps this worker knows by epoch, their step-local copies, the buffers
// lent for in-place access, and who has committed. When every local
// accelerator has committed, the committing thread hands the step to the
// StepResolver (report, plan, install). No gRPC here: the coordinator is
// reached through StepLink.
//
// Per step (by epoch), on this worker:
//
//   (unknown) --first trainer call--> OPEN: set up from the layout the call
//          names when this worker holds it (Hint), else from GetStep
//   OPEN: trainers read (their own writes, else the committed value) and
//         write step-local copies, through the socket or in place through
//         leased shared buffers (Map/Unmap); committed replicas stay untouched.
//         A buffer published to be hashed later (Unmap, hash_later) joins
//         the copies once the table's hasher has its checksum; until then a
//         read of that replica and the step's commit wait for it
//         (read-your-writes; the report names every published value), and
//         a later write of the replica replaces it (the last writer wins)
//   OPEN --every local accelerator committed (one trainer per host, or one
//          per device)--> RESOLVING: the committing call hands the step to
//          the resolver (CommitAsync: and returns; the resolution answers it)
//   RESOLVING --resolution--> DONE: COMMITTED installed the new values with
//          their versions; FAILED dropped the copies (replicas stay exactly as
//          committed). Every trainer's Commit returns the same resolution.
//   OPEN --Discard, or a newer epoch appears--> DONE (ABORTED locally)
//
// Thread-safe: trainers call from gRPC threads. A step's copies are guarded
// by the table's mutex while it is OPEN; from RESOLVING on they belong to the
// resolver, one thread at a time (no call changes them once a step left
// OPEN).
#ifndef REPVAR_WORKER_CORE_STEP_TABLE_H_
#define REPVAR_WORKER_CORE_STEP_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "common/base/sync.h"
#include "common/base/thread_pool.h"
#include "common/model/step.h"
#include "worker/core/coordinator_link.h"
#include "worker/core/replica_store.h"

namespace repvar::worker {

struct WorkerIdentity {
  std::string job;
  int32_t task = 0;
  uint64_t incarnation = 0;
  std::vector<std::string> accelerators;  // this host's, as "TYPE:ID"
};

// Participants and variables of a step, parsed once and kept while
// membership and the variable set stay the same.
struct StepLayout {
  StepInfo info;                 // participants, variables, layout_id only
  int32_t me = -1;               // this worker's participant index (its rank)
  std::map<uint64_t, int> vars;  // id -> index in info.variables

  const StepVariable* Find(uint64_t id) const;
  // This worker's replicas of `var` that take part in the step.
  std::vector<int32_t> LocalReplicas(const StepVariable& var) const;
};

// Step-local copies: (variable id, replica) -> the trainer's value.
using StepCopies = std::map<std::pair<uint64_t, int32_t>, std::shared_ptr<const Tensor>>;

struct LocalStep {
  enum class Phase { kOpen, kResolving, kDone };
  StepInfo header;  // step, epoch, state, barrier timeout, layout id (no layout)
  std::shared_ptr<const StepLayout> layout;
  StepCopies written;
  // Published in place and still being hashed (StepTable::Unmap with
  // hash_later), by the publish's number: a copy joins `written` when
  // hashed, unless a later write or publish of the replica took its place.
  std::map<std::pair<uint64_t, int32_t>, uint64_t> hashing;
  std::set<std::string> committed;  // devices
  // When the step left OPEN: the version of each step variable's local
  // replicas (they move together). A commit is installed at version + 1 on
  // the replicas still there; one that moved since (a resync after the
  // commit, a newer write) is left as it is.
  std::map<uint64_t, int64_t> begin_versions;
  Phase phase = Phase::kOpen;
  std::optional<StepResolution> resolution;
};

// "step 3 (epoch 11)".
std::string StepName(const StepInfo& header);
// A FAILED resolution of `s` decided on this worker.
StepResolution LocalFailure(const StepInfo& header, const absl::Status& status);

// Runs the report, the plan and the install of a step every local device
// committed (see step_resolver.h); the seam for tests of the table alone.
class Resolver {
 public:
  using Done = absl::AnyInvocable<void(StepResolution) &&>;
  virtual ~Resolver() = default;
  virtual StepResolution Resolve(const LocalStep& step) = 0;
  // The same without a waiting caller: `done` gets the resolution, exactly
  // once, perhaps on another thread; `step` must live until then. By
  // default, Resolve then `done`, on the caller's thread.
  virtual void ResolveAsync(const LocalStep& step, Done done) { std::move(done)(Resolve(step)); }
};

class StepTable {
 public:
  // Where published buffers are hashed (Unmap with hash_later): a closure
  // runs there, later, on another thread. Empty: the table's own threads,
  // one per local accelerator (each trainer's publishes hash side by side,
  // as they did when each publish hashed on its own call's thread).
  using Scheduler = std::function<void(std::function<void()>)>;

  StepTable(WorkerIdentity me, ReplicaStore* store, StepLink* link, Resolver* resolver,
            Scheduler hasher = nullptr);
  // Waits for the commits still running (their resolutions close steps here).
  ~StepTable();

  const WorkerIdentity& identity() const { return me_; }

  // What a trainer says about a step it calls for (from its BeginStep): when
  // this worker does not know `epoch` yet but holds the layout `layout_id`,
  // the step is set up from it without asking the coordinator. Otherwise a
  // no-op (the first call then fetches the step).
  void Hint(int64_t step, uint64_t epoch, uint64_t layout_id, absl::Duration barrier_timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // S2: step-local writes of local replicas of one step, all or none (the
  // first refusal is returned). Errors: FAILED_PRECONDITION (step not open
  // here, variable not in the step, replica sitting the step out),
  // NOT_FOUND (no such local replica), INVALID_ARGUMENT (spec, epoch of
  // another step).
  struct WriteItem {
    uint64_t variable_id = 0;
    int32_t replica = 0;
    std::shared_ptr<const Tensor> value;
  };
  absl::Status Write(int64_t step, uint64_t epoch, std::vector<WriteItem> items)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The step's view of a local replica (epoch 0: the committed value).
  absl::StatusOr<StoredReplica> Read(uint64_t epoch, uint64_t variable_id, int32_t replica)
      ABSL_LOCKS_EXCLUDED(mu_);

  // S3/S4: commits `devices` ("TPU:0" or full names; empty: all of this
  // host's). The call that completes the host runs the resolver; every call
  // answers with the resolution, waiting for it until `deadline`. A FAILED
  // resolution is returned as a value, not an error. Errors:
  // INVALID_ARGUMENT (unknown device), DEADLINE_EXCEEDED (other trainers of
  // this host did not commit in time).
  absl::StatusOr<StepResolution> Commit(int64_t step, uint64_t epoch,
                                        const std::vector<std::string>& devices,
                                        absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Commit without a caller waiting: `done` gets what Commit would return,
  // exactly once, perhaps before this returns; it must not block. The call
  // that completes the host of a step known here, with nothing published
  // still being hashed, hands the step to the resolver and returns: `done`
  // runs on the thread that brings the resolution (the link's, on the report
  // path). A call that has to wait runs on a thread of the table's: for the
  // other devices of this host, once its own are recorded; for the step
  // from the coordinator or a hash, the whole Commit.
  using CommitDone = absl::AnyInvocable<void(absl::StatusOr<StepResolution>) &&>;
  void CommitAsync(int64_t step, uint64_t epoch, std::vector<std::string> devices,
                   absl::Time deadline, CommitDone done) ABSL_LOCKS_EXCLUDED(mu_);
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
  // gave one, else computed here. With `hash_later` (and no `checksum`) it
  // returns 0 at once and the hasher computes it: the trainer goes on while
  // the worker reads the bytes, and whatever needs the checksum (a read of
  // the replica, the commit) waits for it. Errors: NOT_FOUND (no such
  // lease), others as Write.
  absl::StatusOr<uint64_t> Unmap(uint64_t lease, bool publish,
                                 std::optional<uint64_t> checksum = std::nullopt,
                                 bool hash_later = false) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls waiting now for a published value's hash (a test seam).
  int HashWaiters() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a step's outcome is being decided or installed here: its
  // replicas may be behind a commit the coordinator recorded (two-phase
  // commit). Without the lock, for a checker that may not wait (a test
  // seam).
  bool Settling() const { return unsettled_.load() > 0; }

 private:
  // The step `epoch`, fetched from the coordinator on first sight.
  absl::StatusOr<std::shared_ptr<LocalStep>> Find(int64_t step, uint64_t epoch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records a new step (ends any older open one). Returns the one recorded
  // first when another thread won.
  std::shared_ptr<LocalStep> AddLocked(uint64_t epoch, std::shared_ptr<LocalStep> s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<const StepLayout>> ParseLayout(StepInfo& info) const;
  absl::Status CheckWrite(const LocalStep& s, const WriteItem& item) const;
  // `devices` as this host's short names ("TPU:0"); all of them when empty.
  absl::StatusOr<std::vector<std::string>> LocalDevices(
      const std::vector<std::string>& devices) const;
  // Records `mine` as committed in `s` while it is OPEN; returns whether
  // that completes the host (the step is RESOLVING then, and the caller
  // hands it to the resolver: ResolveThenClose).
  bool EnterLocked(LocalStep& s, const std::vector<std::string>& mine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A commit that did not complete the host: waits until `s` is DONE or
  // `deadline`, and returns its resolution (a late trainer's, from the
  // coordinator). `s` stays held by the caller.
  absl::StatusOr<StepResolution> AwaitResolution(const LocalStep& s, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Resolves a step that left OPEN (its copies are the resolver's until
  // then), closes it with the resolution, then calls `done` with it.
  void ResolveThenClose(std::shared_ptr<LocalStep> s, CommitDone done) ABSL_LOCKS_EXCLUDED(mu_);
  // The hasher's half of Unmap(hash_later): hashes the published bytes and
  // makes them the step-local copy, unless the step ended meanwhile.
  void FinishHashing(const std::shared_ptr<LocalStep>& s, std::pair<uint64_t, int32_t> key,
                     uint64_t publish, const std::shared_ptr<Tensor>& value)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `key` of `s` (every key, when nullopt) is hashed.
  void AwaitHashedLocked(const LocalStep& s,
                         std::optional<std::pair<uint64_t, int32_t>> key = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a step: its leases (their buffers return to the pool), its copies.
  void CloseLocked(uint64_t epoch, LocalStep& s, StepResolution resolution)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerIdentity me_;
  ReplicaStore* const store_;
  StepLink* const link_;
  Resolver* const resolver_;

  // State below is protected by mu_.
  mutable Mutex mu_;
  CondVar cv_;  // a step changed phase
  std::map<uint64_t, std::shared_ptr<LocalStep>> steps_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const StepLayout> layout_ ABSL_GUARDED_BY(mu_);  // the last one seen
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
  uint64_t next_publish_ ABSL_GUARDED_BY(mu_) = 1;  // numbers deferred publishes
  int hash_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  int resolving_ ABSL_GUARDED_BY(mu_) = 0;  // ResolveThenClose not done yet
  std::atomic<int> unsettled_{0};           // the same, read without mu_ (Settling)

  // Last: destroyed first, so that the hashing it still runs finds the
  // table whole.
  std::unique_ptr<ThreadPool> own_hasher_;
  Scheduler hasher_;
  // Where CommitAsync's calls that wait run (Commit). It grows: those
  // calls wait on each other (a host's trainers), none behind another.
  std::unique_ptr<ThreadPool> waiting_;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_STEP_TABLE_H_

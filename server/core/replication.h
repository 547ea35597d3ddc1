// SPDX-License-Identifier: Apache-2.0
// Cross-replica writes and reads (docs/contract.md C1-C7, F2, F7): a new
// value is computed once, named version n+1, sent to every live replica,
// and committed only when all of them acknowledged it; reads return the
// committed value; stale replicas on live workers are rewritten (repair)
// and a returning worker is resynced before it serves. The write path's
// phases are walked through in docs/architecture.md ("The write path").
//
// Thread-safe. A broadcast to N workers uses no thread per worker: the
// calling thread waits while the WorkerClient's callbacks complete.
#ifndef REPVAR_SERVER_CORE_REPLICATION_H_
#define REPVAR_SERVER_CORE_REPLICATION_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/base/clock.h"
#include "common/base/memory_budget.h"
#include "common/base/ranked_mutex.h"
#include "common/base/sync.h"
#include "common/base/thread_pool.h"
#include "common/model/variable.h"
#include "server/core/collective_groups.h"
#include "server/core/lock_order.h"
#include "server/core/registry.h"
#include "server/core/replication_plan.h"
#include "server/core/step_coordinator.h"
#include "server/core/worker_client.h"

namespace repvar::server {

struct ReplicationOptions {
  // Values of at least this many bytes are staged in the state log while
  // they are delivered (StateLog::Stage).
  uint64_t stage_min_bytes = 1 << 20;
  // How long repair waits for a worker to list its replicas.
  absl::Duration verify_timeout = absl::Seconds(5);
  // Data plane (docs/architecture.md): a single write of at least `data_plane_min_bytes`
  // to at least `data_plane_min_workers` workers goes to one root worker, which
  // broadcasts it to the others over gloo. Otherwise the coordinator writes
  // every worker itself.
  bool data_plane = false;
  uint64_t data_plane_min_bytes = 1 << 20;
  int data_plane_min_workers = 3;
  // Committed values read back from replicas (a step changed them) are
  // cached up to this many bytes in all; a value over a quarter of it is
  // not cached (a checkpoint reads the whole model once).
  uint64_t read_cache_bytes = uint64_t{64} << 20;
  // Assigns whose values are all at most this many bytes are decided before
  // they are sent (WritePrepared, synced while the workers take them) and
  // answered without waiting for their commit's own sync. Above it, the
  // commit is synced before the answer (the values go to blob files).
  uint64_t prepare_max_bytes = 16 << 10;
};

class Replication {
 public:
  // Values it computes (initial values, AssignAdd results) are charged to
  // `budget` while the request runs (null: unbounded).
  // `log` is the registry's (thread-safe): values are staged in it and
  // checked against it directly.
  Replication(ReplicationOptions options, Clock* clock, Registry* registry, StateLog* log,
              StepCoordinator* steps, CollectiveGroups* groups, WorkerClient* workers,
              MemoryBudget* budget = nullptr);

  // C5: initialize-if-uninitialized; the first caller wins. Errors:
  // NOT_FOUND, INVALID_ARGUMENT (no or bad initializer, non-finite value),
  // UNAVAILABLE (a live replica could not be written).
  absl::StatusOr<std::vector<InitializeResult>> Initialize(
      const RequestKey& key, const std::vector<InitializeItem>& items);
  // C2, C3, C6, C7, V6: validates every item, then writes them all in one
  // broadcast. Errors: NOT_FOUND, FAILED_PRECONDITION (spec mismatch;
  // ADD/SUB of an uninitialized variable; a step is open), INVALID_ARGUMENT
  // (non-finite value or result, reused request id, a name twice),
  // UNAVAILABLE (a live replica missed it: the variable is marked for resync).
  absl::StatusOr<std::vector<WriteResult>> Assign(const RequestKey& key,
                                                  const std::vector<Assignment>& items);
  // C1. Errors: NOT_FOUND, FAILED_PRECONDITION (uninitialized), UNAVAILABLE
  // (a step changed it and no up-to-date replica answered).
  absl::StatusOr<ReadResult> Read(absl::string_view name);
  // Read of each of `names`, in order, from one look at the state: the
  // coordinator's copies as they were then (a value a step left on the
  // replicas is read as Read reads it). Errors: as Read, for the first name
  // that fails; RESOURCE_EXHAUSTED when the values come to more than
  // `max_bytes` (nothing is read then).
  absl::StatusOr<std::vector<ReadResult>> ReadBatch(absl::Span<const absl::string_view> names,
                                                    uint64_t max_bytes);
  // ReadBatch from what the coordinator holds, without waiting on a worker
  // or a sync: its copies, and the values a step left on the replicas that
  // it has read back since (its cache). nullopt when a value must be read
  // from a replica (not read back yet, or the coordinator's copy is
  // damaged), when a copy in a blob file has not been checked yet (its first
  // use after a restart: a pass over it, maybe from disk), when the state is
  // not durable yet (a write's record waits for its sync), or when the
  // values come to more than `held_bytes` (the caller would copy them where
  // it must not wait): ReadBatch reads it, and waits. Errors: as
  // ReadBatch(names, max_bytes), those that need no worker.
  absl::StatusOr<std::optional<std::vector<ReadResult>>> ReadBatchHeld(
      absl::Span<const absl::string_view> names, uint64_t max_bytes, uint64_t held_bytes);
  // Deletes a variable and drops its replicas. A live holder the drop did
  // not reach owes it (Registry::OwesDrop: no read lease until dropped);
  // the answer waits until no lease of such a holder can hold (C8).
  // Errors: NOT_FOUND, FAILED_PRECONDITION (it takes part in the open step).
  absl::Status Delete(const RequestKey& key, absl::string_view name);

  // F2: rewrites the replicas `task` holds that are not up to date from the
  // committed values. Failures are logged; the replicas stay STALE.
  void ResyncTask(const TaskKey& task);
  // Repair's eyes (F2): fences `task` off from every write sent to it
  // before now (WorkerClient::ListReplicasAsync), asks what it holds and
  // brings the records in line in one record: a replica recorded up to date
  // that holds anything but the committed (version, checksum) becomes
  // STALE; a STALE one that holds it is acknowledged; replicas of variables
  // that no longer exist are dropped. Errors: FAILED_PRECONDITION (not
  // live), the worker's, the log's; nothing changes then.
  absl::Status VerifyTask(const TaskKey& task, absl::Time deadline);
  // A worker (re)registered: verifies what it holds (its up-to-date
  // replicas become STALE when it cannot be asked), then resyncs it.
  void Rejoin(const TaskKey& task);
  // At startup, before serving (Coordinator::Recover): verifies every worker
  // recorded live, all at once, for up to verify_timeout. The up-to-date replicas of
  // one that does not answer become STALE: a write the crash left
  // unrecorded may have reached it.
  void VerifyAll();
  // Repair, run periodically: every live worker holding a STALE replica or
  // a replica of a variable flagged for resync is verified, then resynced;
  // a flag is cleared once every live replica of its variable is up to date
  // and its worker was verified in the same pass. Drops a delete owes
  // (Registry::OwedDrops) are tried again first.
  void ResyncStale();

  // Bytes of committed values cached from replicas (ReplicationOptions::
  // read_cache_bytes bounds it).
  uint64_t cached_bytes() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class WriteLocks;

  // Until no read lease of `tasks`, or of a superseded process, can hold
  // (C8); at once when workers keep no read tables.
  void WaitOutLeases(const std::vector<TaskKey>& tasks) const;
  // The drops deletes owe, tried again; each confirmed is no longer owed.
  void RetryOwedDrops();

  // ---- The write path (replication_write.cc; docs/architecture.md) ----
  // What AssignInGate decided per item, under the variables' write locks.
  struct AssignTarget {
    int64_t version = 0;
    bool allow_nonfinite = false;
    bool only_replicas = false;  // the committed value lives on the replicas alone
  };
  // Assign inside the write gate, deciding on state it peeks (Registry::Peek).
  absl::StatusOr<std::vector<WriteResult>> AssignInGate(const RequestKey& key,
                                                        const std::vector<Assignment>& items,
                                                        absl::string_view op);
  // The ids of the items' variables. Errors: NOT_FOUND, INVALID_ARGUMENT (a
  // name twice).
  absl::StatusOr<std::vector<uint64_t>> IdsOfItems(const std::vector<Assignment>& items);
  // Checks each item against its variable (C7, spec, initialized for ADD
  // and SUB) and names its next version. Errors: NOT_FOUND (deleted),
  // INVALID_ARGUMENT, FAILED_PRECONDITION.
  absl::StatusOr<std::vector<AssignTarget>> CheckAssignments(const std::vector<Assignment>& items,
                                                             const std::vector<uint64_t>& ids);
  static absl::StatusOr<AssignTarget> CheckAssignment(const Assignment& item,
                                                      const VariableRecord* v);
  // C3: each item's new value, computed once from the committed value
  // (read from a replica when a step changed it); a committed value only
  // the replicas hold goes to `keep` (F7: a write that fails must not take
  // it with it). Results are charged to `charge`.
  absl::StatusOr<std::vector<PlannedWrite>> ComputeValues(const std::vector<Assignment>& items,
                                                          const std::vector<uint64_t>& ids,
                                                          const std::vector<AssignTarget>& targets,
                                                          MemoryCharge& charge, Record& keep);
  // Commits the ValueKept changes of `keep` still current.
  absl::Status KeepCommittedValues(const Record& keep);
  // Sends `writes` to every live replica and folds the answers. `prepare`:
  // the answer of a write of small values, recorded with them in a
  // WritePrepared before they are sent and synced while they travel.
  // Errors: RESOURCE_EXHAUSTED (no room for its record on disk), those of
  // Registry::NextFence and of the WritePrepared's commit; nothing was sent
  // then.
  absl::StatusOr<Delivery> Deliver(const std::vector<PlannedWrite>& writes,
                                   const RequestRecorded* prepare = nullptr);
  // Room for the write's records before anything leaves (a full disk
  // refuses the write with nothing changed anywhere), then its fence.
  absl::StatusOr<uint64_t> MakeRoomForWrite(const std::vector<PlannedWrite>& writes, bool prepared);
  // The WritePrepared of `prepare` (null: none, position 0), committed
  // unsynced: its log position.
  absl::StatusOr<uint64_t> Prepare(const std::vector<PlannedWrite>& writes, uint64_t fence,
                                   const RequestRecorded* prepare);
  // Whether one root worker broadcasts the write to the others over the
  // data plane: a single large write to enough workers, outside a step
  // (during one, the workers' data plane belongs to its collectives).
  bool UseDataPlane(const std::vector<WriteBatch>& batches) const;
  // Starts writing the large values to the state log's blob files while the
  // workers take them, so that the commit only syncs its record; `staged`
  // is notified when done (at once when there is nothing to stage).
  void StageValues(const std::vector<PlannedWrite>& writes, Notification* staged);
  // Every batch to its worker at once; the WritePrepared at `prepared_at`
  // is synced on this thread meanwhile (into `prepared_durable`). Returns
  // each batch's status.
  std::vector<absl::Status> FanOut(const std::vector<WriteBatch>& batches, uint64_t prepared_at,
                                   absl::Status* prepared_durable);
  // FanOut in the CollectiveGroups' order, the first batch's worker the
  // root of a broadcast to the others.
  std::vector<absl::Status> FanOutOverDataPlane(std::vector<WriteBatch>& batches,
                                                uint64_t prepared_at,
                                                absl::Status* prepared_durable);
  // Commits `writes` as the delivery left them (SettleWrites) with
  // `outcome` when all of them reached every live replica; UNAVAILABLE when
  // not.
  absl::Status CommitWrites(const std::vector<PlannedWrite>& writes, const Delivery& delivery,
                            const std::map<uint64_t, Initializer>& initializers,
                            std::optional<RequestRecorded> outcome);

  // ---- Reads (replication_read.cc) ----
  absl::StatusOr<ReadResult> CommittedValue(uint64_t id);
  // ReadBatch into `out` where `held_bytes` is nullopt; ReadBatchHeld
  // within it where set: false when not held (`out` is then incomplete).
  absl::StatusOr<bool> ReadBatchFrom(absl::Span<const absl::string_view> names, uint64_t max_bytes,
                                     std::optional<uint64_t> held_bytes,
                                     std::vector<ReadResult>* out);
  // The value of `id` at `version` read back from a replica, if cached.
  std::optional<ReadResult> Cached(uint64_t id, int64_t version) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps `value` as the cached committed value of `id` within the bound
  // (nullopt: forgets it).
  void Cache(uint64_t id, std::optional<ReadResult> value) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Repair (replication_repair.cc) ----
  // VerifyTask's second half: `held` is what `target` listed after being
  // fenced.
  absl::Status Reconcile(const WorkerTarget& target,
                         const std::vector<WorkerClient::HeldReplica>& held);
  // Marks the up-to-date replicas of `task` STALE: what it holds is unknown.
  void MarkUnverified(const TaskKey& task, uint64_t incarnation);
  // Ids of the variables with a replica on `task`.
  std::vector<uint64_t> IdsOn(const TaskKey& task) const;

  // ---- Shared (replication.cc) ----
  absl::StatusOr<uint64_t> IdOf(absl::string_view name) const;
  // The write lock of each of `ids`, made for those that have none yet.
  std::vector<std::shared_ptr<Mutex>> WriteLocksOf(const std::vector<uint64_t>& ids)
      ABSL_LOCKS_EXCLUDED(mu_);

  const ReplicationOptions options_;
  Clock* const clock_;
  Registry* const registry_;
  StateLog* const log_;
  StepCoordinator* const steps_;
  CollectiveGroups* const groups_;
  WorkerClient* const workers_;
  MemoryBudget* const budget_;
  // Stages large values in the state log while their writes travel.
  ThreadPool stagers_{1, 4};

  // State below is protected by mu_.
  RankedMutex mu_{kLeafRank, "Replication::mu_"};
  absl::flat_hash_map<uint64_t, std::shared_ptr<Mutex>> write_locks_ ABSL_GUARDED_BY(mu_);
  // Committed values fetched from replicas (a step left them there): a
  // cache, not state; keyed by variable id, valid for its version; at most
  // options_.read_cache_bytes in all (fetched_bytes_).
  absl::flat_hash_map<uint64_t, ReadResult> fetched_ ABSL_GUARDED_BY(mu_);
  uint64_t fetched_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Variables whose workers may hold a value the log failed to record:
  // repair verifies their workers (not state: a restart verifies them all).
  std::set<uint64_t> suspect_ ABSL_GUARDED_BY(mu_);
  // C6: the request ids an Assign attempt is running for. A retry that
  // arrives while an earlier attempt still runs (its caller gave up
  // waiting) is told to retry: a refusal could be contradicted by what
  // that attempt still does.
  absl::flat_hash_set<std::string> running_ ABSL_GUARDED_BY(mu_);
  // C6: the refusals Assign answered lately, by request id, oldest first in
  // `refusal_order_`: an attempt of the request that arrives after its
  // refusal (delayed, duplicated, or queued while the coordinator was
  // paused) gets the same refusal, not a chance to apply. In memory, for
  // kRememberRefusals and at most kMaxRefusals of them.
  absl::flat_hash_map<std::string, absl::Status> refused_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, std::string>> refusal_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_REPLICATION_H_

// SPDX-License-Identifier: Apache-2.0
// The registry: who is in the cluster (T1-T5), which variables exist and
// where their replicas live (V1-V3), and the one commit point of the
// coordinator's state. It owns the ClusterState; every change goes through
// Commit(), which builds a record from the current state under the lock,
// appends it to the StateLog and applies it:
//
//   caller --build(state)--> Record --StateLog::Append--> ClusterState::Apply
//
// Building under the lock makes check-then-act atomic (a name is free, a
// worker is still live) without the callers holding anything. Heartbeats are
// liveness only: kept here, recorded nowhere.
//
// Group commit: the record is appended unsynced and applied under the lock;
// every call — commits and reads alike — then releases the lock and waits
// until the state it saw is durable (StateLog::Durable) before it returns.
// Writers waiting together share one sync, and no answer ever reports what
// a crash could take back.
//
// Thread-safe (a monitor, rank kRegistryRank); never calls out while holding
// its lock except to the StateLog.
#ifndef REPVAR_SERVER_CORE_REGISTRY_H_
#define REPVAR_SERVER_CORE_REGISTRY_H_

#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/ranked_mutex.h"
#include "common/model/replica_write.h"
#include "common/model/topology.h"
#include "common/model/variable.h"
#include "server/core/cluster_state.h"
#include "server/core/lock_order.h"
#include "server/core/state_log.h"

namespace repvar::server {

struct MembershipOptions {
  // A worker silent for longer is declared dead (T5).
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // A worker heard from may serve committed values from its replicas for
  // this long after it sent the heartbeat (docs/architecture.md, "Local
  // reads"); zero: never. Capped at a third of heartbeat_timeout, so that a
  // worker declared dead holds no lease.
  absl::Duration read_lease = absl::Seconds(3);
  // job -> number of tasks expected (tasks 0..n-1); WaitForExpected waits for them.
  std::map<std::string, int32_t> expected_tasks;
};

struct RegistryOptions {
  MembershipOptions membership;
  // Largest variable accepted (RESOURCE_EXHAUSTED above it).
  uint64_t max_variable_bytes = uint64_t{64} << 30;
  ClusterStateOptions state;
};

// What a heartbeat is answered with.
struct HeartbeatGrant {
  int64_t topology_version = 0;
  // How long the worker may serve local reads from the moment it sent the
  // heartbeat; zero: not at all (none was asked for, or a replica it holds
  // is not up to date).
  absl::Duration read_lease;
  // Per value asked about: whether it is the committed value of an up-to-date
  // replica of this worker's.
  std::vector<bool> confirmed;
};

class Registry {
 public:
  Registry(RegistryOptions options, Clock* clock, StateLog* log);

  const MembershipOptions& membership_options() const { return options_.membership; }

  // ---- The commit point. ----
  // How a commit's record is waited for.
  enum class Durability {
    // Durable before Commit returns, as is everything the caller saw.
    kSynced,
    // Appended and applied; Commit returns its log position for
    // AwaitDurable (a write's WritePrepared, which the writer syncs itself
    // once its values are on their way to the workers). Everyone else who
    // sees the state waits for it as for any record.
    kUnsynced,
    // A durable record already decided it (the resolution of a durable
    // WritePrepared): applied at once, and neither the caller nor anyone
    // who sees the state waits for its sync; a crash that loses it rolls
    // the prepared write forward to the same versions, checksums and
    // answer (Recover).
    kDecided,
  };
  // Builds a record from the current state and commits it: appended to the
  // log, then applied; returns its log position (an empty record is not
  // committed: the position of what the state holds). An error from
  // `build` or from the log changes nothing and is returned.
  using Builder = absl::FunctionRef<absl::StatusOr<Record>(const ClusterState&)>;
  absl::StatusOr<uint64_t> Commit(Builder build, Durability durability = Durability::kSynced)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once the record at `position` and all before it are durable;
  // kEverythingApplied: everything applied so far (but records a durable
  // one decided). Errors: the log's.
  static constexpr uint64_t kEverythingApplied = UINT64_MAX;
  absl::Status AwaitDurable(uint64_t position = kEverythingApplied) const ABSL_LOCKS_EXCLUDED(mu_);
  // Loads what the log kept from an earlier run (StateLog::Recover); call
  // once, before serving. Writes prepared and never resolved are committed
  // (roll-forward: their answers may have been given); every replica of
  // theirs is STALE until verified. Workers recorded live are given a
  // heartbeat timeout from now to be heard from. On error the registry is
  // unusable.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `read` on the state under the lock and returns what it returns,
  // once the state it read is durable.
  template <typename F>
  auto Read(F&& read) const ABSL_LOCKS_EXCLUDED(mu_) {
    CallLock lock(this);
    return read(static_cast<const ClusterState&>(state_));
  }

  // Read for a caller that must not wait (gRPC's callback thread): runs
  // `read` on the state under the lock and returns what it returns if the
  // state it read is durable already; nullopt if it is not yet (Read would
  // wait for a sync).
  template <typename F, typename R = std::invoke_result_t<F&, const ClusterState&>>
  std::optional<R> ReadIfDurable(F&& read) const ABSL_LOCKS_EXCLUDED(mu_) {
    uint64_t seen = 0;
    std::optional<R> result;
    {
      RankedLock lock(&mu_);
      seen = required_;
      result.emplace(read(static_cast<const ClusterState&>(state_)));
    }
    if (seen != 0 && !log_->IsDurable(seen)) return std::nullopt;
    return result;
  }

  // Runs `read` on the state under the lock and returns at once, without
  // waiting for what it read to be durable: for a write's own decisions
  // (ids, versions, where replicas are), which the durability of the write's
  // commit covers (the log keeps order). Writers running together then wait
  // for syncs once, at their commits. A caller that answers from what it
  // peeked without committing (an error) calls AwaitDurable first.
  template <typename F>
  auto Peek(F&& read) const ABSL_LOCKS_EXCLUDED(mu_) {
    RankedLock lock(&mu_);
    return read(static_cast<const ClusterState&>(state_));
  }

  // StateLog::CheckRoom: whether a record with `value_bytes` of values fits.
  absl::Status CheckRoom(uint64_t value_bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // A fencing token for a write to workers (ReplicaWrite::fence): larger
  // than every token handed out before, in this run or an earlier one.
  // Tokens are reserved in blocks by a record; a token is returned once its
  // block's record is durable (not everything applied before it). Errors:
  // the log's.
  absl::StatusOr<uint64_t> NextFence() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Membership (T1-T5). ----
  // T1. A newer incarnation of a live (job, task) supersedes it at once:
  // the old one is declared dead in the same record and returned in
  // `superseded`. Errors: INVALID_ARGUMENT (empty or malformed
  // job/address/device, duplicate device, device of another task,
  // incarnation 0, same incarnation with other devices), ABORTED ((job,
  // task) live under a newer incarnation: the caller was superseded).
  // Nothing changes on error. Returns the topology version.
  //
  // `joining`: the task stays out of the topology (Snapshot, WaitForChange,
  // WaitForExpected, placement of new variables) until Joined: its
  // replicas are being verified and resynced. It is live for everything
  // else (heartbeats, writes, repair). Recorded: a restart before Joined
  // finishes the join (Coordinator::Recover).
  absl::StatusOr<int64_t> Register(const WorkerRegistration& reg,
                                   std::optional<LiveTask>* superseded = nullptr,
                                   bool joining = false) ABSL_LOCKS_EXCLUDED(mu_);
  // The joining task's replicas were verified and resynced: it is listed
  // from now (a record, a new topology version). Nothing when it is no
  // longer live under `incarnation` or not joining. Errors: the log's.
  absl::Status Joined(const TaskKey& key, uint64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);
  // Live workers registered joining and not yet joined: after a restart,
  // those whose join the earlier run did not finish.
  std::vector<LiveTask> Joining() const ABSL_LOCKS_EXCLUDED(mu_);
  // Liveness, and for a worker that serves local reads (`read_lease`) its
  // read lease: granted while every replica it holds is up to date, and the
  // values in `held` confirmed that are the committed ones of such
  // replicas. Errors: NOT_FOUND (unknown or declared-dead task:
  // re-register), ABORTED (stale incarnation), INVALID_ARGUMENT (more than
  // kMaxHeldValuesPerHeartbeat values).
  absl::StatusOr<HeartbeatGrant> Heartbeat(const TaskKey& key, uint64_t incarnation,
                                           bool read_lease = false,
                                           const std::vector<HeldValue>& held = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // The latest time a read lease granted to one of `tasks` may still hold
  // (InfinitePast: none can). A commit that leaves a task's replica behind
  // waits past it (StepCoordinator::BeginStep).
  absl::Time LeaseHeldUntil(const std::vector<TaskKey>& tasks) const ABSL_LOCKS_EXCLUDED(mu_);
  // The latest time a read lease of a superseded incarnation may hold: its
  // process may still serve reads, so no new value is committed before
  // (Replication::CommitWrites, StepCoordinator::BeginStep).
  absl::Time SupersededLeasesEnd() const ABSL_LOCKS_EXCLUDED(mu_);
  // While a step is open, only its participants that hold no replica
  // sitting it out get a read lease, each under the incarnation that takes
  // part: any other worker (one that sits it out, or registers while it is
  // open) would serve the value the step replaces once it is up to date.
  // StepCoordinator::BeginStep sets them; nullopt (no step open) lifts the
  // limit.
  void LimitLeases(std::optional<absl::flat_hash_map<TaskKey, uint64_t>> to)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops of deleted variables that did not reach their live holder: the
  // holder may serve them from its local read table, so it gets no read
  // lease until each is confirmed dropped (Replication retries them), or
  // it registers anew (its table starts empty).
  void OwesDrop(const TaskKey& task, uint64_t variable_id) ABSL_LOCKS_EXCLUDED(mu_);
  void DropConfirmed(const TaskKey& task, uint64_t variable_id) ABSL_LOCKS_EXCLUDED(mu_);
  std::map<TaskKey, std::set<uint64_t>> OwedDrops() const ABSL_LOCKS_EXCLUDED(mu_);
  // T5: declares dead every live task silent for longer than the timeout at
  // `now` (one record); returns them.
  std::vector<LiveTask> CheckHeartbeats(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  TopologySnapshot Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the topology version exceeds `after_version` or `deadline`
  // passes; returns the snapshot either way.
  TopologySnapshot WaitForChange(int64_t after_version, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // T4: blocks until every expected task is live. Errors: DEADLINE_EXCEEDED
  // naming the missing tasks.
  absl::StatusOr<TopologySnapshot> WaitForExpected(absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<LiveTask> Find(const TaskKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Variables (V1-V3, V6). ----
  // All-or-nothing. Errors: INVALID_ARGUMENT (name, spec, empty batch,
  // duplicate names with different specs in one batch), FAILED_PRECONDITION
  // (replica_count > accelerators), ALREADY_EXISTS (same name, different
  // spec), RESOURCE_EXHAUSTED (larger than max_variable_bytes). `detail`:
  // of the answer's variables.
  absl::StatusOr<CreateResult> CreateVariables(const RequestKey& key,
                                               const std::vector<CreateItem>& items,
                                               VariableDetail detail = VariableDetail::kFull)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Errors: NOT_FOUND.
  absl::StatusOr<VariableView> GetVariable(absl::string_view name) const ABSL_LOCKS_EXCLUDED(mu_);
  // Variables in `collection` (all when empty), by name.
  std::vector<VariableView> ListVariables(absl::string_view collection,
                                          VariableDetail detail = VariableDetail::kFull) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The answer recorded for a retried request (C6); nullopt when none (not
  // waiting for durability: the request goes on to a commit that does).
  // Errors: INVALID_ARGUMENT (the id was used for another payload).
  absl::StatusOr<std::optional<Answer>> Outcome(const RequestKey& key, absl::string_view op) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // mu_ for one call: leaving releases it and waits until everything the
  // call saw or committed (up to required_) is durable. What is returned is
  // computed before, under the lock; the caller gets it after.
  class ABSL_SCOPED_LOCKABLE CallLock {
   public:
    explicit CallLock(const Registry* r) ABSL_EXCLUSIVE_LOCK_FUNCTION(r->mu_) : r_(r) {
      r_->mu_.Lock();
    }
    ~CallLock() ABSL_UNLOCK_FUNCTION() {
      const uint64_t seen = r_->required_;
      r_->mu_.Unlock();
      // An error only when a test's log was told not to stop the process
      // (StateLog::Durable).
      if (seen != 0) (void)r_->log_->Durable(seen);
    }
    CallLock(const CallLock&) = delete;
    CallLock& operator=(const CallLock&) = delete;

   private:
    const Registry* const r_;
  };

  // CreateVariables' phases: the items alone (INVALID_ARGUMENT), then
  // against the state (ALREADY_EXISTS, INVALID_ARGUMENT,
  // FAILED_PRECONDITION), then the record that creates the new ones,
  // placed by Place (placement.h), with the request's `answer`.
  absl::Status CheckCreateItems(const std::vector<CreateItem>& items) const;
  static absl::Status CheckCreatesAgainst(const ClusterState& state, const TopologySnapshot& topo,
                                          const std::vector<CreateItem>& items);
  Record RecordCreates(const ClusterState& state, const TopologySnapshot& topo,
                       const RequestKey& key, const std::vector<CreateItem>& items,
                       CreateAnswer* answer) const;

  // Appends and applies `record`; returns its log position (required_ when
  // it is empty). `decided`: a durable record already decided this one.
  absl::StatusOr<uint64_t> CommitLocked(Record record, bool decided = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TopologySnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether LimitLeases lets this worker process hold a read lease.
  bool WithinLeaseLimit(const TaskKey& task, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The topology users see: live tasks that are not joining.
  TopologySnapshot VisibleTopology(const std::map<std::string, int32_t>& expected) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;
  Clock* const clock_;

  // Thread-safe; Append, Applied and Recover are called under mu_, which
  // keeps the log in commit order.
  StateLog* const log_;

  // State below is protected by mu_.
  mutable RankedMutex mu_{kRegistryRank, "Registry::mu_"};
  ClusterState state_ ABSL_GUARDED_BY(mu_);
  std::map<TaskKey, absl::Time> last_heartbeat_ ABSL_GUARDED_BY(mu_);
  // Per task, until when a read lease granted to it may hold, on this
  // clock: the worker counts from when it sent the heartbeat, earlier.
  absl::flat_hash_map<TaskKey, absl::Time> lease_held_until_ ABSL_GUARDED_BY(mu_);
  absl::Time superseded_leases_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::optional<absl::flat_hash_map<TaskKey, uint64_t>> lease_limit_ ABSL_GUARDED_BY(mu_);
  std::map<TaskKey, std::set<uint64_t>> owed_drops_ ABSL_GUARDED_BY(mu_);
  // The lease granted (read_lease, capped), and the margin added for the
  // clocks' drift.
  absl::Duration ReadLease() const;
  absl::Duration LeaseBound() const;
  uint64_t last_fence_ ABSL_GUARDED_BY(mu_) = 0;  // the last token handed out
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;     // log position of the last record applied
  // What a caller who saw the state waits for: applied_, except records a
  // durable one decided (Durability::kDecided). Written under mu_; CallLock
  // reads it as it releases mu_.
  std::atomic<uint64_t> required_{0};
  // Log position of the record that reserved the current block of fences
  // (0: reserved by an earlier run, durable).
  uint64_t fences_position_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_REGISTRY_H_

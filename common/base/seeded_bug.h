// SPDX-License-Identifier: Apache-2.0
// Past bugs, kept behind a test-only switch so that the cluster simulator
// can show it still finds each one (`repvar-sim --seeded_bug=NAME`,
// docs/simulator.md). Nothing but the simulator sets the switch: in the
// daemons every BugSeeded() is false, one relaxed load.
#ifndef REPVAR_COMMON_BASE_SEEDED_BUG_H_
#define REPVAR_COMMON_BASE_SEEDED_BUG_H_

#include <atomic>
#include <string_view>

namespace repvar {

enum class SeededBug : int {
  kNone = 0,
  // F7: a worker that registers again with the same incarnation gets its
  // replicas back as recorded, unverified (fixed in 7a21734).
  kReturnedReplicasTrusted,
  // Collective groups named from 0 again after a coordinator restart
  // (fixed in d1c0631).
  kGroupsReusedAcrossRestarts,
  // A root broadcast's timeout counted from when a pool thread takes it
  // (fixed in 297bd26).
  kQueuedBroadcastWaitsAnotherTimeout,
  // F6: a worker applies a write fenced below one it applied or below the
  // floor repair set.
  kFencesIgnored,
  // F7: repair's verification compares versions, not checksums.
  kVerifyIgnoresChecksums,
  // C6: the retry of an applied write is applied again.
  kRetriesReapplied,
  // F3: a restart does not roll a durable WritePrepared forward.
  kNoRollForward,
  // F3: nothing waits for the state log's sync (answers before records
  // are durable).
  kAnsweredBeforeSync,
  // F3/F7: a restarted coordinator trusts its records of what the workers
  // hold, though a write in flight at the crash may have reached some.
  kNotVerifiedAtRecovery,
  // F2/F7: a worker lists its replicas while writes to them are in flight.
  kListedUnderWrites,
  // C6: a retry runs beside an earlier attempt of its request still
  // running, and is refused at the write gate while that attempt goes on
  // to apply the write (found by the simulator with steps).
  kAttemptsOverlap,
  // S4: the barrier takes the workers' summaries without checking their
  // digests (replicas that disagree are never repaired).
  kDigestsUnchecked,
  // S4/F7: a worker installs a short resolution at its replica's version
  // now + 1, over a replica a resync moved to the commit meanwhile (found
  // by the simulator in 97df4fb, fixed in 022282d).
  kInstallOverMovedReplicas,
  // C6: a refused request's attempt that arrives after the refusal (a
  // duplicate, or one queued while the coordinator was paused) applies the
  // write (found by the simulator, fixed with Replication::refused_).
  kRefusalsForgotten,
  // C8: a trainer serves a value from its worker's read table without
  // checking the lease (a worker declared dead keeps serving).
  kLocalReadsIgnoreLease,
  // C8: the coordinator grants a read lease to a worker with a replica
  // that is not up to date (a step that leaves it behind commits under it).
  kStaleWorkersLeased,
  // C8: a worker keeps serving local reads while its step is resolved (the
  // old value after another host's trainer heard the new one).
  kStepsNotSuspended,
  // C8: a worker whose replica sits out an open step gets a read lease once
  // it is up to date again, before the step commits (found by the
  // simulator, seed 1939).
  kBehindLeasedMidStep,
  // C8: a delete that did not reach a live holder is acknowledged while
  // that holder may still serve the variable from its read table.
  kDeletesNotWaited,
};

inline constexpr std::string_view kSeededBugNames[] = {
    "none",
    "returned_replicas_trusted",
    "groups_reused_across_restarts",
    "queued_broadcast_waits_another_timeout",
    "fences_ignored",
    "verify_ignores_checksums",
    "retries_reapplied",
    "no_roll_forward",
    "answered_before_sync",
    "not_verified_at_recovery",
    "listed_under_writes",
    "attempts_overlap",
    "digests_unchecked",
    "install_over_moved_replicas",
    "refusals_forgotten",
    "local_reads_ignore_lease",
    "stale_workers_leased",
    "steps_not_suspended",
    "behind_leased_mid_step",
    "deletes_not_waited",
};

namespace seeded_bug_internal {
inline std::atomic<int> seeded{0};
}  // namespace seeded_bug_internal

inline bool BugSeeded(SeededBug bug) {
  return seeded_bug_internal::seeded.load(std::memory_order_relaxed) == static_cast<int>(bug);
}

// For the simulator only.
inline void SeedBug(SeededBug bug) {
  seeded_bug_internal::seeded.store(static_cast<int>(bug), std::memory_order_relaxed);
}

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_SEEDED_BUG_H_

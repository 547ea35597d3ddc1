// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_MEMBERSHIP_H_
#define REPVAR_SERVER_MEMBERSHIP_H_

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/model/topology.h"

namespace repvar::server {

struct MembershipOptions {
  // A worker silent for longer is declared dead (T5).
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // job -> number of tasks expected (tasks 0..n-1); WaitForTopology waits for them.
  std::map<std::string, int32_t> expected_tasks;
};

// Who is in the cluster. Workers register with an incarnation and heartbeat;
// the coordinator's ticker calls CheckHeartbeats(now). Every membership change
// bumps the topology version (T4). Accelerator ordinals are the sorted order
// of all live accelerator devices (T2), compared field by field, numbers
// numerically.
//
// Per (job, task):
//
//     (absent) --Register(inc)--> LIVE(inc) --silent > timeout--> (absent)
//                                    |  ^
//                                    '--'  Register(same inc): idempotent
//                                          Register(other inc): ABORTED
//
// Thread-safe (a monitor); never calls out while holding its lock.
class Membership {
 public:
  Membership(MembershipOptions options, Clock* clock);

  // T1. Errors: INVALID_ARGUMENT (empty or malformed job/address/device,
  // duplicate device, device of another task, incarnation 0, same incarnation
  // with other devices), ABORTED ((job, task) live under another incarnation).
  // Nothing changes on error. Returns the topology version.
  absl::StatusOr<int64_t> Register(const WorkerRegistration& reg) ABSL_LOCKS_EXCLUDED(mu_);

  // Errors: NOT_FOUND (unknown or declared-dead task: re-register), ABORTED
  // (stale incarnation).
  absl::StatusOr<int64_t> Heartbeat(const TaskKey& key, uint64_t incarnation)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Declares dead every task silent for longer than the timeout at `now`,
  // frees its slot and bumps the version. Returns the dead tasks.
  std::vector<LiveTask> CheckHeartbeats(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  TopologySnapshot Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until the version exceeds `after_version` or `deadline` passes;
  // returns the snapshot either way.
  TopologySnapshot WaitForChange(int64_t after_version, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every expected task is live (T4). Errors: DEADLINE_EXCEEDED
  // naming the missing tasks.
  absl::StatusOr<TopologySnapshot> WaitForExpected(absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);

  std::optional<LiveTask> Find(const TaskKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

  const MembershipOptions& options() const { return options_; }

 private:
  TopologySnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> MissingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MembershipOptions options_;
  Clock* const clock_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  std::map<TaskKey, LiveTask> tasks_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_MEMBERSHIP_H_

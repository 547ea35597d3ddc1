// SPDX-License-Identifier: Apache-2.0
// The coordinator's storage in the simulation: a StateLog whose records
// stay in memory across the coordinator's crashes, as a disk does. An
// append is kept at once but is durable only after a sync, which takes
// simulated time and covers everything appended before it began (group
// commit); a crash keeps the synced records and a random prefix of the
// rest (a torn tail: a record written but not synced may or may not be
// there). Faults: ENOSPC (CheckRoom and Append refuse) and EIO on a sync,
// which stops the coordinator (a durable log never answers after a failed
// sync).
#ifndef REPVAR_SIM_DISK_H_
#define REPVAR_SIM_DISK_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/time/time.h"
#include "common/base/sync.h"
#include "server/core/cluster_state.h"
#include "server/core/state_log.h"
#include "sim/random.h"
#include "sim/scheduler.h"

namespace repvar::sim {

struct DiskFaults {
  absl::Duration min_sync = absl::Microseconds(100);
  absl::Duration max_sync = absl::Milliseconds(3);
  bool full = false;      // ENOSPC
  double sync_error = 0;  // EIO, per sync
};

class Disk final : public server::StateLog {
 public:
  // `on_sync_error` runs on the syncing thread when a sync fails: it must
  // stop the process (the thread does not come back).
  Disk(Scheduler* scheduler, Random* random, std::function<void()> on_sync_error)
      : s_(scheduler), random_(random), on_sync_error_(std::move(on_sync_error)) {}

  void SetFaults(DiskFaults f) { faults_ = f; }

  // The coordinator's process died: what survives is the synced records
  // and a random number of the ones after them.
  void Crash();

  // Every record appended, in order, and how many are synced: the state
  // they give is the coordinator's as it would recover it.
  const std::vector<server::Record>& records() const { return records_; }
  uint64_t synced() const { return synced_; }
  // Called with each record as it is appended (under the registry's lock,
  // in commit order): the world's mirror of the applied state.
  void OnAppend(std::function<void(const server::Record&)> f) { on_append_ = std::move(f); }

  // server::StateLog
  absl::StatusOr<uint64_t> Append(server::Record& record) override;
  absl::Status Durable(uint64_t position) override;
  bool IsDurable(uint64_t position) override { return position <= synced_; }
  absl::Status CheckRoom(uint64_t value_bytes) override;
  absl::Status Recover(server::ClusterState& state) override;

 private:
  Scheduler* const s_;
  Random* const random_;
  const std::function<void()> on_sync_error_;
  std::function<void(const server::Record&)> on_append_;
  DiskFaults faults_;
  std::vector<server::Record> records_;
  uint64_t synced_ = 0;
  Mutex mu_;  // for waiting on a sync under way
  bool syncing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_DISK_H_

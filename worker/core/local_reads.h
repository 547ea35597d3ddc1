// SPDX-License-Identifier: Apache-2.0
// The worker's half of local reads (docs/architecture.md, "Local reads"):
// keeps the local read table that trainers on this host map, so that a
// committed value is readable there only while it is known committed and
// the coordinator's read lease holds.
//
//   a value is      readable   published with its committed version
//                   to confirm  held, not known committed: asked about on
//                               the next heartbeat
//
//   coordinator write applied     -> to confirm  (before it is acknowledged)
//   heartbeat confirms it         -> readable    (if the replica still holds it)
//   registration lost             -> nothing readable, everything to confirm
//
// and for a step, the whole table at once (LocalReadTable::Suspend, O(1)):
//
//   step reported                 -> nothing served (before the report leaves)
//   step installed                -> served again: what it changed readable
//                                    (or to confirm), the rest as before it
//   step over, not installed      -> served again: what it held to confirm
//
// The lease is the heartbeat's: from when it was sent, for as long as the
// coordinator granted. Thread-safe.
#ifndef REPVAR_WORKER_CORE_LOCAL_READS_H_
#define REPVAR_WORKER_CORE_LOCAL_READS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/time/time.h"
#include "common/base/sync.h"
#include "common/model/replica_write.h"
#include "common/tensor/local_read_table.h"
#include "worker/core/replica_store.h"

namespace repvar::worker {

class LocalReads final : public ReplicaListener {
 public:
  // `region`: the table's memory, zeroed (LocalReadTableBytes);
  // `monotonic_ns`: CLOCK_MONOTONIC in nanoseconds, as the trainers read it.
  LocalReads(std::span<std::byte> region, size_t slots, const ReplicaStore* store,
             std::function<int64_t()> monotonic_ns);

  // ReplicaListener: a coordinator's write was applied (and is not
  // acknowledged yet), or a variable dropped.
  void Written(const std::vector<ReplicaWrite>& items) override ABSL_LOCKS_EXCLUDED(mu_);
  void Dropped(uint64_t variable_id) override ABSL_LOCKS_EXCLUDED(mu_);

  // Steps, one at a time: from before the report leaves until the step is
  // over, nothing in the table is served.
  void Suspend() ABSL_LOCKS_EXCLUDED(mu_);
  // A value the step committed.
  struct Committed {
    uint64_t variable_id = 0;
    int64_t version = 0;
    uint64_t checksum = 0;
  };
  // The step installed its values: each of `changed` is readable if the
  // local replica holds exactly that now, else to confirm; `unsure`
  // (repaired here) is to confirm; the rest stay as before the step, which
  // left their values alone. Served again.
  void Resume(const std::vector<Committed>& changed, const std::vector<uint64_t>& unsure)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The step is over. Not resumed (it failed, or how it ended is not known
  // here): every variable it held here, `held()`, is to confirm. Served
  // again.
  void EndStep(const std::function<std::vector<uint64_t>()>& held) ABSL_LOCKS_EXCLUDED(mu_);

  // Heartbeats: what to ask about, from when.
  struct Round {
    int64_t sent_ns = 0;
    std::vector<HeldValue> held;
  };
  Round StartRound(size_t max = kMaxHeldValuesPerHeartbeat) ABSL_LOCKS_EXCLUDED(mu_);
  // The coordinator's answer to `round`.
  void Granted(const Round& round, absl::Duration lease, const std::vector<bool>& confirmed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // This worker is not registered (declared dead, fenced): nothing is
  // readable, every held value is to confirm.
  void Lost() ABSL_LOCKS_EXCLUDED(mu_);

  size_t readable() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t to_confirm() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Publishes what the local replica of `id` holds if it is (version,
  // checksum); false if it is not (or cannot be kept).
  bool PublishHeld(uint64_t id, int64_t version, std::optional<uint64_t> checksum)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `id` is not readable and is to confirm.
  void Unconfirmed(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReplicaStore* const store_;
  const std::function<int64_t()> monotonic_ns_;
  mutable Mutex mu_;
  LocalReadTable table_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<uint64_t> to_confirm_ ABSL_GUARDED_BY(mu_);
  uint64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;  // where the next round starts
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_LOCAL_READS_H_

// SPDX-License-Identifier: Apache-2.0
// Where records go before they are applied (Registry::Commit), and where
// they come back from at startup: the seam between the coordinator's state
// and its storage (server/store/rocks_state_log.h keeps it in RocksDB,
// synced before any answer), so that no caller knows which it is.
//
// Group commit: a record is appended (in order, under the registry's lock,
// not yet synced), applied, and only then waited for, outside the lock:
//
//   writer A: Append(r1)=1  Apply  unlock  Durable(1) --sync(1..3)--> answer
//   writer B:        Append(r2)=2  Apply  unlock  Durable(2) ---------^ answer
//   reader C:               ... saw position 3 ...  Durable(3) -------^ answer
//
// so writers that wait together share one sync, and nobody is answered
// with state a crash could take back.
#ifndef REPVAR_SERVER_CORE_STATE_LOG_H_
#define REPVAR_SERVER_CORE_STATE_LOG_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/cluster_state.h"
#include "server/core/record.h"

namespace repvar::server {

// Thread-safe. The registry calls Append, Applied and Recover under its
// lock, which keeps the records in commit order; every other method is
// called from any thread, with no lock held.
class StateLog {
 public:
  virtual ~StateLog() = default;
  // Keeps `record` after every record appended before it and returns its
  // position (1, 2, ... in this process). It need not be durable yet:
  // Durable(position) waits for that. An error means the record was not
  // kept: it is not applied and the caller's request fails with that error.
  // A log that keeps values in files may replace a tensor the record
  // carries with the same bytes as they are on disk (a mapping of the
  // file), so that the state applied holds no copy of them in memory.
  virtual absl::StatusOr<uint64_t> Append(Record& record) = 0;
  // Returns once every record up to `position` would survive a crash or a
  // power loss. Thread-safe, called without the registry's mutex: callers
  // waiting at the same time share one sync. An error: those records may
  // be lost (a durable log stops the process before returning one, unless
  // a test asked it not to).
  virtual absl::Status Durable(uint64_t position) {
    (void)position;
    return absl::OkStatus();
  }
  // Whether Durable(position) would return at once, with every record up
  // to `position` durable: for a caller that must not wait (one on gRPC's
  // callback thread) and waits elsewhere otherwise. Thread-safe, never
  // waits. A log that cannot tell says false.
  virtual bool IsDurable(uint64_t position) {
    (void)position;
    return false;
  }
  // Whether a record carrying `value_bytes` of tensor values would fit now.
  // A write asks before it sends anything to any worker, so that a full
  // disk refuses it (RESOURCE_EXHAUSTED) with nothing changed anywhere
  // rather than after the workers took it. It may make room first (a
  // durable log deletes the files it keeps for reuse).
  virtual absl::Status CheckRoom(uint64_t value_bytes) {
    (void)value_bytes;
    return absl::OkStatus();
  }
  // A value a record will carry soon: a durable log may start writing it
  // now, while the workers take it, so that Append only has to sync the
  // record. Called without the registry's mutex, from any thread; a failure
  // here only means Append writes it itself.
  virtual absl::Status Stage(const Tensor& value) {
    (void)value;
    return absl::OkStatus();
  }
  // Whether the bytes of a value this log handed back (through Append or
  // Recover) are what was kept: a value mapped from a file is checked at
  // its first use, not at startup. DATA_LOSS names the file and the offset
  // of the damage; the value must then not be served. Any thread, no lock.
  virtual absl::Status Check(const Tensor& value) {
    (void)value;
    return absl::OkStatus();
  }
  // Check's answer when it needs no pass over the bytes (they were checked
  // before, or need no check); nullopt when it would read them. Any thread,
  // no lock, no I/O.
  virtual std::optional<absl::Status> CheckIfKnown(const Tensor& value) {
    (void)value;
    return absl::OkStatus();
  }
  // After `record` was applied: the state it produced. A log may save it as
  // a checkpoint and forget the records before it.
  virtual void Applied(const ClusterState& state) { (void)state; }
  // Loads into `state` (empty) what an earlier run kept: the last checkpoint,
  // then every record after it, applied in order. Errors: DATA_LOSS (a
  // checkpoint, record or value that cannot be read back as written), and
  // what the storage reports; `state` is then to be discarded.
  virtual absl::Status Recover(ClusterState& state) {
    (void)state;
    return absl::OkStatus();
  }
};

// Keeps nothing: the coordinator's state lives in memory only and a restart
// forgets it (--ephemeral). Counts what it was given.
class VolatileStateLog final : public StateLog {
 public:
  absl::StatusOr<uint64_t> Append(Record&) override { return ++records_; }
  bool IsDurable(uint64_t) override { return true; }  // Durable never waits
  uint64_t records() const { return records_; }

 private:
  uint64_t records_ = 0;
};

// Keeps every record in memory, in order: for tests that replay them, or
// that restart a coordinator on them (Recover applies them all). Remembers
// how far it was asked to be durable, so that a test can restart on what a
// power loss would have left (Synced()).
class MemoryStateLog final : public StateLog {
 public:
  MemoryStateLog() = default;
  explicit MemoryStateLog(std::vector<Record> records) : records_(std::move(records)) {}

  absl::StatusOr<uint64_t> Append(Record& record) override {
    records_.push_back(record);
    return records_.size();
  }
  absl::Status Durable(uint64_t position) override {  // any thread
    uint64_t seen = synced_.load();
    while (seen < position && !synced_.compare_exchange_weak(seen, position)) {
    }
    return absl::OkStatus();
  }
  bool IsDurable(uint64_t) override { return true; }  // Durable never waits
  absl::Status Recover(ClusterState& state) override {
    for (const Record& r : records_) state.Apply(r);
    return absl::OkStatus();
  }
  const std::vector<Record>& records() const { return records_; }
  // The records up to the last position anyone waited for.
  std::vector<Record> Synced() const {
    return std::vector<Record>(records_.begin(),
                               records_.begin() + static_cast<long>(synced_.load()));
  }

 private:
  std::vector<Record> records_;
  std::atomic<uint64_t> synced_{0};
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_STATE_LOG_H_

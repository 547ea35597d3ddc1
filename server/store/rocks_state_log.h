// SPDX-License-Identifier: Apache-2.0
// The coordinator's state on disk: a StateLog in RocksDB, with checkpoints.
//
//   <data_dir>/db      RocksDB (its LOCK keeps a second coordinator out)
//     "format"              "repvar-state 1"
//     "l/" <seq, 8 bytes BE> one record (disk::Record), written before it
//                           is applied and synced before any answer
//     "c/meta"              the last checkpoint: counters and the last
//                           sequence it includes
//     "c/w/", "c/v/", "c/o/" its workers, variables and recorded answers
//   <data_dir>/blobs   tensors of more than 16 KiB (BlobStore), synced
//                      before the record that names them; the state holds
//                      them as mappings of these files, not in memory
//
// Startup (Recover) loads the checkpoint and applies the records after it,
// then writes a new checkpoint. A checkpoint is one WriteBatch that replaces
// the old one and deletes the records it includes; blobs no longer named are
// deleted after it is synced.
//
// Failures: no room for a change (free space below the reserve, or RocksDB
// reporting no space) fails it with RESOURCE_EXHAUSTED before anything is
// applied; any other write or sync error is fatal: the process stops, and a
// restart recovers what was synced (docs/architecture.md, "Durability", fsyncgate). RocksDB
// tolerates a torn tail of its write-ahead log (the record was never
// acknowledged) and refuses anything else (kTolerateCorruptedTailRecords);
// a damaged blob or record is DATA_LOSS naming it, and the coordinator does
// not start.
//
// Group commit (StateLog): Append writes the record to RocksDB's
// write-ahead log without syncing it, under the registry's lock (one thread
// at a time, in commit order); Durable, from any thread, waits for a sync
// of the log covering the position. One waiter at a time syncs (SyncWAL,
// which does not block writers) everything appended so far, the others
// wait for it and find themselves covered, or sync the next group:
//
//   appended  1 2 3 4 5 6
//   durable   0 ----sync(..3)----> 3 ----sync(..6)----> 6
#ifndef REPVAR_SERVER_STORE_ROCKS_STATE_LOG_H_
#define REPVAR_SERVER_STORE_ROCKS_STATE_LOG_H_

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/state_log.h"
#include "server/store/blob_store.h"

namespace repvar::server {

struct RocksStateLogOptions {
  std::string dir;  // the data dir
  // Where files go; null: the local file system. Tests pass one that
  // injects faults or loses what was not synced.
  std::shared_ptr<rocksdb::FileSystem> fs;
  // A checkpoint after this many records, or once this many bytes of values
  // went to blob files since the last one: only a checkpoint frees the
  // blobs of the values records replaced, so without the byte bound a large
  // variable assigned again and again would hold every old value on disk
  // (and as much page cache) until the next checkpoint; and freed blobs are
  // what new values are written over (BlobStoreOptions::recycle_bytes).
  uint64_t checkpoint_every = 4096;
  uint64_t checkpoint_blob_bytes = uint64_t{256} << 20;
  // A change that would leave less free space in the data dir is refused.
  uint64_t min_free_bytes = uint64_t{64} << 20;
  BlobStoreOptions blobs;
  // false: nothing is synced. Only for the negative control of the
  // power-loss tests, which must then lose acknowledged records.
  bool sync = true;
  // A storage failure after which memory and disk may disagree. Null: log
  // it and abort the process. A test whose file system lost its power sets
  // one that notes it; the change then fails and nothing is applied.
  std::function<void(const absl::Status&)> on_fatal;
};

class RocksStateLog final : public StateLog {
 public:
  // Opens (or creates) the data dir. Errors: FAILED_PRECONDITION (another
  // process holds it; a format this build does not read), DATA_LOSS (RocksDB
  // reports corruption), INTERNAL (I/O).
  static absl::StatusOr<std::unique_ptr<RocksStateLog>> Open(RocksStateLogOptions options);
  ~RocksStateLog() override;

  // Errors: RESOURCE_EXHAUSTED (no room), FAILED_PRECONDITION (before
  // Recover). Other storage errors stop the process.
  absl::Status Stage(const Tensor& value) override { return blobs_.Stage(value); }
  absl::Status CheckRoom(uint64_t value_bytes) override;
  // Values in blob files come back as mappings of them (BlobStore).
  absl::StatusOr<uint64_t> Append(Record& record) override;
  absl::Status Durable(uint64_t position) override;
  bool IsDurable(uint64_t position) override;
  absl::Status Check(const Tensor& value) override { return blobs_.Check(value); }
  std::optional<absl::Status> CheckIfKnown(const Tensor& value) override {
    return blobs_.CheckIfKnown(value);
  }
  void Applied(const ClusterState& state) override;
  absl::Status Recover(ClusterState& state) override;

  struct Stats {
    uint64_t records = 0;      // appended by this process
    uint64_t replayed = 0;     // applied by Recover after the checkpoint
    uint64_t checkpoints = 0;  // written by this process
    uint64_t last_sequence = 0;
    uint64_t blobs_written = 0;
    uint64_t blobs_reused = 0;  // of blobs_written: over a recycled file
    uint64_t syncs = 0;         // of the write-ahead log by Durable (group commits)
  };
  Stats stats() const;

 private:
  RocksStateLog(RocksStateLogOptions options, std::shared_ptr<rocksdb::FileSystem> fs,
                std::unique_ptr<rocksdb::Env> env);
  // Free space for `bytes` above the reserve; recycled blob files are
  // deleted first when they are what is missing.
  absl::Status CheckSpace(uint64_t bytes);
  // Replaces the values `record` keeps in blob files with their mappings.
  void MapValues(Record& record);
  absl::Status WriteCheckpoint(const ClusterState& state);
  // The next checkpoint's record and blob-byte counts start now.
  void CountFromHere();
  // Everything up to `position` is on disk (recovered, or under a synced
  // checkpoint).
  void MarkDurable(uint64_t position) ABSL_LOCKS_EXCLUDED(sync_mu_);
  absl::Status LoadCheckpoint(ClusterStateData& data, uint64_t& last_sequence);
  // The process stops here unless options_.on_fatal returns; then `s`.
  absl::Status Fatal(absl::Status s);

  const RocksStateLogOptions options_;
  const std::shared_ptr<rocksdb::FileSystem> fs_;
  const std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<rocksdb::DB> db_;
  BlobStore blobs_;
  bool recovered_ = false;
  bool needs_resume_ = false;  // RocksDB stopped writes after running out of space
  uint64_t next_sequence_ = 1;
  uint64_t since_checkpoint_ = 0;
  uint64_t blob_bytes_at_checkpoint_ = 0;  // blobs_.blob_bytes_written() then
  Stats stats_;

  // Group commit. appended_: the last position written (by Append, under
  // the registry's lock). durable_: the last one synced.
  mutable absl::Mutex sync_mu_;
  uint64_t appended_ ABSL_GUARDED_BY(sync_mu_) = 0;
  uint64_t durable_ ABSL_GUARDED_BY(sync_mu_) = 0;
  bool syncing_ ABSL_GUARDED_BY(sync_mu_) = false;  // a waiter is in SyncWAL
  absl::Status sync_failed_ ABSL_GUARDED_BY(sync_mu_);
  uint64_t syncs_ ABSL_GUARDED_BY(sync_mu_) = 0;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_STORE_ROCKS_STATE_LOG_H_

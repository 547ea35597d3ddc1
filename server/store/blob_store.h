// SPDX-License-Identifier: Apache-2.0
// The tensors of the coordinator's records, in files of its data dir:
//
//   <dir>/<xxh3 of the bytes, 16 hex>-<byte size>.bin
//
// named by their content, so that a value written twice is one file. A blob
// is written to "tmp-<name>", synced, renamed to its name, and the directory
// synced before the record that names it is written (docs/architecture.md, "Durability");
// a blob that no record or checkpoint names is garbage (CollectGarbage), a
// record whose blob is missing or damaged is DATA_LOSS, reported with the
// file and the offset of the damage (each chunk of a blob has its checksum
// in the record). Tensors of at most `inline_bytes` stay inline in the
// record instead.
//
// The coordinator's copy of a value lives on disk, not in memory: a value
// whose blob is synced is held as a read-only mapping of the file (Mapped,
// and Load at startup), so its bytes come through the page cache when they
// are read and memory holds no copy. Startup maps blobs without reading
// them (a restart stays fast whatever the values weigh); their bytes are
// checked against the recorded chunk checksums at first use (Check), and a
// damaged blob is never served.
//
// Garbage is recycled: a garbage blob of at least `recycle_min_bytes` that
// nothing maps is renamed to "free-<n>" (up to `recycle_bytes` of them, the
// oldest deleted first), and the next blob of the same size is written over
// it (ReuseWritableFile, no truncation) instead of into a new file. Writing
// into pages the page cache holds costs a copy; a new file costs fresh
// memory, many times the copy.
// A blob someone still maps is deleted instead (its inode lives on under
// the mapping), so no reader ever sees its bytes change. Recycled files
// give their room back when a change needs it (DropRecycled).
//
// Every file operation goes through a rocksdb::FileSystem, the same one the
// state log's RocksDB uses, so a test's fault-injecting file system sees
// both (mappings read the file the FileSystem wrote). Keep, Load, Mapped
// and CollectGarbage are called under the registry's lock; Stage, Check
// and Describe from any thread.
#ifndef REPVAR_SERVER_STORE_BLOB_STORE_H_
#define REPVAR_SERVER_STORE_BLOB_STORE_H_

#include <rocksdb/file_system.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/store/state_codec.h"

namespace repvar::server {

struct BlobStoreOptions {
  uint64_t inline_bytes = 16 << 10;
  uint64_t chunk_bytes = 4 << 20;
  // Sync files and the directory (false: only the negative control of the
  // power-loss tests, which must then lose data).
  bool sync = true;
  // With `sync`, a blob being written has its pages handed to the disk
  // every this many bytes (sync_file_range(SYNC_FILE_RANGE_WRITE), through
  // FSWritableFile::RangeSync), so that the disk writes while the rest is
  // copied and the sync at the end waits for the tail only. It promises
  // nothing: only the sync makes a blob durable. 0: none.
  uint64_t range_sync_bytes = 8 << 20;
  // Hold values in blob files as mappings of them (false: in memory, read
  // and checked whole at Load). Only with `sync`: an unsynced file may yet
  // lose the bytes under its mapping.
  bool map_values = true;
  // Garbage blobs kept to be overwritten by new blobs of the same size (0:
  // garbage is deleted); smaller ones are always deleted.
  uint64_t recycle_bytes = uint64_t{1} << 30;
  uint64_t recycle_min_bytes = 1 << 20;
};

class BlobStore final : public TensorFiles {
 public:
  BlobStore(rocksdb::FileSystem* fs, std::string dir, BlobStoreOptions options);

  // Creates the directory, removes the tmp files a crash left and takes up
  // the recycled files an earlier run left (up to recycle_bytes).
  absl::Status Open();

  absl::Status Keep(const Tensor& t, disk::TensorRef* ref) override;
  // A blob is mapped, its size checked now and its bytes at first Check
  // (read and checked whole without map_values).
  absl::StatusOr<std::shared_ptr<const Tensor>> Load(const disk::TensorRef& ref) override;

  // `t`, kept before, as the mapping of its blob file: the same bytes
  // without a copy in memory. `t` itself when it is inline or values are
  // not mapped.
  absl::StatusOr<std::shared_ptr<const Tensor>> Mapped(std::shared_ptr<const Tensor> t);
  // Whether the bytes of `t` are what was kept: a mapping Load made is
  // checked against its chunk checksums at the first call (the answer is
  // remembered). DATA_LOSS names the file and the offset of the damage.
  // Tensors in memory are OK (they were checked as they arrived).
  absl::Status Check(const Tensor& t);
  // Check's answer when it needs no pass over the bytes (checked before, or
  // not a mapping Load made); nullopt when it would read them.
  std::optional<absl::Status> CheckIfKnown(const Tensor& t);

  // Fills `ref` for a tensor kept before (its blob, if it has one, is on
  // disk and synced): no I/O, and no pass over a mapped value's bytes.
  void Describe(const Tensor& t, disk::TensorRef* ref);
  // The blob file `t` is kept in; empty when it is kept inline.
  std::string BlobNameOf(const Tensor& t) const;

  // Writes `t`'s blob now, if it has one, so that a record carrying it
  // later finds it on disk (Keep then only syncs the directory): a write
  // stages its value while the workers take it. Thread-safe with Keep and
  // CollectGarbage (a staged blob collected before its record is written is
  // simply written again by Keep).
  absl::Status Stage(const Tensor& t);
  // Recycles or deletes every blob whose name is not in `live` (files being
  // written are left alone); returns how many.
  absl::StatusOr<int> CollectGarbage(const absl::flat_hash_set<std::string>& live);
  // Deletes the recycled files (a change needs their room); returns their
  // bytes.
  uint64_t DropRecycled();
  // Bytes of recycled files held now.
  uint64_t recycled_bytes() const;

  // The bytes `Keep` would put in a blob file for `t` (0: inline).
  uint64_t BlobBytes(const Tensor& t) const {
    return t.bytes.size() > options_.inline_bytes ? t.bytes.size() : 0;
  }
  const std::string& dir() const { return dir_; }
  uint64_t blobs_written() const { return blobs_written_.load(); }
  uint64_t blob_bytes_written() const { return blob_bytes_written_.load(); }
  // Blobs written over a recycled file (of blobs_written).
  uint64_t blobs_reused() const { return blobs_reused_.load(); }

 private:
  // What is known of a blob file: its chunk checksums, and whether its
  // bytes were checked against them.
  struct BlobInfo {
    uint64_t chunk_bytes = 0;
    std::vector<uint64_t> sums;
    enum class Checked { kNo, kGood, kDamaged } checked = Checked::kNo;
    absl::Status damage;  // kDamaged: what was found
  };
  // A garbage file kept for reuse.
  struct Recycled {
    std::string path;
    uint64_t size = 0;
  };
  absl::Status Write(const std::string& name, const Tensor& t);
  // Opens `tmp` for writing: over a recycled file of `size` bytes if there
  // is one (`reused` says so), else a new file.
  absl::Status OpenForWrite(const std::string& tmp, uint64_t size,
                            std::unique_ptr<rocksdb::FSWritableFile>* file, bool* reused);
  // Keeps the garbage blob `name` for reuse, or deletes it (when it is
  // mapped, small, or recycling is off). Returns whether it was there.
  absl::StatusOr<bool> Recycle(const std::string& name, uint64_t size, bool mapped);
  // Whether a freed file of `size` bytes is kept for reuse.
  bool Recyclable(uint64_t size) const {
    return size >= options_.recycle_min_bytes && size <= options_.recycle_bytes;
  }
  // Adds `r` to the recycled files, deleting the oldest beyond the bound.
  absl::Status KeepRecycled(Recycled r) ABSL_LOCKS_EXCLUDED(mu_);
  // Remembers that `t` maps the blob `name`.
  void TrackMapping(const std::string& name, const std::shared_ptr<const Tensor>& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SyncDir();
  // The chunk checksums of `t`'s bytes, as a blob of chunk_bytes chunks
  // (not yet checked against the file).
  BlobInfo Summarize(const Tensor& t) const;
  absl::StatusOr<std::shared_ptr<const Tensor>> ReadWhole(const disk::TensorRef& ref,
                                                          const std::string& path,
                                                          const TensorSpec& spec);
  bool mapping() const { return options_.map_values && options_.sync; }

  rocksdb::FileSystem* const fs_;
  const std::string dir_;
  const BlobStoreOptions options_;
  std::atomic<uint64_t> blobs_written_{0};
  std::atomic<uint64_t> blob_bytes_written_{0};
  std::atomic<uint64_t> blobs_reused_{0};
  std::atomic<uint64_t> tmp_serial_{0};  // tmp and free names unique across writers
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, BlobInfo> known_ ABSL_GUARDED_BY(mu_);  // by blob name
  // The mappings handed out (Load, Mapped), by blob name; expired ones are
  // pruned as new ones come.
  absl::flat_hash_map<std::string, std::vector<std::weak_ptr<const Tensor>>> mappings_
      ABSL_GUARDED_BY(mu_);
  std::deque<Recycled> recycled_ ABSL_GUARDED_BY(mu_);  // oldest first
  uint64_t recycled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// An I/O status as an absl::Status naming `what`: RESOURCE_EXHAUSTED for no
// space, DATA_LOSS for corruption, INTERNAL for the rest.
absl::Status FromIo(const rocksdb::Status& s, absl::string_view what);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_STORE_BLOB_STORE_H_

// SPDX-License-Identifier: Apache-2.0
// The tensors of the coordinator's records, in files of its data dir:
//
//   <dir>/<xxh3 of the bytes, 16 hex>-<byte size>.bin
//
// named by their content, so that a value written twice is one file. A blob
// is written to "tmp-<name>", synced, renamed to its name, and the directory
// synced before the record that names it is written (RELIABILITY.md §2.1);
// a blob that no record or checkpoint names is garbage (CollectGarbage), a
// record whose blob is missing or damaged is DATA_LOSS, reported with the
// file and the offset of the damage (each chunk of a blob has its checksum
// in the record). Tensors of at most `inline_bytes` stay inline in the
// record instead.
//
// Every file operation goes through a rocksdb::FileSystem, the same one the
// state log's RocksDB uses, so a test's fault-injecting file system sees
// both. Not thread-safe: the state log calls it under the registry's lock.
#ifndef REPVAR_SERVER_STORE_BLOB_STORE_H_
#define REPVAR_SERVER_STORE_BLOB_STORE_H_

#include <rocksdb/file_system.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "server/store/state_codec.h"

namespace repvar::server {

struct BlobStoreOptions {
  uint64_t inline_bytes = 16 << 10;
  uint64_t chunk_bytes = 4 << 20;
  // Sync files and the directory (false: only the negative control of the
  // power-loss tests, which must then lose data).
  bool sync = true;
};

class BlobStore final : public TensorFiles {
 public:
  BlobStore(rocksdb::FileSystem* fs, std::string dir, BlobStoreOptions options);

  // Creates the directory and removes the tmp files a crash left.
  absl::Status Open();

  absl::Status Keep(const Tensor& t, disk::TensorRef* ref) override;
  absl::StatusOr<std::shared_ptr<const Tensor>> Load(const disk::TensorRef& ref) override;

  // Fills `ref` for a tensor kept before (its blob, if it has one, is on
  // disk and synced): no I/O.
  void Describe(const Tensor& t, disk::TensorRef* ref) const;
  // The blob file `t` is kept in; empty when it is kept inline.
  std::string BlobNameOf(const Tensor& t) const;

  // Writes `t`'s blob now, if it has one, so that a record carrying it
  // later finds it on disk (Keep then only syncs the directory): a write
  // stages its value while the workers take it. Thread-safe with Keep and
  // CollectGarbage (a staged blob collected before its record is written is
  // simply written again by Keep).
  absl::Status Stage(const Tensor& t);
  // Deletes every blob whose name is not in `live` (files being written are
  // left alone); returns how many.
  absl::StatusOr<int> CollectGarbage(const absl::flat_hash_set<std::string>& live);

  // The bytes `Keep` would put in a blob file for `t` (0: inline).
  uint64_t BlobBytes(const Tensor& t) const {
    return t.bytes.size() > options_.inline_bytes ? t.bytes.size() : 0;
  }
  const std::string& dir() const { return dir_; }
  uint64_t blobs_written() const { return blobs_written_.load(); }

 private:
  absl::Status Write(const std::string& name, const Tensor& t);
  absl::Status SyncDir();

  rocksdb::FileSystem* const fs_;
  const std::string dir_;
  const BlobStoreOptions options_;
  std::atomic<uint64_t> blobs_written_{0};
  std::atomic<uint64_t> tmp_serial_{0};  // tmp names unique across writers
};

// An I/O status as an absl::Status naming `what`: RESOURCE_EXHAUSTED for no
// space, DATA_LOSS for corruption, INTERNAL for the rest.
absl::Status FromIo(const rocksdb::Status& s, absl::string_view what);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_STORE_BLOB_STORE_H_

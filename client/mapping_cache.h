// SPDX-License-Identifier: Apache-2.0
// Mappings of a worker's shared buffers (memfds), kept from one lease to the
// next. A worker lends the same few buffers step after step (its pool: the
// buffer a trainer wrote becomes the value, the value it replaced the next
// write lease), so a trainer that keeps their mappings touches warm pages.
// A fresh mapping's first touch of each page costs far more than the copy
// into it (a hypervisor may build its page tables on first touch even after
// MAP_POPULATE; bench/README.md has the figures).
//
// An entry is the whole file, mapped shared, keyed by the file's identity
// (st_dev, st_ino) and the access (read-only or read-write: a read lease
// never gets a writable view). A cached mapping keeps its file alive, so
// while it is cached no other file can take its inode number: an open fd
// whose (st_dev, st_ino) matches an entry is that entry's file. Bounded in
// bytes: past the bound, the least recently used entries that no lease
// holds are unmapped. Capacity 0 caches nothing (every lease maps and
// unmaps). Thread-safe.
#ifndef REPVAR_CLIENT_MAPPING_CACHE_H_
#define REPVAR_CLIENT_MAPPING_CACHE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace repvar {

class MappingCache {
 public:
  explicit MappingCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}
  // Unmaps everything: no lease may outlive its client.
  ~MappingCache();
  MappingCache(const MappingCache&) = delete;
  MappingCache& operator=(const MappingCache&) = delete;

  // A shared mapping of the file open at `fd` (at least `size` bytes of it;
  // `fd` stays the caller's), from the cache or fresh, held until Release.
  // Errors: RESOURCE_EXHAUSTED (mmap failed), OUT_OF_RANGE (the file is
  // shorter than `size`), INTERNAL (fstat failed).
  absl::StatusOr<std::byte*> Acquire(int fd, size_t size, bool writable) ABSL_LOCKS_EXCLUDED(mu_);
  // The caller is done with a mapping Acquire returned.
  void Release(std::byte* data) ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    size_t mapped_bytes = 0;
    size_t entries = 0;
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Key = std::tuple<dev_t, ino_t, bool>;
  struct Entry {
    Key key;
    std::byte* data = nullptr;
    size_t length = 0;
    int holders = 0;
  };
  // The entry of `key` of `length` bytes, now held and most recently used;
  // nullptr when there is none.
  std::byte* Hold(const Key& key, size_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps unheld entries, least recently used first, while over capacity.
  void Trim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  std::map<Key, std::list<Entry>::iterator> by_key_ ABSL_GUARDED_BY(mu_);
  std::map<const std::byte*, std::list<Entry>::iterator> by_data_ ABSL_GUARDED_BY(mu_);
  size_t mapped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace repvar

#endif  // REPVAR_CLIENT_MAPPING_CACHE_H_

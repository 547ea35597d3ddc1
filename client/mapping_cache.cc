// SPDX-License-Identifier: Apache-2.0
#include "client/mapping_cache.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace repvar {

MappingCache::~MappingCache() {
  absl::MutexLock lock(&mu_);
  for (const Entry& e : lru_) munmap(e.data, e.length);
}

absl::StatusOr<std::byte*> MappingCache::Acquire(int fd, size_t size, bool writable) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat of a worker's buffer: ", std::strerror(errno)));
  }
  const auto length = static_cast<size_t>(st.st_size);
  if (length < size) {
    return absl::OutOfRangeError(
        absl::StrCat("the worker's buffer holds ", length, " bytes; the lease names ", size));
  }
  const Key key{st.st_dev, st.st_ino, writable};
  {
    absl::MutexLock lock(&mu_);
    if (std::byte* data = Hold(key, length)) return data;
  }
  void* p = mmap(nullptr, length, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", length, " bytes: ", std::strerror(errno)));
  }
  absl::MutexLock lock(&mu_);
  if (std::byte* data = Hold(key, length)) {  // another thread mapped it meanwhile
    munmap(p, length);
    return data;
  }
  ++misses_;
  lru_.push_front(Entry{key, static_cast<std::byte*>(p), length, 1});
  by_data_[lru_.front().data] = lru_.begin();
  mapped_ += length;
  // An entry under the same key of another length (the file changed size:
  // not done by workers, whose memfds are sized once) stays reachable through
  // by_data_ until it is released; the key now names the fresh one.
  by_key_[key] = lru_.begin();
  Trim();
  return lru_.front().data;
}

std::byte* MappingCache::Hold(const Key& key, size_t length) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second->length != length) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
  ++it->second->holders;
  ++hits_;
  return it->second->data;
}

void MappingCache::Release(std::byte* data) {
  absl::MutexLock lock(&mu_);
  auto it = by_data_.find(data);
  if (it == by_data_.end()) return;
  --it->second->holders;
  Trim();
}

void MappingCache::Trim() {
  for (auto it = lru_.end(); mapped_ > capacity_ && it != lru_.begin();) {
    --it;
    if (it->holders > 0) continue;
    munmap(it->data, it->length);
    mapped_ -= it->length;
    if (auto k = by_key_.find(it->key); k != by_key_.end() && k->second == it) by_key_.erase(k);
    by_data_.erase(it->data);
    it = lru_.erase(it);
  }
}

MappingCache::Stats MappingCache::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{hits_, misses_, mapped_, lru_.size()};
}

}  // namespace repvar

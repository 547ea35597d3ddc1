// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_RPC_SHARED_REGION_H_
#define REPVAR_WORKER_RPC_SHARED_REGION_H_

#include <cstddef>
#include <span>

#include "absl/status/statusor.h"

namespace repvar::worker {

// Zeroed memory in a memfd that other processes of the host map through
// /proc/<pid>/fd/<fd> (the local read table). Pages are taken as they are
// first written. Not copyable.
class SharedRegion {
 public:
  // Errors: RESOURCE_EXHAUSTED, INTERNAL.
  static absl::StatusOr<SharedRegion> Create(size_t bytes);
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&&) = delete;
  SharedRegion(const SharedRegion&) = delete;
  ~SharedRegion();

  std::span<std::byte> bytes() const { return {data_, size_}; }
  int fd() const { return fd_; }

 private:
  SharedRegion(std::byte* data, size_t size, int fd) : data_(data), size_(size), fd_(fd) {}
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_RPC_SHARED_REGION_H_

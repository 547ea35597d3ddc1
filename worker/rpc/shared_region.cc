// SPDX-License-Identifier: Apache-2.0
#include "worker/rpc/shared_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace repvar::worker {

absl::StatusOr<SharedRegion> SharedRegion::Create(size_t bytes) {
  const int fd = memfd_create("repvar-local-reads", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("ftruncate: ", std::strerror(err)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(err)));
  }
  return SharedRegion(static_cast<std::byte*>(p), bytes, fd);
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : data_(other.data_), size_(other.size_), fd_(other.fd_) {
  other.data_ = nullptr;
  other.fd_ = -1;
}

SharedRegion::~SharedRegion() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace repvar::worker

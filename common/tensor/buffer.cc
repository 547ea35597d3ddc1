// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/buffer.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace repvar {
namespace {

constexpr size_t kAlign = 64;
// Below this a buffer comes from plain malloc, 16-byte aligned (as every
// element type needs): glibc's aligned allocation splits a larger block on
// every call, which a batch of many small values pays for each.
constexpr size_t kAlignedMinBytes = 4096;
constexpr size_t kMmapThreshold = 2 << 20;
// Below this, one madvise costs about what faulting the pages in does.
constexpr size_t kPopulateMinBytes = 64 << 10;
// What PrefaultHeap makes resident at most: below malloc's mmap threshold.
constexpr size_t kPrefaultMaxBytes = 16 << 20;

}  // namespace

namespace {

// Large mappings released by Buffers, kept resident for reuse: a variable
// rewritten again and again then costs no page faults (bench/README.md: the
// first touch of a page costs more than the copy into it). Bounded in bytes;
// the oldest mapping goes first. Thread-safe.
class MappingPool {
 public:
  static MappingPool& Get() {
    static MappingPool* pool = new MappingPool();
    return *pool;
  }
  struct Mapping {
    void* p = nullptr;
    size_t mapped = 0;
    int fd = -1;  // a memfd for shared mappings, else -1
    std::chrono::steady_clock::time_point released;
  };
  // A released mapping of `mapped` bytes of the same kind, or p == nullptr.
  Mapping Take(size_t mapped, bool shared) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->mapped == mapped && (it->fd >= 0) == shared) {
        Mapping m = *it;
        free_.erase(it);
        held_ -= mapped;
        return m;
      }
    }
    return Mapping{};
  }
  void Give(Mapping m) {
    std::vector<Mapping> evict;
    m.released = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(m);
      held_ += m.mapped;
      while (held_ > cap_ && !free_.empty()) {
        evict.push_back(free_.front());
        held_ -= free_.front().mapped;
        free_.erase(free_.begin());
      }
    }
    Unmap(evict);
  }
  // free_ is oldest first: the idle ones are a prefix.
  size_t ReleaseIdle(std::chrono::steady_clock::duration idle) {
    const auto before = std::chrono::steady_clock::now() - idle;
    std::vector<Mapping> evict;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!free_.empty() && free_.front().released <= before) {
        evict.push_back(free_.front());
        bytes += free_.front().mapped;
        held_ -= free_.front().mapped;
        free_.erase(free_.begin());
      }
    }
    Unmap(evict);
    return bytes;
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  void SetCap(size_t cap) {
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = cap;
  }

 private:
  static void Unmap(const std::vector<Mapping>& mappings) {
    for (const Mapping& e : mappings) {
      munmap(e.p, e.mapped);
      if (e.fd >= 0) close(e.fd);
    }
  }

  std::mutex mu_;
  std::vector<Mapping> free_;  // oldest first
  size_t held_ = 0;
  size_t cap_ = size_t{1} << 30;
};

size_t RoundToHugePage(size_t n) {
  return (n + kMmapThreshold - 1) / kMmapThreshold * kMmapThreshold;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; Debian 12's headers predate it
#endif

// Makes the pages of [p, p + n) resident and writable in one call
// (MADV_POPULATE_WRITE) rather than one fault per page on first touch;
// where the kernel lacks it, touches every page. The contents are
// unchanged: one call costs less than a fault per page, for huge pages and
// 4 KiB pages alike.
void PopulateForWrite(void* p, size_t n) {
  if (n == 0) return;
  constexpr uintptr_t kPage = 4096;
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) / kPage * kPage;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n + kPage - 1) / kPage * kPage;
  if (madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE) == 0) return;
  volatile char* c = static_cast<char*>(p);
  for (size_t off = 0; off < n; off += kPage) c[off] = c[off];
  c[n - 1] = c[n - 1];
}

}  // namespace

void SetBufferPoolCapacity(size_t bytes) { MappingPool::Get().SetCap(bytes); }

size_t ReleaseIdleBuffers(absl::Duration idle) {
  const size_t released = MappingPool::Get().ReleaseIdle(absl::ToChronoNanoseconds(idle));
  if (released > 0) malloc_trim(0);
  return released;
}

size_t PooledBufferBytes() { return MappingPool::Get().held(); }

absl::StatusOr<Buffer> Buffer::MapFile(const std::string& path, size_t size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    std::string message = absl::StrCat("open ", path, ": ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("stat ", path, ": ", std::strerror(e)));
  }
  if (static_cast<uint64_t>(st.st_size) != size) {
    close(fd);
    return absl::DataLossError(absl::StrCat(path, " has ", st.st_size, " bytes, not ", size));
  }
  Buffer b;
  if (size == 0) {
    close(fd);
    return b;
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("map ", path, ": ", std::strerror(e)));
  }
  b.data_ = static_cast<std::byte*>(p);
  b.size_ = size;
  b.mapped_ = size;
  b.file_ = true;
  return b;
}

absl::StatusOr<Buffer> Buffer::Allocate(size_t size) {
  Buffer b;
  if (size == 0) return b;
  if (size >= kMmapThreshold) {
    size_t mapped = RoundToHugePage(size);
    void* p = MappingPool::Get().Take(mapped, /*shared=*/false).p;
    if (p == nullptr) {
      p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes"));
      }
      madvise(p, mapped, MADV_HUGEPAGE);
      // Pre-fault now, with huge pages where the kernel gives them, so that
      // the hot path later copies into resident memory.
      PopulateForWrite(p, mapped);
    }
    b.data_ = static_cast<std::byte*>(p);
    b.mapped_ = mapped;
    b.touched_ = mapped;
  } else if (size < kAlignedMinBytes) {
    b.data_ = static_cast<std::byte*>(::operator new(size, std::nothrow));
    if (b.data_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes"));
    }
    b.touched_ = size;
  } else {
    b.data_ = static_cast<std::byte*>(::operator new(size, std::align_val_t(kAlign), std::nothrow));
    if (b.data_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes"));
    }
    b.touched_ = size;
  }
  b.size_ = size;
  return b;
}

absl::StatusOr<Buffer> Buffer::AllocateUntouched(size_t size) {
  if (size < kMmapThreshold) return Allocate(size);
  Buffer b;
  const size_t mapped = RoundToHugePage(size);
  void* p = MappingPool::Get().Take(mapped, /*shared=*/false).p;
  if (p != nullptr) {
    b.touched_ = mapped;  // resident already
  } else {
    // NORESERVE: an announced size commits no memory until it is touched.
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes"));
    }
    madvise(p, mapped, MADV_HUGEPAGE);
  }
  b.data_ = static_cast<std::byte*>(p);
  b.mapped_ = mapped;
  b.size_ = size;
  return b;
}

size_t Buffer::Prefault(size_t upto) {
  if (file_) return 0;  // read-only; its pages come from the file
  const size_t end = std::min(mapped_ > 0 ? mapped_ : size_, (upto + 4095) / 4096 * 4096);
  if (end <= touched_) return 0;
  PopulateForWrite(data_ + touched_, end - touched_);
  const size_t added = end - touched_;
  touched_ = end;
  return added;
}

absl::StatusOr<Buffer> Buffer::AllocateShared(size_t size) {
  Buffer b;
  const size_t mapped = RoundToHugePage(std::max<size_t>(size, 1));
  MappingPool::Mapping m = MappingPool::Get().Take(mapped, /*shared=*/true);
  if (m.p == nullptr) {
    m.fd = memfd_create("repvar-tensor", MFD_CLOEXEC);
    if (m.fd < 0) return absl::ResourceExhaustedError("memfd_create failed");
    if (ftruncate(m.fd, static_cast<off_t>(mapped)) != 0) {
      close(m.fd);
      return absl::ResourceExhaustedError(absl::StrCat("cannot size a ", mapped, "-byte memfd"));
    }
    // MAP_POPULATE: the pages exist (and are resident) before anyone writes.
    m.p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, m.fd, 0);
    if (m.p == MAP_FAILED) {
      close(m.fd);
      return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " shared bytes"));
    }
    m.mapped = mapped;
  }
  b.data_ = static_cast<std::byte*>(m.p);
  b.mapped_ = m.mapped;
  b.touched_ = m.mapped;
  b.fd_ = m.fd;
  b.size_ = size;
  return b;
}

void Buffer::Release() {
  if (data_ == nullptr) return;
  if (file_) {
    munmap(data_, mapped_);
  } else if (mapped_ > 0) {
    MappingPool::Get().Give({data_, mapped_, fd_});
  } else if (size_ < kAlignedMinBytes) {
    ::operator delete(data_);
  } else {
    ::operator delete(data_, std::align_val_t(kAlign));
  }
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
  touched_ = 0;
  fd_ = -1;
  file_ = false;
}

Buffer::~Buffer() { Release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      touched_(std::exchange(other.touched_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      file_(std::exchange(other.file_, false)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    touched_ = std::exchange(other.touched_, 0);
    fd_ = std::exchange(other.fd_, -1);
    file_ = std::exchange(other.file_, false);
  }
  return *this;
}

void ReserveForBulk(std::vector<std::byte>& v, size_t n) {
  if (n <= v.capacity()) return;
  v.reserve(n);  // allocates; touches only what `v` already held
  if (n < kMmapThreshold) return;
  // The whole huge pages inside [data, data + n).
  const auto start = reinterpret_cast<uintptr_t>(v.data());
  const uintptr_t first = RoundToHugePage(start);
  const uintptr_t end = (start + n) / kMmapThreshold * kMmapThreshold;
  if (end > first) madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
}

void MakeRoomResident(std::vector<std::byte>& v, size_t upto) {
  upto = std::min(upto, v.capacity());
  if (upto <= v.size() || upto - v.size() < kPopulateMinBytes) return;
  PopulateForWrite(v.data() + v.size(), upto - v.size());
}

void AssignBulk(std::vector<std::byte>& v, std::span<const std::byte> bytes) {
  v.clear();
  ReserveForBulk(v, bytes.size());
  MakeRoomResident(v, bytes.size());
  v.assign(bytes.begin(), bytes.end());
}

void PrefaultHeap(size_t bytes) {
  if (bytes < kPopulateMinBytes) return;
  // Beyond malloc's mmap threshold (TuneMallocForBulkTransfers) a block is a
  // mapping of its own, which free() unmaps: nothing would be kept.
  bytes = std::min(bytes, kPrefaultMaxBytes);
  void* p = std::malloc(bytes);
  if (p == nullptr) return;
  PopulateForWrite(p, bytes);
  std::free(p);
}

void TuneMallocForBulkTransfers() {
  // Keep large blocks (gRPC's message buffers) in the heap instead of fresh
  // mappings, and do not hand freed memory straight back to the kernel.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest value glibc accepts
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace repvar

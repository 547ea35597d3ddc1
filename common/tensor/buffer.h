// SPDX-License-Identifier: Apache-2.0
// Resident byte buffers for tensors. The first touch of a fresh page costs
// more than copying into it (bench/README.md), so large buffers are pre-faulted
// mappings that go back to a pool when released and are reused.
#ifndef REPVAR_COMMON_TENSOR_BUFFER_H_
#define REPVAR_COMMON_TENSOR_BUFFER_H_

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace repvar {

// The pool keeps up to this many bytes (default 1 GiB) of released mappings.
void SetBufferPoolCapacity(size_t bytes);
// Unmaps released mappings that no allocation took back within `idle`: a
// daemon that stopped writing gives their memory back to the system (a
// daemon calls it now and then). When it unmapped any, the heap's free
// memory (message buffers of the same burst) goes back too (malloc_trim).
// Returns the bytes unmapped.
size_t ReleaseIdleBuffers(absl::Duration idle);
// Bytes of released mappings the pool holds now.
size_t PooledBufferBytes();
// Makes `bytes` of this thread's heap resident in one call and frees them
// again, so that the many small allocations that follow (a batch of small
// replicas) reuse resident memory instead of faulting fresh pages in one at
// a time. Needs the heap not to give freed memory back
// (TuneMallocForBulkTransfers); below 64 KiB it does nothing, and it
// populates at most 16 MiB (however many writes a message names).
void PrefaultHeap(size_t bytes);
// mallopt settings that keep big message buffers resident (bench/README.md);
// daemons call it first thing in main().
void TuneMallocForBulkTransfers();
// Reserves room for `n` bytes in `v` (which the caller then fills); when
// that takes a fresh block of 2 MiB or more, asks the kernel for huge pages
// in it (MADV_HUGEPAGE on the whole huge pages inside) before anything
// touches it: faulting 4 KiB pages in one at a time costs far more than
// copying the bytes. For a value handed to a caller in a std::vector (a
// read).
void ReserveForBulk(std::vector<std::byte>& v, size_t n);
// Makes the reserved room of `v` from its end up to `upto` bytes (at most
// its capacity) resident in one call before bytes are copied into it:
// cheaper than faulting each page in on first touch, for 4 KiB and huge
// pages alike. Call it as the bytes arrive (a chunk ahead), not for an
// announced size.
void MakeRoomResident(std::vector<std::byte>& v, size_t upto);
// Makes `v` a copy of `bytes` (in hand, not announced): room reserved as
// ReserveForBulk does, made resident in one call, then filled; each byte is
// written once.
void AssignBulk(std::vector<std::byte>& v, std::span<const std::byte> bytes);

// A resident byte buffer, 64-byte aligned from 4 KiB up (smaller ones 16,
// malloc's, which every element type needs). Large buffers are mapped with
// MADV_HUGEPAGE and pre-faulted once. Not thread-safe; movable.
class Buffer {
 public:
  Buffer() = default;
  // Errors: RESOURCE_EXHAUSTED when memory cannot be had.
  static absl::StatusOr<Buffer> Allocate(size_t size);
  // The same in a shared mapping of a memfd (shared_fd()), which another
  // process on the host can map through /proc/<pid>/fd/<fd>: how trainers
  // reach a worker's replicas without copying through a socket. Pre-faulted
  // and pooled like large buffers.
  static absl::StatusOr<Buffer> AllocateShared(size_t size);
  // The same as Allocate, but a large buffer's pages are not touched yet
  // (a released mapping from the pool is reused as it is): for bytes that
  // are still to arrive, so that a peer announcing N bytes costs memory only
  // as it sends them. Touch them with Prefault() as they come.
  static absl::StatusOr<Buffer> AllocateUntouched(size_t size);
  // A read-only, shared mapping of the first `size` bytes of the file at
  // `path`, which must have exactly that size (the bytes stay on disk and
  // come into memory through the page cache as they are read; the mapping
  // holds no file descriptor). Writing through data() faults. Errors:
  // NOT_FOUND (no such file), DATA_LOSS (another size), INTERNAL.
  static absl::StatusOr<Buffer> MapFile(const std::string& path, size_t size);
  // Whether the bytes are a mapping of a file (MapFile).
  bool file_backed() const { return file_; }
  // Touches the pages up to `upto` bytes (rounded up to a page) that are not
  // yet; returns how many bytes that newly made resident (0 when none).
  size_t Prefault(size_t upto);
  // Bytes from the start whose pages are resident (all of a small buffer).
  size_t touched() const { return touched_; }
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() { return {data_, size_}; }
  std::span<const std::byte> span() const { return {data_, size_}; }
  int shared_fd() const { return fd_; }  // -1 unless from AllocateShared

 private:
  void Release();
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;   // > 0 when mmap'ed
  size_t touched_ = 0;  // pages below this are resident
  int fd_ = -1;         // the memfd of a shared buffer
  bool file_ = false;   // a MapFile mapping: unmapped, never pooled
};

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_BUFFER_H_

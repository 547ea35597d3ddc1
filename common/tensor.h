// SPDX-License-Identifier: Apache-2.0
// Tensors as repvar moves them: a dtype, a shape, and a flat little-endian
// row-major byte buffer that stays resident. Also checksums (XXH3-64) and the
// assembler that turns an ordered chunk stream back into a tensor.
#ifndef REPVAR_COMMON_TENSOR_H_
#define REPVAR_COMMON_TENSOR_H_

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "repvar/dtype.h"

namespace repvar {

constexpr int kMaxRank = 32;
// No single chunk exceeds this (messages stay far below 32 MiB).
constexpr size_t kMaxChunkBytes = 4 << 20;
constexpr size_t kDefaultChunkBytes = 1 << 20;

// Errors: INVALID_ARGUMENT for an unknown value.
absl::StatusOr<DType> DTypeFromInt(int value);
size_t ItemSize(DType dtype);
const char* DTypeName(DType dtype);
bool IsFloating(DType dtype);

struct TensorSpec {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> dims;

  // Number of elements, overflow-checked. Errors: INVALID_ARGUMENT for a
  // negative dim, rank above kMaxRank, or a size that does not fit in int64.
  absl::StatusOr<int64_t> NumElements() const;
  absl::StatusOr<int64_t> ByteSize() const;
  std::string ToString() const;  // "float32[2,3]"
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

uint64_t Checksum(std::span<const std::byte> bytes);

// Large buffers come from mappings kept resident for reuse, up to this many
// bytes (default 1 GiB) of released mappings.
void SetBufferPoolCapacity(size_t bytes);
// mallopt settings that keep big message buffers resident (BENCHMARKS.md);
// daemons call it first thing in main().
void TuneMallocForBulkTransfers();

// A resident, 64-byte aligned byte buffer. Large buffers are mapped with
// MADV_HUGEPAGE and pre-faulted once, because the first touch of a fresh page
// costs more than the copy itself (BENCHMARKS.md). Not thread-safe.
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
  size_t mapped_ = 0;  // > 0 when mmap'ed
  int fd_ = -1;        // the memfd of a shared buffer
};

// An immutable-once-built tensor value with its checksum. Shared between
// readers through shared_ptr<const Tensor>.
struct Tensor {
  TensorSpec spec;
  Buffer bytes;
  uint64_t checksum = 0;

  // A zero-filled tensor of `spec`. Errors: as TensorSpec::ByteSize, plus
  // RESOURCE_EXHAUSTED.
  static absl::StatusOr<Tensor> Zeros(const TensorSpec& spec);
  // A tensor of `spec` whose bytes the caller is about to overwrite
  // entirely (no clearing pass; checksum left 0). Errors: as Zeros.
  static absl::StatusOr<Tensor> ForOverwrite(const TensorSpec& spec);
  // Copies `data`; checks its length. Computes the checksum.
  static absl::StatusOr<Tensor> FromBytes(const TensorSpec& spec, std::span<const std::byte> data);
  void UpdateChecksum() { checksum = Checksum(bytes.span()); }
};

// Rebuilds a tensor from a header and chunks that arrive in order; verifies
// every chunk checksum and, at Finish(), the whole-tensor checksum and length.
// On any error the partial tensor is dropped by the caller: nothing has been
// published. Not thread-safe.
class ChunkAssembler {
 public:
  // Errors: INVALID_ARGUMENT for a bad spec or a byte_size that does not
  // match it; RESOURCE_EXHAUSTED when byte_size exceeds `max_bytes`.
  static absl::StatusOr<ChunkAssembler> Start(const TensorSpec& spec, uint64_t byte_size,
                                              uint64_t checksum, uint64_t max_bytes);
  ChunkAssembler(ChunkAssembler&&) = default;
  ChunkAssembler& operator=(ChunkAssembler&&) = default;
  ~ChunkAssembler();

  // Errors: INVALID_ARGUMENT when the chunk is out of order, overruns the
  // tensor, is larger than kMaxChunkBytes or fails its checksum.
  absl::Status Add(uint64_t offset, std::span<const std::byte> data, uint64_t checksum);
  // Errors: INVALID_ARGUMENT when bytes are missing or the whole-tensor
  // checksum differs.
  absl::StatusOr<Tensor> Finish();

 private:
  ChunkAssembler() = default;
  Tensor tensor_;
  uint64_t expected_checksum_ = 0;
  uint64_t received_ = 0;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_{nullptr, &XXH3_freeState};
};

// Calls `fn(offset, span)` for each chunk of `bytes` in order.
template <typename Fn>
void ForEachChunk(std::span<const std::byte> bytes, size_t chunk_bytes, Fn&& fn) {
  if (chunk_bytes == 0 || chunk_bytes > kMaxChunkBytes) chunk_bytes = kDefaultChunkBytes;
  if (bytes.empty()) return;
  for (size_t off = 0; off < bytes.size(); off += chunk_bytes) {
    size_t n = std::min(chunk_bytes, bytes.size() - off);
    fn(static_cast<uint64_t>(off), bytes.subspan(off, n));
  }
}

// Index of the first NaN/Inf element, or -1. Integers are always finite.
int64_t FirstNonFinite(const Tensor& t);
// Elementwise a + sign*b into a new tensor (f16/bf16 computed in f32 and rounded
// to nearest even). Errors: FAILED_PRECONDITION if specs differ.
absl::StatusOr<Tensor> AddScaled(const Tensor& a, const Tensor& b, int sign);

// IEEE half / bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// Stores `v` (computed in double) at element `i` in the tensor's dtype.
void StoreElement(Tensor& t, int64_t i, double v);
double LoadElement(const Tensor& t, int64_t i);

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_H_

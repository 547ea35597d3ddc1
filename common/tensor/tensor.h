// SPDX-License-Identifier: Apache-2.0
// Tensors as repvar moves them: a dtype, a shape, and a flat little-endian
// row-major byte buffer that stays resident, with its XXH3-64 checksum.
#ifndef REPVAR_COMMON_TENSOR_TENSOR_H_
#define REPVAR_COMMON_TENSOR_TENSOR_H_

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor/buffer.h"
#include "common/tensor/dtype.h"
#include "repvar/types.h"

namespace repvar {

constexpr int kMaxRank = 32;
// No single chunk exceeds this (messages stay far below 32 MiB).
constexpr size_t kMaxChunkBytes = 4 << 20;
constexpr size_t kDefaultChunkBytes = 1 << 20;

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

// What a chunk stream announces before its bytes.
struct TensorHeader {
  TensorSpec spec;
  uint64_t byte_size = 0;
  uint64_t checksum = 0;  // of all byte_size bytes
};

// Whether `byte_size` is what `spec` takes: a header's size is not covered
// by any checksum, so a receiver checks it before making room for it.
// Errors: INVALID_ARGUMENT (a bad spec, or another size).
absl::Status CheckByteSize(const TensorSpec& spec, uint64_t byte_size);

// XXH3-64 (seed 0) of `bytes`: the checksum of chunks and whole tensors.
// Through libxxhash's runtime dispatch, which picks the widest vector unit
// the CPU has. Same value on every CPU.
uint64_t Checksum(std::span<const std::byte> bytes);

// The same checksum over bytes that arrive in pieces (streams, blocks hashed
// while they are in cache). Not thread-safe.
class ChecksumStream {
 public:
  ChecksumStream();
  void Update(std::span<const std::byte> bytes);
  void Update(const void* data, size_t n) { Update({static_cast<const std::byte*>(data), n}); }
  uint64_t Digest() const;
  void Reset();

 private:
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
};

// The checksums of a tensor's chunks as a receiver verified them: chunk i
// is bytes [i * chunk_bytes, (i + 1) * chunk_bytes), the last one shorter
// when the size says so. Empty (chunk_bytes 0) when not known.
struct ChunkChecksums {
  uint64_t chunk_bytes = 0;
  std::vector<uint64_t> sums;
};

// An immutable-once-built tensor value with its checksum. Shared between
// readers through shared_ptr<const Tensor>.
struct Tensor {
  TensorSpec spec;
  Buffer bytes;
  uint64_t checksum = 0;
  // Kept by ChunkAssembler::Finish when every chunk came with a checksum it
  // verified and the chunks were even; a daemon that sends the same chunks
  // on sends those sums without hashing the bytes again (ChunkChecksum).
  // The next receiver verifies each chunk all the same.
  ChunkChecksums chunk_checksums;

  // A zero-filled tensor of `spec`. Errors: as TensorSpec::ByteSize, plus
  // RESOURCE_EXHAUSTED.
  static absl::StatusOr<Tensor> Zeros(const TensorSpec& spec);
  // A tensor of `spec` whose bytes the caller is about to overwrite
  // entirely (no clearing pass; checksum left 0); `shared`: in a shared
  // memfd mapping (Buffer::AllocateShared). Errors: as Zeros.
  static absl::StatusOr<Tensor> ForOverwrite(const TensorSpec& spec, bool shared = false);
  // Copies `data`; checks its length. Computes the checksum.
  static absl::StatusOr<Tensor> FromBytes(const TensorSpec& spec, std::span<const std::byte> data);
  // After the bytes were written: their checksum, and no chunk sums.
  void UpdateChecksum() {
    checksum = Checksum(bytes.span());
    chunk_checksums = {};
  }
  // The checksum of bytes [offset, offset + size): the kept one when that
  // range is one of `chunk_checksums`' chunks, else hashed now.
  uint64_t ChunkChecksum(uint64_t offset, size_t size) const;
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

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_TENSOR_H_

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_TENSOR_CHUNK_ASSEMBLER_H_
#define REPVAR_COMMON_TENSOR_CHUNK_ASSEMBLER_H_

#include <xxhash.h>

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"

namespace repvar {

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
  static absl::StatusOr<ChunkAssembler> Start(const TensorHeader& header, uint64_t max_bytes) {
    return Start(header.spec, header.byte_size, header.checksum, max_bytes);
  }
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

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_CHUNK_ASSEMBLER_H_

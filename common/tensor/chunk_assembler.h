// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_TENSOR_CHUNK_ASSEMBLER_H_
#define REPVAR_COMMON_TENSOR_CHUNK_ASSEMBLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/base/memory_budget.h"
#include "common/tensor/tensor.h"

namespace repvar {

// Rebuilds a tensor from a header and chunks that arrive in order; verifies
// every chunk checksum and, at Finish(), the whole-tensor checksum and length.
// A checksum of 0 (kChecksumNotGiven) is a sender's "not given": that check
// is skipped, and the tensor's checksum is computed here (the end-to-end
// check then starts at this receiver; docs/wire.md).
// On any error the partial tensor is dropped by the caller: nothing has been
// published. Not thread-safe.
//
// When every chunk came with a checksum and all but the last had the same
// size, the tensor keeps the verified chunk sums (Tensor::chunk_checksums):
// sending it on in chunks of that size hashes nothing again.
//
// Memory follows the bytes, not the header: the buffer for the announced
// size is mapped but untouched (Buffer::AllocateUntouched), and its pages
// are made resident a little ahead of the chunks as they arrive, charged to
// the budget (if any) until Finish() hands the tensor over or the assembler
// is dropped. A header announcing 1 GiB followed by nothing costs nothing.
//
// Where the bytes go (one copy each, from wherever `fill` finds them):
//   Start      a buffer of the assembler's own, handed over by Finish();
//   StartInto  memory the caller owns, of exactly the announced size (a
//              framework's parameter storage), or a vector the caller owns,
//              sized chunk by chunk as the bytes arrive (a read's answer);
//              FinishInPlace() checks the whole. The caller keeps it alive,
//              and leaves it alone, while the assembler lives.
// The checks are the same for every destination, but for one: StartInto
// is for reads, whose senders (repvar's daemons) give every checksum, so a
// 0 there is checked like any other value, not taken as "not given".
inline constexpr uint64_t kChecksumNotGiven = 0;

class ChunkAssembler {
 public:
  // Errors: INVALID_ARGUMENT for a bad spec or a byte_size that does not
  // match it; RESOURCE_EXHAUSTED when byte_size exceeds `max_bytes`.
  static absl::StatusOr<ChunkAssembler> Start(const TensorSpec& spec, uint64_t byte_size,
                                              uint64_t checksum, uint64_t max_bytes,
                                              MemoryBudget* budget = nullptr);
  static absl::StatusOr<ChunkAssembler> Start(const TensorHeader& header, uint64_t max_bytes,
                                              MemoryBudget* budget = nullptr) {
    return Start(header.spec, header.byte_size, header.checksum, max_bytes, budget);
  }
  // Into `out`. Errors: as Start's, and INVALID_ARGUMENT when `out` is not
  // the header's byte size (nothing written).
  static absl::StatusOr<ChunkAssembler> StartInto(const TensorHeader& header,
                                                  std::span<std::byte> out);
  // Into `*grow`, emptied, with room reserved for the announced size: mapped
  // by the allocator, made resident only as the bytes arrive (a chunk
  // ahead). Errors: as Start's (RESOURCE_EXHAUSTED above `max_bytes`, or
  // when the room cannot be reserved).
  static absl::StatusOr<ChunkAssembler> StartInto(const TensorHeader& header,
                                                  std::vector<std::byte>* grow, uint64_t max_bytes);
  ChunkAssembler(ChunkAssembler&&) = default;
  ChunkAssembler& operator=(ChunkAssembler&&) = default;
  ~ChunkAssembler();

  // Errors: INVALID_ARGUMENT when the chunk is out of order, overruns the
  // tensor, is larger than kMaxChunkBytes or fails its checksum;
  // RESOURCE_EXHAUSTED when the budget has no room for its bytes.
  absl::Status Add(uint64_t offset, std::span<const std::byte> data, uint64_t checksum);
  // The same for a chunk of `size` bytes that `fill` writes into the span it
  // is given (where the bytes go in the tensor: one copy from wherever they
  // lie, in pieces if need be). The checksum is checked on what `fill` wrote,
  // while it is in cache; a chunk refused leaves nothing received.
  absl::Status Add(uint64_t offset, size_t size, uint64_t checksum,
                   absl::FunctionRef<void(std::span<std::byte>)> fill);
  // Errors: INVALID_ARGUMENT when bytes are missing or the whole-tensor
  // checksum differs; FAILED_PRECONDITION after StartInto (the bytes are the
  // caller's: FinishInPlace).
  absl::StatusOr<Tensor> Finish();
  // After StartInto: the same checks; returns the value's checksum (computed
  // here when the header gave none). FAILED_PRECONDITION after Start.
  absl::StatusOr<uint64_t> FinishInPlace();
  // The memory being filled, and how many bytes from its start are in place:
  // a reader of bytes()[0, received()) may run beside the next Add when
  // something orders the two (the buffer stays where it is through Finish
  // and in the tensor Finish returns).
  std::span<std::byte> bytes();
  uint64_t received() const { return received_; }
  // The memory charged for the tensor, for the caller to hold while it holds
  // the tensor (else it is released when the assembler goes).
  MemoryCharge TakeCharge() { return std::move(charge_); }

 private:
  ChunkAssembler() = default;
  // StartInto's assembler of `header`'s value, before its destination is set.
  static ChunkAssembler InPlace(const TensorHeader& header);
  // Where the next `size` bytes go, made resident (and charged) ahead of them.
  absl::StatusOr<std::span<std::byte>> Room(uint64_t size);
  // The whole value's checks; its checksum.
  absl::StatusOr<uint64_t> CheckWhole() const;

  Tensor tensor_;          // the spec, and with Start the bytes
  uint64_t size_ = 0;      // the announced byte size
  bool in_place_ = false;  // StartInto: `into_` or `grow_`
  std::span<std::byte> into_;
  std::vector<std::byte>* grow_ = nullptr;
  uint64_t expected_checksum_ = 0;
  uint64_t received_ = 0;
  MemoryCharge charge_;
  ChecksumStream hash_;
  // The chunk sums verified so far; nullopt once they cannot be kept.
  std::optional<ChunkChecksums> sums_ = ChunkChecksums{};
};

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_CHUNK_ASSEMBLER_H_

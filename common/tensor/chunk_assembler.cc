// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/chunk_assembler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"

namespace repvar {

absl::StatusOr<ChunkAssembler> ChunkAssembler::Start(const TensorSpec& spec, uint64_t byte_size,
                                                     uint64_t checksum, uint64_t max_bytes,
                                                     MemoryBudget* budget) {
  REPVAR_RETURN_IF_ERROR(CheckByteSize(spec, byte_size));
  if (byte_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor of ", byte_size, " bytes exceeds the limit of ", max_bytes));
  }
  auto buf = Buffer::AllocateUntouched(byte_size);
  if (!buf.ok()) return buf.status();
  ChunkAssembler a;
  a.charge_ = MemoryCharge(budget);
  // A small buffer is resident at once; charge it now.
  if (absl::Status s = a.charge_.Add(buf->touched(), "a tensor being received"); !s.ok()) {
    return s;
  }
  a.tensor_.spec = spec;
  a.tensor_.bytes = *std::move(buf);
  a.expected_checksum_ = checksum;
  return a;
}

ChunkAssembler::~ChunkAssembler() = default;

absl::Status ChunkAssembler::Add(uint64_t offset, std::span<const std::byte> data,
                                 uint64_t checksum) {
  return Add(offset, data.size(), checksum,
             [&](std::span<std::byte> out) { std::memcpy(out.data(), data.data(), data.size()); });
}

absl::Status ChunkAssembler::Add(uint64_t offset, size_t size, uint64_t checksum,
                                 absl::FunctionRef<void(std::span<std::byte>)> fill) {
  if (offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk out of order: offset ", offset, ", expected ", received_));
  }
  if (size > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", size, " bytes exceeds ", kMaxChunkBytes));
  }
  if (size == 0) return absl::InvalidArgumentError("empty chunk");
  if (size > tensor_.bytes.size() - received_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk at ", offset, " of ", size,
                                                   " bytes overruns the tensor of ",
                                                   tensor_.bytes.size(), " bytes"));
  }
  // Make the pages resident a little ahead of the bytes (fewer, larger
  // steps), never more than a few chunks past what has arrived.
  Buffer& buf = tensor_.bytes;
  const uint64_t want = received_ + size;
  if (want > buf.touched()) {
    const uint64_t ahead = std::min<uint64_t>(buf.size(), want + 3 * size);
    const uint64_t page_end = (ahead + 4095) / 4096 * 4096;
    REPVAR_RETURN_IF_ERROR(charge_.Add(page_end - std::min<uint64_t>(page_end, buf.touched()),
                                       "a tensor being received"));
    buf.Prefault(ahead);
  }
  // Past `received_` until checked: a refused chunk is not part of the tensor.
  const std::span<std::byte> out = buf.span().subspan(received_, size);
  fill(out);
  if (checksum != kChecksumNotGiven && Checksum(out) != checksum) {
    return absl::InvalidArgumentError(absl::StrCat("checksum mismatch in chunk at ", offset));
  }
  hash_.Update(out);
  received_ += size;
  // Kept only while the chunks are even: a chunk after a shorter one, a
  // larger one or one without a checksum ends it.
  if (sums_) {
    if (sums_->chunk_bytes == 0) sums_->chunk_bytes = size;
    if (checksum != kChecksumNotGiven && size <= sums_->chunk_bytes &&
        offset == sums_->sums.size() * sums_->chunk_bytes) {
      sums_->sums.push_back(checksum);
    } else {
      sums_.reset();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ChunkAssembler::Finish() {
  if (received_ != tensor_.bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor truncated: got ", received_, " of ", tensor_.bytes.size(), " bytes"));
  }
  uint64_t sum = hash_.Digest();
  if (expected_checksum_ != kChecksumNotGiven && sum != expected_checksum_) {
    return absl::InvalidArgumentError(absl::StrCat("tensor checksum mismatch: header says ",
                                                   expected_checksum_, ", bytes give ", sum));
  }
  tensor_.checksum = sum;
  if (sums_) tensor_.chunk_checksums = *std::move(sums_);
  return std::move(tensor_);
}

}  // namespace repvar

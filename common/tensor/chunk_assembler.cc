// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/chunk_assembler.h"

#include <algorithm>
#include <cstring>
#include <exception>

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
  a.size_ = byte_size;
  a.expected_checksum_ = checksum;
  return a;
}

ChunkAssembler ChunkAssembler::InPlace(const TensorHeader& header) {
  ChunkAssembler a;
  a.tensor_.spec = header.spec;
  a.size_ = header.byte_size;
  a.expected_checksum_ = header.checksum;
  a.in_place_ = true;
  a.sums_.reset();  // kept for a tensor sent on, which this is not
  return a;
}

absl::StatusOr<ChunkAssembler> ChunkAssembler::StartInto(const TensorHeader& header,
                                                         std::span<std::byte> out) {
  REPVAR_RETURN_IF_ERROR(CheckByteSize(header.spec, header.byte_size));
  if (header.byte_size != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a value of ", header.byte_size,
                                                   " bytes cannot fill a buffer of ", out.size()));
  }
  ChunkAssembler a = InPlace(header);
  a.into_ = out;
  return a;
}

absl::StatusOr<ChunkAssembler> ChunkAssembler::StartInto(const TensorHeader& header,
                                                         std::vector<std::byte>* grow,
                                                         uint64_t max_bytes) {
  REPVAR_RETURN_IF_ERROR(CheckByteSize(header.spec, header.byte_size));
  if (header.byte_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a value of ", header.byte_size, " bytes exceeds the limit of ", max_bytes));
  }
  grow->clear();
  try {
    ReserveForBulk(*grow, header.byte_size);
  } catch (const std::exception&) {  // bad_alloc (strict overcommit), length_error
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve room for a value of ", header.byte_size, " bytes"));
  }
  ChunkAssembler a = InPlace(header);
  a.grow_ = grow;
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
  if (size > size_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk at ", offset, " of ", size, " bytes overruns the tensor of ", size_, " bytes"));
  }
  REPVAR_ASSIGN_OR_RETURN(const std::span<std::byte> out, Room(size));
  // Past `received_` until checked: a refused chunk is not part of the tensor.
  fill(out);
  if ((checksum != kChecksumNotGiven || in_place_) && Checksum(out) != checksum) {
    if (grow_ != nullptr) grow_->resize(received_);
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

absl::StatusOr<std::span<std::byte>> ChunkAssembler::Room(uint64_t size) {
  if (grow_ != nullptr) {
    // Sized a chunk at a time: the zeros resize writes are in cache when
    // the copy overwrites them.
    MakeRoomResident(*grow_, received_ + size);
    grow_->resize(received_ + size);
    return std::span(*grow_).subspan(received_);
  }
  if (in_place_) return into_.subspan(received_, size);
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
  return buf.span().subspan(received_, size);
}

std::span<std::byte> ChunkAssembler::bytes() {
  if (grow_ != nullptr) return std::span(*grow_);
  if (in_place_) return into_;
  return tensor_.bytes.span();
}

absl::StatusOr<uint64_t> ChunkAssembler::CheckWhole() const {
  if (received_ != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor truncated: got ", received_, " of ", size_, " bytes"));
  }
  uint64_t sum = hash_.Digest();
  if ((expected_checksum_ != kChecksumNotGiven || in_place_) && sum != expected_checksum_) {
    return absl::InvalidArgumentError(absl::StrCat("tensor checksum mismatch: header says ",
                                                   expected_checksum_, ", bytes give ", sum));
  }
  return sum;
}

absl::StatusOr<Tensor> ChunkAssembler::Finish() {
  if (in_place_) {
    return absl::FailedPreconditionError("the bytes are the caller's: FinishInPlace");
  }
  REPVAR_ASSIGN_OR_RETURN(tensor_.checksum, CheckWhole());
  if (sums_) tensor_.chunk_checksums = *std::move(sums_);
  return std::move(tensor_);
}

absl::StatusOr<uint64_t> ChunkAssembler::FinishInPlace() {
  if (!in_place_) return absl::FailedPreconditionError("the bytes are the assembler's: Finish");
  return CheckWhole();
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/chunk_assembler.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace repvar {

absl::StatusOr<ChunkAssembler> ChunkAssembler::Start(const TensorSpec& spec, uint64_t byte_size,
                                                     uint64_t checksum, uint64_t max_bytes) {
  auto size = spec.ByteSize();
  if (!size.ok()) return size.status();
  if (static_cast<uint64_t>(*size) != byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor header says ", byte_size, " bytes but ",
                                                   spec.ToString(), " needs ", *size));
  }
  if (byte_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor of ", byte_size, " bytes exceeds the limit of ", max_bytes));
  }
  auto buf = Buffer::Allocate(byte_size);
  if (!buf.ok()) return buf.status();
  ChunkAssembler a;
  a.tensor_.spec = spec;
  a.tensor_.bytes = *std::move(buf);
  a.expected_checksum_ = checksum;
  a.state_.reset(XXH3_createState());
  XXH3_64bits_reset(a.state_.get());
  return a;
}

ChunkAssembler::~ChunkAssembler() = default;

absl::Status ChunkAssembler::Add(uint64_t offset, std::span<const std::byte> data,
                                 uint64_t checksum) {
  if (offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk out of order: offset ", offset, ", expected ", received_));
  }
  if (data.size() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", data.size(), " bytes exceeds ", kMaxChunkBytes));
  }
  if (data.empty()) return absl::InvalidArgumentError("empty chunk");
  if (data.size() > tensor_.bytes.size() - received_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk at ", offset, " of ", data.size(),
                                                   " bytes overruns the tensor of ",
                                                   tensor_.bytes.size(), " bytes"));
  }
  if (Checksum(data) != checksum) {
    return absl::InvalidArgumentError(absl::StrCat("checksum mismatch in chunk at ", offset));
  }
  std::memcpy(tensor_.bytes.data() + received_, data.data(), data.size());
  XXH3_64bits_update(state_.get(), data.data(), data.size());
  received_ += data.size();
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ChunkAssembler::Finish() {
  if (received_ != tensor_.bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor truncated: got ", received_, " of ", tensor_.bytes.size(), " bytes"));
  }
  uint64_t sum = XXH3_64bits_digest(state_.get());
  if (sum != expected_checksum_) {
    return absl::InvalidArgumentError(absl::StrCat("tensor checksum mismatch: header says ",
                                                   expected_checksum_, ", bytes give ", sum));
  }
  tensor_.checksum = sum;
  return std::move(tensor_);
}

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_PROTO_CONVERT_H_
#define REPVAR_COMMON_PROTO_CONVERT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model/initializer.h"
#include "common/tensor/chunk_assembler.h"
#include "common/tensor/tensor.h"
#include "google/protobuf/message.h"
#include "repvar/v1/types.pb.h"

namespace repvar {

// Errors: INVALID_ARGUMENT (unknown dtype, bad shape).
absl::StatusOr<TensorSpec> SpecFromProto(const v1::TensorSpec& proto);
void SpecToProto(const TensorSpec& spec, v1::TensorSpec* proto);
void HeaderToProto(const Tensor& t, v1::TensorHeader* proto);

// A whole tensor in one message. Errors: INVALID_ARGUMENT (bad spec, length
// or checksum).
absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto);
void TensorToProto(const Tensor& t, v1::Tensor* proto);

// Errors: INVALID_ARGUMENT (bad embedded tensor, unknown generator).
absl::StatusOr<Initializer> InitializerFromProto(const v1::Initializer& proto);
void InitializerToProto(const Initializer& init, v1::Initializer* proto);

// Fills `proto` with one chunk of a tensor: offset, bytes and their checksum.
void ChunkToProto(uint64_t offset, std::span<const std::byte> piece, v1::TensorChunk* proto);
// Feeds a received chunk to `assembler` (see ChunkAssembler::Add).
absl::Status AddChunk(ChunkAssembler& assembler, const v1::TensorChunk& chunk);
// Starts assembling the tensor `header` announces; a small tensor may come
// whole in `inline_data` (then it is added as the one chunk at 0).
absl::StatusOr<ChunkAssembler> StartAssembly(const v1::TensorHeader& header,
                                             const std::string& inline_data);
// The bytes of a protobuf `bytes` field.
inline std::span<const std::byte> BytesOf(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// XXH3-64 of the deterministic serialization: a request's payload digest.
uint64_t Digest(const google::protobuf::Message& message);

}  // namespace repvar

#endif  // REPVAR_COMMON_PROTO_CONVERT_H_

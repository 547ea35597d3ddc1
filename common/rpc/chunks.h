// SPDX-License-Identifier: Apache-2.0
// Framing of tensors as chunk streams (a header, then ordered chunks, or the
// bytes inline in the header): the pieces every stream adapter shares.
#ifndef REPVAR_COMMON_RPC_CHUNKS_H_
#define REPVAR_COMMON_RPC_CHUNKS_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/tensor/chunk_assembler.h"
#include "common/tensor/tensor.h"
#include "google/protobuf/message.h"
#include "repvar/v1/types.pb.h"

namespace repvar {

class ReceivedChunk;  // chunk_frame.h

// repvar_tensor_bytes_total{direction=sent|received}: tensor bytes this
// process put into messages or took from them (chunks and inline data).
// ChunkToProto, the chunk frames (ChunkFrame, CopiedChunkFrame,
// ReceivedChunk::CopyTo), StartAssembly, TensorToProto and TensorFromProto
// count theirs; other senders and receivers of inline data call these.
void CountSentTensorBytes(uint64_t n);
void CountReceivedTensorBytes(uint64_t n);

// The chunk size a read asked for (its request's `chunk_bytes`): 0 or more
// than a chunk may hold, the default. INVALID_ARGUMENT when negative.
absl::StatusOr<size_t> RequestedChunkBytes(int64_t chunk_bytes);

// Fills `proto` with one chunk of a tensor: offset, bytes and their checksum.
void ChunkToProto(uint64_t offset, std::span<const std::byte> piece, v1::TensorChunk* proto);
// Sends `bytes` as ordered chunks: for each, a fresh `Msg` whose chunk
// field `chunk_of(msg)` returns is filled and passed to `write(msg)`.
// Stops at the first failed write; returns whether every chunk went.
template <typename Msg, typename WriteFn, typename ChunkOf>
bool SendChunks(std::span<const std::byte> bytes, size_t chunk_bytes, WriteFn&& write,
                ChunkOf&& chunk_of) {
  bool ok = true;
  ForEachChunk(bytes, chunk_bytes, [&](uint64_t offset, std::span<const std::byte> piece) {
    if (!ok) return;
    Msg m;
    ChunkToProto(offset, piece, chunk_of(m));
    ok = write(m);
  });
  return ok;
}
// Feeds a received chunk to `assembler` (see ChunkAssembler::Add): its data
// is copied once, into the tensor, from gRPC's slices or from the message
// protobuf parsed (ReceivedChunk::Of).
absl::Status AddChunk(ChunkAssembler& assembler, const ReceivedChunk& chunk);
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

#endif  // REPVAR_COMMON_RPC_CHUNKS_H_

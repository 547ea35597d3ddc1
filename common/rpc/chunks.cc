// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/chunks.h"

#include "absl/strings/str_cat.h"
#include "common/base/metrics.h"
#include "common/base/status_util.h"
#include "common/rpc/chunk_frame.h"
#include "common/rpc/from_proto.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace repvar {

namespace {

Counter& TensorBytes(const char* direction) {
  return Metrics::Global().GetCounter("repvar_tensor_bytes_total",
                                      "tensor bytes sent or received in messages, by direction",
                                      {{"direction", direction}});
}

}  // namespace

void CountReceivedTensorBytes(uint64_t n) {
  static Counter& received = TensorBytes("received");
  received.Add(n);
}

void CountSentTensorBytes(uint64_t n) {
  static Counter& sent = TensorBytes("sent");
  sent.Add(n);
}

absl::StatusOr<size_t> RequestedChunkBytes(int64_t chunk_bytes) {
  if (chunk_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must be >= 0 (0: the default), got ", chunk_bytes));
  }
  return static_cast<size_t>(chunk_bytes);
}

void ChunkToProto(uint64_t offset, std::span<const std::byte> piece, v1::TensorChunk* proto) {
  CountSentTensorBytes(piece.size());
  proto->set_offset(offset);
  proto->set_data(reinterpret_cast<const char*>(piece.data()), piece.size());
  proto->set_checksum(Checksum(piece));
}

absl::StatusOr<ChunkAssembler> StartAssembly(const v1::TensorHeader& header,
                                             const std::string& inline_data) {
  REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(header.spec()));
  REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, ChunkAssembler::Start(spec, header.byte_size(),
                                                                  header.checksum(), UINT64_MAX));
  if (!inline_data.empty()) {
    CountReceivedTensorBytes(inline_data.size());
    auto bytes = BytesOf(inline_data);
    REPVAR_RETURN_IF_ERROR(a.Add(0, bytes, Checksum(bytes)));
  }
  return a;
}

absl::Status AddChunk(ChunkAssembler& assembler, const ReceivedChunk& chunk) {
  return assembler.Add(chunk.offset(), chunk.size(), chunk.checksum(),
                       [&](std::span<std::byte> out) { chunk.CopyTo(out); });
}

uint64_t Digest(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return Checksum(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
}

}  // namespace repvar

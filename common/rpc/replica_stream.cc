// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/replica_stream.h"

#include "common/base/status_util.h"
#include "common/rpc/chunk_frame.h"
#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/grpc_status.h"

namespace repvar {

namespace {

absl::Status ChunkBeforeHeader() {
  return absl::DataLossError("replica stream: a chunk before the header");
}

}  // namespace

absl::Status ReplicaReceiver::OnMessage(const v1::ReadVariableChunk& msg) {
  if (msg.has_chunk()) return OnChunk(ReceivedChunk::Of(msg.chunk()));
  if (!msg.has_header()) return ChunkBeforeHeader();
  REPVAR_ASSIGN_OR_RETURN(TensorHeader header, TensorHeaderFromProto(msg.header()));
  REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a, ChunkAssembler::Start(header, UINT64_MAX));
  assembler_.emplace(std::move(a));
  version_ = msg.version();
  return absl::OkStatus();
}

absl::Status ReplicaReceiver::OnFrame(grpc::ByteBuffer& frame) {
  std::optional<ReceivedChunk> chunk;
  REPVAR_RETURN_IF_ERROR(ParseFrame(frame, &parsed_, &chunk));
  return chunk ? OnChunk(*chunk) : OnMessage(parsed_);
}

absl::Status ReplicaReceiver::OnChunk(const ReceivedChunk& chunk) {
  if (!assembler_) return ChunkBeforeHeader();
  return AddChunk(*assembler_, chunk);
}

absl::StatusOr<ReceivedReplica> ReplicaReceiver::Finish() {
  if (!assembler_) return absl::DataLossError("replica stream ended without a header");
  ReceivedReplica out;
  out.version = version_;
  REPVAR_ASSIGN_OR_RETURN(out.value, assembler_->Finish());
  return out;
}

absl::StatusOr<ReceivedReplica> ReceiveReplica(
    grpc::ClientContext& ctx, grpc::ClientReaderInterface<v1::ReadVariableChunk>& reader) {
  ReplicaReceiver receiver;
  v1::ReadVariableChunk msg;
  absl::Status s;
  while (s.ok() && reader.Read(&msg)) s = receiver.OnMessage(msg);
  if (!s.ok()) {
    ctx.TryCancel();
    (void)reader.Finish();
    return s;
  }
  REPVAR_RETURN_IF_ERROR(FromGrpcStatus(reader.Finish()));
  return receiver.Finish();
}

}  // namespace repvar

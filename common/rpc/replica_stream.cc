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
  if (assembler_) return absl::DataLossError("replica stream: a second header");
  REPVAR_ASSIGN_OR_RETURN(header_, TensorHeaderFromProto(msg.header()));
  REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a,
                          grow_ != nullptr ? ChunkAssembler::StartInto(header_, grow_, max_bytes_)
                          : in_place_      ? ChunkAssembler::StartInto(header_, into_)
                                           : ChunkAssembler::Start(header_, UINT64_MAX));
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

absl::StatusOr<ReceivedInPlace> ReplicaReceiver::FinishInPlace() {
  if (!assembler_) return absl::DataLossError("replica stream ended without a header");
  ReceivedInPlace out{version_, header_};
  REPVAR_ASSIGN_OR_RETURN(out.header.checksum, assembler_->FinishInPlace());
  return out;
}

absl::Status ReceiveReplicaFrames(grpc::ClientContext& ctx,
                                  grpc::ClientReaderInterface<grpc::ByteBuffer>& reader,
                                  ReplicaReceiver& receiver) {
  grpc::ByteBuffer frame;
  absl::Status s;
  while (s.ok() && reader.Read(&frame)) s = receiver.OnFrame(frame);
  if (!s.ok()) {
    ctx.TryCancel();
    (void)reader.Finish();
    if (s.code() == absl::StatusCode::kInvalidArgument) return absl::DataLossError(s.message());
    return s;
  }
  return FromGrpcStatus(reader.Finish());
}

}  // namespace repvar

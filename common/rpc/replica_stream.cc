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
  return absl::DataLossError("value stream: a chunk before the header");
}

// Where each stream message keeps its header and version.
const v1::TensorHeader& HeaderOf(const v1::ReadVariableChunk& msg) { return msg.header(); }
int64_t VersionOf(const v1::ReadVariableChunk& msg) { return msg.version(); }
const v1::TensorHeader& HeaderOf(const v1::ReadVariableResponse& msg) {
  return msg.header().tensor();
}
int64_t VersionOf(const v1::ReadVariableResponse& msg) { return msg.header().version(); }

}  // namespace

template <typename Message>
absl::Status ValueReceiver<Message>::OnMessage(const Message& msg) {
  if (msg.has_chunk()) return OnChunk(ReceivedChunk::Of(msg.chunk()));
  if (!msg.has_header()) {
    return assembler_ ? absl::DataLossError("value stream: a message with no part")
                      : ChunkBeforeHeader();
  }
  return OnHeader(HeaderOf(msg), VersionOf(msg));
}

template <typename Message>
absl::Status ValueReceiver<Message>::OnHeader(const v1::TensorHeader& proto, int64_t version) {
  if (header_seen_) return absl::DataLossError("value stream: a second header");
  REPVAR_ASSIGN_OR_RETURN(TensorHeader header, TensorHeaderFromProto(proto));
  REPVAR_RETURN_IF_ERROR(CheckByteSize(header.spec, header.byte_size));
  header_ = std::move(header);
  header_seen_ = true;
  REPVAR_ASSIGN_OR_RETURN(ChunkAssembler a,
                          grow_ != nullptr ? ChunkAssembler::StartInto(header_, grow_, max_bytes_)
                          : in_place_      ? ChunkAssembler::StartInto(header_, into_)
                                           : ChunkAssembler::Start(header_, UINT64_MAX));
  assembler_.emplace(std::move(a));
  version_ = version;
  return absl::OkStatus();
}

template <typename Message>
absl::Status ValueReceiver<Message>::OnFrame(grpc::ByteBuffer& frame) {
  std::optional<ReceivedChunk> chunk;
  REPVAR_RETURN_IF_ERROR(ParseFrame(frame, &parsed_, &chunk));
  return chunk ? OnChunk(*chunk) : OnMessage(parsed_);
}

template <typename Message>
absl::Status ValueReceiver<Message>::OnChunk(const ReceivedChunk& chunk) {
  if (!assembler_) return ChunkBeforeHeader();
  return AddChunk(*assembler_, chunk);
}

template <typename Message>
absl::StatusOr<ReceivedReplica> ValueReceiver<Message>::Finish() {
  if (!assembler_) return absl::DataLossError("value stream ended without a header");
  ReceivedReplica out;
  out.version = version_;
  REPVAR_ASSIGN_OR_RETURN(out.value, assembler_->Finish());
  return out;
}

template <typename Message>
absl::StatusOr<ReceivedInPlace> ValueReceiver<Message>::FinishInPlace() {
  if (!assembler_) return absl::DataLossError("value stream ended without a header");
  ReceivedInPlace out{version_, header_};
  REPVAR_ASSIGN_OR_RETURN(out.header.checksum, assembler_->FinishInPlace());
  return out;
}

template <typename Message>
absl::Status ReceiveFrames(grpc::ClientContext& ctx,
                           grpc::ClientReaderInterface<grpc::ByteBuffer>& reader,
                           ValueReceiver<Message>& receiver) {
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

template class ValueReceiver<v1::ReadVariableChunk>;
template class ValueReceiver<v1::ReadVariableResponse>;
template absl::Status ReceiveFrames(grpc::ClientContext&,
                                    grpc::ClientReaderInterface<grpc::ByteBuffer>&,
                                    ReplicaReceiver&);
template absl::Status ReceiveFrames(grpc::ClientContext&,
                                    grpc::ClientReaderInterface<grpc::ByteBuffer>&, ReadReceiver&);

}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// The stream framing both worker services share: feeding header/chunk
// messages to the core's write sessions, and streaming a replica out, both
// as byte buffers (common/rpc/chunk_frame.h).
#ifndef REPVAR_WORKER_RPC_STREAMS_H_
#define REPVAR_WORKER_RPC_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/rpc/chunk_frame.h"
#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/to_proto.h"
#include "repvar/v1/worker.pb.h"
#include "worker/core/replica_store.h"
#include "worker/core/write_sessions.h"

namespace repvar::worker {

// Feeds one write header to `session`.
inline absl::Status OnHeader(ReplicaWriteSession& session, const v1::WriteReplicasHeader& h) {
  REPVAR_ASSIGN_OR_RETURN(ReplicaWriteHeader header, WriteHeaderFromProto(h));
  CountReceivedTensorBytes(h.inline_data().size());
  return session.OnHeader(std::move(header), BytesOf(h.inline_data()));
}
inline absl::Status OnHeader(StepWriteSession& session, const v1::StepWriteHeader& h) {
  REPVAR_ASSIGN_OR_RETURN(StepWriteHeader header, StepWriteHeaderFromProto(h));
  CountReceivedTensorBytes(h.inline_data().size());
  return session.OnHeader(header, BytesOf(h.inline_data()));
}

// Drains a stream of header/chunk messages, read as byte buffers
// (ReadFrame: a chunk's bytes go from gRPC's slices into the value, one
// copy), into `session`; stops at the first refusal. The first header says
// how many writes the stream carries (stream_writes): a count that does not
// match refuses the whole stream, nothing applied.
template <typename Request, typename Session>
absl::Status Drain(Session& session, FrameReader* reader) {
  Request msg;
  std::optional<ReceivedChunk> chunk;
  int64_t announced = 0;
  int64_t headers = 0;
  while (true) {
    REPVAR_ASSIGN_OR_RETURN(const bool more, ReadFrame(reader, &msg, &chunk));
    if (!more) break;
    if (chunk) {
      REPVAR_RETURN_IF_ERROR(
          session.OnChunk(chunk->offset(), chunk->size(), chunk->checksum(),
                          [&](std::span<std::byte> out) { chunk->CopyTo(out); }));
    } else if (msg.has_header()) {
      if (headers++ == 0) announced = msg.header().stream_writes();
      if (announced >= 1 && headers > announced) break;
      REPVAR_RETURN_IF_ERROR(OnHeader(session, msg.header()));
    } else {
      return absl::InvalidArgumentError("a stream message with neither header nor chunk");
    }
  }
  if (announced < 1 || headers != announced) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the stream announced ", announced, " write(s) (stream_writes, at least 1) and carried ",
        headers, "; nothing applied"));
  }
  return absl::OkStatus();
}

// A header for a whole tensor carried inline in one message.
inline bool WholeInline(const v1::TensorHeader& tensor, const std::string& inline_data) {
  return inline_data.size() == tensor.byte_size();
}

// Streams `r` as a header (with its version) then chunk frames.
template <typename Request>
grpc::Status SendReplica(grpc::ServerContext* ctx, const StoredReplica& r, int64_t chunk_bytes,
                         FrameWriter<Request>* writer) {
  auto chunk = RequestedChunkBytes(chunk_bytes);
  if (!chunk.ok()) return ToGrpcStatus(chunk.status());
  v1::ReadVariableChunk head;
  HeaderToProto(*r.value, head.mutable_header());
  head.set_version(r.version);
  const bool ok = SendTensorFrames(
      head, v1::ReadVariableChunk::kChunkFieldNumber, r.value, *chunk,
      [&](const grpc::ByteBuffer& m) { return !ctx->IsCancelled() && writer->Write(m); });
  if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
  return grpc::Status::OK;
}

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_RPC_STREAMS_H_

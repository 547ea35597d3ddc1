// SPDX-License-Identifier: Apache-2.0
// Receiving a replica as the workers stream it (WorkerReplicas.ReadReplica,
// WorkerSteps.StepRead: a header with the version, then ordered chunks),
// blocking (the client library) or message by message (the coordinator's
// asynchronous reads).
#ifndef REPVAR_COMMON_RPC_REPLICA_STREAM_H_
#define REPVAR_COMMON_RPC_REPLICA_STREAM_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "common/tensor/chunk_assembler.h"
#include "repvar/v1/worker.pb.h"

namespace repvar {

class ReceivedChunk;  // chunk_frame.h

struct ReceivedReplica {
  int64_t version = 0;
  Tensor value;  // checksums verified
};

// Rebuilds a replica from its stream's messages, in order. Not thread-safe.
class ReplicaReceiver {
 public:
  // Errors: INVALID_ARGUMENT (a bad header or chunk), DATA_LOSS (a chunk
  // before the header).
  absl::Status OnMessage(const v1::ReadVariableChunk& msg);
  // The same for a message read as a byte buffer: a chunk is copied from
  // gRPC's slices straight into place (ParseFrame); INVALID_ARGUMENT also
  // for a message that does not parse.
  absl::Status OnFrame(grpc::ByteBuffer& frame);
  // After the last message. Errors: DATA_LOSS (no header), INVALID_ARGUMENT
  // (bytes missing, checksum).
  absl::StatusOr<ReceivedReplica> Finish();

 private:
  std::optional<ChunkAssembler> assembler_;
  int64_t version_ = 0;
  // Every chunk, whichever way it was read.
  absl::Status OnChunk(const ReceivedChunk& chunk);

  v1::ReadVariableChunk parsed_;  // OnFrame's message, when not a chunk frame
};

// Drains `reader`; cancels the call on the first bad message.
absl::StatusOr<ReceivedReplica> ReceiveReplica(
    grpc::ClientContext& ctx, grpc::ClientReaderInterface<v1::ReadVariableChunk>& reader);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_REPLICA_STREAM_H_

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
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor/chunk_assembler.h"
#include "repvar/v1/worker.pb.h"

namespace repvar {

class ReceivedChunk;  // chunk_frame.h

struct ReceivedReplica {
  int64_t version = 0;
  Tensor value;  // checksums verified
};

// What a receiver into the caller's memory received: the value's header
// (its checksum verified, or computed when the worker gave none) and
// version; the bytes are where the caller said.
struct ReceivedInPlace {
  int64_t version = 0;
  TensorHeader header;
};

// Rebuilds a replica from its stream's messages, in order (ChunkAssembler
// checks every chunk). Not thread-safe.
class ReplicaReceiver {
 public:
  // Into a tensor of its own, handed over by Finish().
  ReplicaReceiver() = default;
  // Into `out`, which must be the value's size (FinishInPlace()).
  explicit ReplicaReceiver(std::span<std::byte> out) : into_(out), in_place_(true) {}
  // Into `*grow`, sized as the bytes arrive, at most `max_bytes`
  // (FinishInPlace()).
  ReplicaReceiver(std::vector<std::byte>* grow, uint64_t max_bytes)
      : grow_(grow), max_bytes_(max_bytes), in_place_(true) {}

  // Errors: INVALID_ARGUMENT (a bad header or chunk, or a header of another
  // size than `out`), DATA_LOSS (a chunk before the header),
  // RESOURCE_EXHAUSTED (a header above `max_bytes`).
  absl::Status OnMessage(const v1::ReadVariableChunk& msg);
  // The same for a message read as a byte buffer: a chunk is copied from
  // gRPC's slices straight into place (ParseFrame); INVALID_ARGUMENT also
  // for a message that does not parse.
  absl::Status OnFrame(grpc::ByteBuffer& frame);
  // After the last message. Errors: DATA_LOSS (no header), INVALID_ARGUMENT
  // (bytes missing, checksum), FAILED_PRECONDITION (the receiver was made
  // for the other of the two).
  absl::StatusOr<ReceivedReplica> Finish();
  absl::StatusOr<ReceivedInPlace> FinishInPlace();

 private:
  std::optional<ChunkAssembler> assembler_;
  int64_t version_ = 0;
  // Every chunk, whichever way it was read.
  absl::Status OnChunk(const ReceivedChunk& chunk);

  const std::span<std::byte> into_;
  std::vector<std::byte>* const grow_ = nullptr;
  const uint64_t max_bytes_ = 0;
  const bool in_place_ = false;
  TensorHeader header_;
  v1::ReadVariableChunk parsed_;  // OnFrame's message, when not a chunk frame
};

// Drains `reader`, a stream read as byte buffers, into `receiver`; cancels
// the call on the first bad message. Returns the receiver's error (a
// damaged stream, INVALID_ARGUMENT or DATA_LOSS from the receiver, as
// DATA_LOSS) or else the call's; the caller then finishes the receiver.
absl::Status ReceiveReplicaFrames(grpc::ClientContext& ctx,
                                  grpc::ClientReaderInterface<grpc::ByteBuffer>& reader,
                                  ReplicaReceiver& receiver);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_REPLICA_STREAM_H_

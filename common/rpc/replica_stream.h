// SPDX-License-Identifier: Apache-2.0
// Receiving a value as a daemon streams it, a header then ordered chunks:
// a worker's replica (WorkerReplicas.ReadReplica, WorkerSteps.StepRead:
// ReadVariableChunk) or the coordinator's committed value
// (CoordinatorTrainers.ReadVariable: ReadVariableResponse). One receiver
// for both, blocking (the client library) or message by message (the
// coordinator's asynchronous reads); ChunkAssembler checks every chunk,
// wherever the bytes go.
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
#include "repvar/v1/coordinator.pb.h"
#include "repvar/v1/worker.pb.h"

namespace repvar {

class ReceivedChunk;  // chunk_frame.h

struct ReceivedReplica {
  int64_t version = 0;
  Tensor value;  // checksums verified
};

// What a receiver into the caller's memory received: the value's header
// (its checksum verified) and version; the bytes are where the caller said.
struct ReceivedInPlace {
  int64_t version = 0;
  TensorHeader header;
};

// Rebuilds a value from its stream's messages, in order. `Message` is one
// of the two stream messages (a oneof of a header and a TensorChunk
// `chunk`, the version with the header); the two instantiations are
// ReplicaReceiver and ReadReceiver below. Not thread-safe.
template <typename Message>
class ValueReceiver {
 public:
  // Into a tensor of its own, handed over by Finish().
  ValueReceiver() = default;
  // Into `out`, which must be the value's size (FinishInPlace()).
  explicit ValueReceiver(std::span<std::byte> out) : into_(out), in_place_(true) {}
  // Into `*grow`, sized as the bytes arrive, at most `max_bytes`
  // (FinishInPlace()).
  ValueReceiver(std::vector<std::byte>* grow, uint64_t max_bytes)
      : grow_(grow), max_bytes_(max_bytes), in_place_(true) {}

  // Errors: INVALID_ARGUMENT (a bad header or chunk, or a header of another
  // size than `out`), DATA_LOSS (a chunk before the header, a second
  // header), RESOURCE_EXHAUSTED (a header above `max_bytes`).
  absl::Status OnMessage(const Message& msg);
  // The same for a message read as a byte buffer: a chunk is copied from
  // gRPC's slices straight into place (ParseFrame); INVALID_ARGUMENT also
  // for a message that does not parse.
  absl::Status OnFrame(grpc::ByteBuffer& frame);
  // After the last message. Errors: DATA_LOSS (no header), INVALID_ARGUMENT
  // (bytes missing, checksum), FAILED_PRECONDITION (the receiver was made
  // for the other of the two).
  absl::StatusOr<ReceivedReplica> Finish();
  absl::StatusOr<ReceivedInPlace> FinishInPlace();

  // The byte size the stream's header announced, once a well-formed one
  // came, whether or not the destination took it: a caller tells a buffer
  // of the wrong size (its own mistake) from a damaged stream by it.
  std::optional<uint64_t> announced_bytes() const {
    return header_seen_ ? std::optional<uint64_t>(header_.byte_size) : std::nullopt;
  }

 private:
  absl::Status OnHeader(const v1::TensorHeader& proto, int64_t version);
  // Every chunk, whichever way it was read.
  absl::Status OnChunk(const ReceivedChunk& chunk);

  std::optional<ChunkAssembler> assembler_;
  int64_t version_ = 0;
  const std::span<std::byte> into_;
  std::vector<std::byte>* const grow_ = nullptr;
  const uint64_t max_bytes_ = 0;
  const bool in_place_ = false;
  bool header_seen_ = false;
  TensorHeader header_;
  Message parsed_;  // OnFrame's message, when not a chunk frame
};

// A worker's replica: ReadReplica (the coordinator), StepRead (a trainer).
using ReplicaReceiver = ValueReceiver<v1::ReadVariableChunk>;
// The coordinator's committed value: ReadVariable (the client library).
using ReadReceiver = ValueReceiver<v1::ReadVariableResponse>;
extern template class ValueReceiver<v1::ReadVariableChunk>;
extern template class ValueReceiver<v1::ReadVariableResponse>;

// Drains `reader`, a stream read as byte buffers, into `receiver`; cancels
// the call on the first bad message. Returns the receiver's error (a
// damaged stream, INVALID_ARGUMENT or DATA_LOSS from the receiver, as
// DATA_LOSS; RESOURCE_EXHAUSTED as it is) or else the call's; the caller
// then finishes the receiver.
template <typename Message>
absl::Status ReceiveFrames(grpc::ClientContext& ctx,
                           grpc::ClientReaderInterface<grpc::ByteBuffer>& reader,
                           ValueReceiver<Message>& receiver);
extern template absl::Status ReceiveFrames(grpc::ClientContext&,
                                           grpc::ClientReaderInterface<grpc::ByteBuffer>&,
                                           ReplicaReceiver&);
extern template absl::Status ReceiveFrames(grpc::ClientContext&,
                                           grpc::ClientReaderInterface<grpc::ByteBuffer>&,
                                           ReadReceiver&);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_REPLICA_STREAM_H_

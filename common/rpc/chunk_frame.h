// SPDX-License-Identifier: Apache-2.0
// A chunk message as gRPC's byte buffer, the tensor's bytes not copied: the
// buffer's middle slice points into them and keeps their owner alive until
// gRPC has written them to the socket and lets go.
//
// A chunk built with ChunkToProto and protobuf's serializer is copied twice before
// the kernel's copy (into the message's bytes field, then into gRPC's
// slices); a chunk frame is copied only by the kernel (CopiedChunkFrame:
// once more, where nothing owns the bytes). The bytes on the wire
// are the same as protobuf's (ChunkFrameTest pins it), so receivers parse it
// as the message it stands for.
#ifndef REPVAR_COMMON_RPC_CHUNK_FRAME_H_
#define REPVAR_COMMON_RPC_CHUNK_FRAME_H_

#include <grpcpp/impl/codegen/method_handler.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/tensor/tensor.h"
#include "google/protobuf/message_lite.h"

namespace repvar {

// "/<service>/<method>", the name gRPC calls a method by, kept for the
// process's life (grpc::internal::RpcMethod keeps the pointer): for calls
// whose messages are chunk frames, made without the generated stub.
const char* FullMethodName(absl::string_view service, absl::string_view method);

// The wire form of a message whose field `field` (a length-delimited
// `TensorChunk`) is {offset, data = piece, checksum}: what protobuf writes
// for it. `piece` must stay unchanged while `owner` lives; the buffer holds
// `owner` until gRPC releases the piece.
grpc::ByteBuffer ChunkFrame(uint32_t field, uint64_t offset, std::span<const std::byte> piece,
                            uint64_t checksum, std::shared_ptr<const void> owner);

// The same frame for bytes no owner keeps alive (a caller's span): the piece
// is copied once, into gRPC's slice, and its checksum taken from the copy
// while it is in cache. Protobuf copied it twice.
grpc::ByteBuffer CopiedChunkFrame(uint32_t field, uint64_t offset,
                                  std::span<const std::byte> piece);

// A small message as a byte buffer (serialized into one slice).
grpc::ByteBuffer MessageFrame(const google::protobuf::MessageLite& message);

// Writes `head`, then `value`'s bytes as chunk frames of field
// `chunk_field` (ChunkFrame: not copied, `value` kept alive while gRPC holds
// them), by `write(const grpc::ByteBuffer&) -> bool`; stops at the first
// failed write and returns whether every message went.
template <typename WriteFn>
bool SendTensorFrames(const google::protobuf::MessageLite& head, uint32_t chunk_field,
                      const std::shared_ptr<const Tensor>& value, size_t chunk_bytes,
                      WriteFn&& write) {
  bool ok = write(MessageFrame(head));
  ForEachChunk(value->bytes.span(), chunk_bytes,
               [&](uint64_t offset, std::span<const std::byte> piece) {
                 ok = ok && write(ChunkFrame(chunk_field, offset, piece, Checksum(piece), value));
               });
  return ok;
}

// A synchronous server-streaming method answered in byte buffers (chunk
// frames among them). A generated service's constructor installs it with
//   MarkMethodStreamed(MethodIndex(<service>, "<method>"),
//                      FrameStreamingHandler<Request>(fn));
// gRPC then serves the method as a stream that reads one request (the same
// wire exchange), and `fn(ctx, request, writer)` answers it.
template <typename Request>
using FrameWriter = grpc::ServerSplitStreamer<Request, grpc::ByteBuffer>;

// The index of `method` in `service` (a full name) as gRPC's generated
// service numbers them: the order of the .proto. Stops the process if there
// is no such method (a typo in the code, not an input).
int MethodIndex(absl::string_view service, absl::string_view method);

template <typename Request, typename Fn>
grpc::internal::MethodHandler* FrameStreamingHandler(Fn fn) {
  return new grpc::internal::SplitServerStreamingHandler<Request, grpc::ByteBuffer>(
      [fn = std::move(fn)](grpc::ServerContext* ctx, FrameWriter<Request>* writer) {
        Request request;
        if (!writer->Read(&request)) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the call carried no request that could be parsed");
        }
        return fn(ctx, request, writer);
      });
}

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_CHUNK_FRAME_H_

// SPDX-License-Identifier: Apache-2.0
// Tensor chunks as gRPC byte buffers, so that a value's bytes are copied once
// per hop (docs/architecture.md, "Chunk frames").
//
// Built and parsed as protobuf messages, a chunk is copied twice on the way
// out (into the message's bytes field, then into gRPC's slices) and twice on
// the way in (out of the slices by the parse, then into the value). A
// ChunkFrame's middle slice points into the value and keeps it alive until
// gRPC lets go (CopiedChunkFrame copies a caller's bytes once), and a
// ReceivedChunk is copied from gRPC's slices straight into place. The bytes
// on the wire are protobuf's (ChunkFrameTest pins it): peers that build and
// parse the messages with protobuf interoperate unchanged.
#ifndef REPVAR_COMMON_RPC_CHUNK_FRAME_H_
#define REPVAR_COMMON_RPC_CHUNK_FRAME_H_

#include <grpcpp/impl/codegen/method_handler.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/tensor/tensor.h"
#include "google/protobuf/message_lite.h"
#include "repvar/v1/types.pb.h"

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

// A chunk received as a byte buffer, its data left in gRPC's slices: the one
// copy of its bytes is the receiver's, into where they belong
// (ChunkAssembler::Add with `CopyTo`), where protobuf's parse would copy
// them out of the slices first.
class ReceivedChunk {
 public:
  // `buffer` as a message whose field `field` (below 16) is a TensorChunk, if
  // it is laid out as protobuf writes one (as ChunkFrame does): the field's
  // tag and length, then offset (left out when 0), data, checksum (left out
  // when 0), and nothing else. Anything else, well-formed or not, is nullopt:
  // the caller parses it with protobuf, whose meaning is the reference.
  static std::optional<ReceivedChunk> Parse(const grpc::ByteBuffer& buffer, uint32_t field);
  // A chunk protobuf parsed: its data where `chunk` holds it (valid while
  // `chunk` is unchanged).
  static ReceivedChunk Of(const v1::TensorChunk& chunk);

  uint64_t offset() const { return offset_; }
  uint64_t checksum() const { return checksum_; }
  size_t size() const { return size_; }
  // Copies the data into `out` (size() bytes).
  void CopyTo(std::span<std::byte> out) const;

 private:
  ReceivedChunk() = default;
  std::vector<grpc::Slice> slices_;  // hold the bytes the pieces point into
  std::vector<std::span<const std::byte>> pieces_;
  uint64_t offset_ = 0;
  uint64_t checksum_ = 0;
  size_t size_ = 0;
};

// Reads the next message of a stream of `Message`s (a oneof of a header and
// a TensorChunk `chunk`) as a byte buffer. Every chunk comes back in `chunk`:
// laid out as ChunkFrame writes it, its data is left in gRPC's slices;
// otherwise protobuf parses it into `message` and `chunk` points into that
// (valid until the next read). Anything else is parsed into `message`, with
// `chunk` reset. Returns false at the end of the stream; INVALID_ARGUMENT for
// a message that does not parse. ParseFrame does the same for a message
// already read (an asynchronous reader's).
template <typename Message>
absl::Status ParseFrame(grpc::ByteBuffer& buffer, Message* message,
                        std::optional<ReceivedChunk>* chunk) {
  *chunk = ReceivedChunk::Parse(buffer, Message::kChunkFieldNumber);
  if (chunk->has_value()) return absl::OkStatus();
  if (!grpc::SerializationTraits<Message>::Deserialize(&buffer, message).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stream message that does not parse as ", message->GetTypeName()));
  }
  if (message->has_chunk()) *chunk = ReceivedChunk::Of(message->chunk());
  return absl::OkStatus();
}

template <typename Message>
absl::StatusOr<bool> ReadFrame(grpc::internal::ReaderInterface<grpc::ByteBuffer>* reader,
                               Message* message, std::optional<ReceivedChunk>* chunk) {
  grpc::ByteBuffer buffer;
  if (!reader->Read(&buffer)) return false;
  if (absl::Status s = ParseFrame(buffer, message, chunk); !s.ok()) return s;
  return true;
}

// A synchronous client-streaming method whose messages are read as byte
// buffers (ReadFrame). A generated service's constructor installs it with
//   MarkMethodStreamed(MethodIndex(<service>, "<method>"),
//                      FrameReadingHandler(this, &Service::MethodFrames));
// `(service->*method)(ctx, reader, &response)` reads the stream; gRPC then
// serves the method as a stream that answers once (the same wire exchange),
// and the response goes back when it returns OK.
using FrameReader = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

template <typename Service, typename Response>
grpc::internal::MethodHandler* FrameReadingHandler(
    Service* service,
    grpc::Status (Service::*method)(grpc::ServerContext*, FrameReader*, Response*)) {
  return new grpc::internal::TemplatedBidiStreamingHandler<FrameReader, false>(
      [service, method](grpc::ServerContext* ctx, FrameReader* stream) {
        Response response;
        grpc::Status status = (service->*method)(ctx, stream, &response);
        if (status.ok() && !stream->Write(MessageFrame(response))) {
          return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
        }
        return status;
      });
}

// Writes `head`, then `value`'s bytes as chunk frames of field
// `chunk_field` (ChunkFrame: not copied, `value` kept alive while gRPC holds
// them; each chunk's checksum as Tensor::ChunkChecksum gives it), by
// `write(const grpc::ByteBuffer&) -> bool`; stops at the first failed write
// and returns whether every message went.
template <typename WriteFn>
bool SendTensorFrames(const google::protobuf::MessageLite& head, uint32_t chunk_field,
                      const std::shared_ptr<const Tensor>& value, size_t chunk_bytes,
                      WriteFn&& write) {
  bool ok = write(MessageFrame(head));
  ForEachChunk(value->bytes.span(), chunk_bytes,
               [&](uint64_t offset, std::span<const std::byte> piece) {
                 ok = ok && write(ChunkFrame(chunk_field, offset, piece,
                                             value->ChunkChecksum(offset, piece.size()), value));
               });
  return ok;
}

// A synchronous server-streaming method answered in byte buffers (chunk
// frames among them). A generated service's constructor installs it with
//   MarkMethodStreamed(MethodIndex(<service>, "<method>"),
//                      FrameStreamingHandler(this, &Service::MethodFrames));
// gRPC then serves the method as a stream that reads one request (the same
// wire exchange), and `(service->*method)(ctx, request, writer)` answers it.
template <typename Request>
using FrameWriter = grpc::ServerSplitStreamer<Request, grpc::ByteBuffer>;

// The index of `method` in `service` (a full name) as gRPC's generated
// service numbers them: the order of the .proto. Stops the process if there
// is no such method (a typo in the code, not an input).
int MethodIndex(absl::string_view service, absl::string_view method);

template <typename Service, typename Request>
grpc::internal::MethodHandler* FrameStreamingHandler(
    Service* service,
    grpc::Status (Service::*method)(grpc::ServerContext*, const Request&, FrameWriter<Request>*)) {
  return new grpc::internal::SplitServerStreamingHandler<Request, grpc::ByteBuffer>(
      [service, method](grpc::ServerContext* ctx, FrameWriter<Request>* writer) {
        Request request;
        if (!writer->Read(&request)) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the call carried no request that could be parsed");
        }
        return (service->*method)(ctx, request, writer);
      });
}

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_CHUNK_FRAME_H_

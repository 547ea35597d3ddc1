// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/chunk_frame.h"

#include <grpc/slice.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_util.h"
#include "common/rpc/chunks.h"
#include "google/protobuf/descriptor.h"

namespace repvar {
namespace {

// Protobuf's base-128 varint.
size_t PutVarint(uint64_t v, uint8_t* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

constexpr uint32_t kVarint = 0;
constexpr uint32_t kLengthDelimited = 2;
uint64_t Tag(uint32_t field, uint32_t wire_type) { return (uint64_t{field} << 3) | wire_type; }

// TensorChunk's fields (types.proto).
constexpr uint32_t kOffsetField = 1;
constexpr uint32_t kDataField = 2;
constexpr uint32_t kChecksumField = 3;

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

// The frame around `data`, a slice of `size` bytes.
grpc::ByteBuffer Frame(uint32_t field, uint64_t offset, grpc::Slice data, size_t size,
                       uint64_t checksum) {
  CountSentTensorBytes(size);
  // proto3 leaves out fields at their default value, as protobuf does.
  uint8_t tail[1 + 10];
  size_t tail_size = 0;
  if (checksum != 0) {
    tail_size += PutVarint(Tag(kChecksumField, kVarint), tail);
    tail_size += PutVarint(checksum, tail + tail_size);
  }
  size_t inner = tail_size;
  if (offset != 0) inner += VarintSize(Tag(kOffsetField, kVarint)) + VarintSize(offset);
  if (size != 0) {
    inner += VarintSize(Tag(kDataField, kLengthDelimited)) + VarintSize(size) + size;
  }
  uint8_t head[5 * 10];
  size_t head_size = PutVarint(Tag(field, kLengthDelimited), head);
  head_size += PutVarint(inner, head + head_size);
  if (offset != 0) {
    head_size += PutVarint(Tag(kOffsetField, kVarint), head + head_size);
    head_size += PutVarint(offset, head + head_size);
  }
  if (size == 0) {
    grpc::Slice slices[] = {grpc::Slice(head, head_size), grpc::Slice(tail, tail_size)};
    return grpc::ByteBuffer(slices, tail_size == 0 ? 1 : 2);
  }
  head_size += PutVarint(Tag(kDataField, kLengthDelimited), head + head_size);
  head_size += PutVarint(size, head + head_size);
  grpc::Slice slices[] = {grpc::Slice(head, head_size), std::move(data),
                          grpc::Slice(tail, tail_size)};
  return grpc::ByteBuffer(slices, tail_size == 0 ? 2 : 3);
}

}  // namespace

const char* FullMethodName(absl::string_view service, absl::string_view method) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* names = new std::set<std::string>();  // nodes stay where they are
  absl::MutexLock lock(&mu);
  return names->insert(absl::StrCat("/", service, "/", method)).first->c_str();
}

int MethodIndex(absl::string_view service, absl::string_view method) {
  const google::protobuf::ServiceDescriptor* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(std::string(service));
  const google::protobuf::MethodDescriptor* m =
      s == nullptr ? nullptr : s->FindMethodByName(std::string(method));
  REPVAR_CHECK_MSG(m != nullptr, absl::StrCat("no method ", method, " in service ", service));
  return m->index();
}

grpc::ByteBuffer MessageFrame(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  grpc::Slice slice(grpc_slice_malloc(size), grpc::Slice::STEAL_REF);
  message.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer ChunkFrame(uint32_t field, uint64_t offset, std::span<const std::byte> piece,
                            uint64_t checksum, std::shared_ptr<const void> owner) {
  if (piece.empty()) return Frame(field, offset, grpc::Slice(), 0, checksum);
  // gRPC only reads a slice it is given; the cast is for its constructor.
  grpc::Slice data(const_cast<std::byte*>(piece.data()), piece.size(), &ReleaseOwner,
                   new std::shared_ptr<const void>(std::move(owner)));
  return Frame(field, offset, std::move(data), piece.size(), checksum);
}

grpc::ByteBuffer CopiedChunkFrame(uint32_t field, uint64_t offset,
                                  std::span<const std::byte> piece) {
  if (piece.empty()) return Frame(field, offset, grpc::Slice(), 0, Checksum(piece));
  grpc::Slice data(grpc_slice_malloc(piece.size()), grpc::Slice::STEAL_REF);
  auto* copy = const_cast<uint8_t*>(data.begin());
  std::memcpy(copy, piece.data(), piece.size());
  const uint64_t checksum = Checksum(std::as_bytes(std::span<const uint8_t>(copy, piece.size())));
  return Frame(field, offset, std::move(data), piece.size(), checksum);
}

}  // namespace repvar

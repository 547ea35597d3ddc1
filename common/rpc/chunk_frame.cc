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
#include "repvar/v1/types.pb.h"

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

constexpr uint32_t kOffsetField = v1::TensorChunk::kOffsetFieldNumber;
constexpr uint32_t kDataField = v1::TensorChunk::kDataFieldNumber;
constexpr uint32_t kChecksumField = v1::TensorChunk::kChecksumFieldNumber;

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

namespace {

// Reads a byte buffer's slices in order, without copying them.
class SliceCursor {
 public:
  explicit SliceCursor(std::vector<grpc::Slice>* slices) : slices_(*slices) { Skip(); }
  bool AtEnd() const { return index_ == slices_.size(); }
  std::optional<uint8_t> Byte() {
    if (AtEnd()) return std::nullopt;
    const uint8_t b = slices_[index_].begin()[pos_++];
    Skip();
    ++consumed_;
    return b;
  }
  std::optional<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      std::optional<uint8_t> b = Byte();
      if (!b) return std::nullopt;
      v |= uint64_t{static_cast<uint8_t>(*b & 0x7f)} << shift;
      if ((*b & 0x80) == 0) return v;
    }
    return std::nullopt;  // longer than 10 bytes
  }
  // The next `n` bytes as pieces of the slices; false if fewer are left.
  bool Take(uint64_t n, std::vector<std::span<const std::byte>>* pieces) {
    while (n > 0) {
      if (AtEnd()) return false;
      const grpc::Slice& s = slices_[index_];
      const size_t k = std::min<uint64_t>(n, s.size() - pos_);
      pieces->emplace_back(reinterpret_cast<const std::byte*>(s.begin() + pos_), k);
      pos_ += k;
      n -= k;
      consumed_ += k;
      Skip();
    }
    return true;
  }
  uint64_t consumed() const { return consumed_; }

 private:
  // Past the end of this slice (and any empty ones) to the next byte.
  void Skip() {
    while (index_ < slices_.size() && pos_ == slices_[index_].size()) {
      ++index_;
      pos_ = 0;
    }
  }
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t pos_ = 0;
  uint64_t consumed_ = 0;
};

}  // namespace

std::optional<ReceivedChunk> ReceivedChunk::Parse(const grpc::ByteBuffer& buffer, uint32_t field) {
  if (field == 0 || field >= 16) return std::nullopt;
  ReceivedChunk c;
  if (!buffer.Dump(&c.slices_).ok()) return std::nullopt;
  SliceCursor in(&c.slices_);
  if (in.Byte() != Tag(field, kLengthDelimited)) return std::nullopt;
  const std::optional<uint64_t> length = in.Varint();
  if (!length || *length != buffer.Length() - in.consumed()) return std::nullopt;
  const uint64_t end = in.consumed() + *length;
  std::optional<uint8_t> tag = in.Byte();
  if (tag == Tag(kOffsetField, kVarint)) {
    const std::optional<uint64_t> offset = in.Varint();
    if (!offset) return std::nullopt;
    c.offset_ = *offset;
    tag = in.Byte();
  }
  if (tag != Tag(kDataField, kLengthDelimited)) return std::nullopt;
  const std::optional<uint64_t> size = in.Varint();
  if (!size || *size > end - in.consumed() || !in.Take(*size, &c.pieces_)) {
    return std::nullopt;
  }
  c.size_ = *size;
  if (in.consumed() < end) {
    if (in.Byte() != Tag(kChecksumField, kVarint)) return std::nullopt;
    const std::optional<uint64_t> checksum = in.Varint();
    if (!checksum) return std::nullopt;
    c.checksum_ = *checksum;
  }
  if (in.consumed() != end || !in.AtEnd()) return std::nullopt;
  return c;
}

ReceivedChunk ReceivedChunk::Of(const v1::TensorChunk& chunk) {
  ReceivedChunk c;
  c.offset_ = chunk.offset();
  c.checksum_ = chunk.checksum();
  c.size_ = chunk.data().size();
  if (c.size_ > 0) c.pieces_.push_back(std::as_bytes(std::span(chunk.data())));
  return c;
}

void ReceivedChunk::CopyTo(std::span<std::byte> out) const {
  CountReceivedTensorBytes(size_);
  size_t at = 0;
  for (const std::span<const std::byte>& piece : pieces_) {
    std::memcpy(out.data() + at, piece.data(), piece.size());
    at += piece.size();
  }
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

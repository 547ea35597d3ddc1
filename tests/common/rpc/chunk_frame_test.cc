// SPDX-License-Identifier: Apache-2.0
// A chunk frame is the message protobuf would write, byte for byte, and its
// tensor bytes are not copied: the frame points into them and keeps them
// alive until gRPC lets go. A copied frame is the same message, with the
// checksum ChunkToProto gives it.
#include "common/rpc/chunk_frame.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/rpc/chunks.h"
#include "repvar/v1/worker.pb.h"

namespace repvar {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string Serialized(uint64_t offset, std::span<const std::byte> piece, uint64_t checksum) {
  v1::WriteReplicasRequest m;
  ChunkToProto(offset, piece, m.mutable_chunk());
  m.mutable_chunk()->set_checksum(checksum);
  std::string out;
  EXPECT_TRUE(m.SerializeToString(&out));
  return out;
}

class ChunkFrameTest : public ::testing::Test {
  grpc::internal::GrpcLibraryInitializer init_;  // ByteBuffer needs gRPC's core
};

TEST_F(ChunkFrameTest, SameBytesAsProtobufWrites_ForEveryFieldAtAndAwayFromItsDefault) {
  auto owner = std::make_shared<std::vector<std::byte>>(300000);
  for (size_t i = 0; i < owner->size(); ++i) (*owner)[i] = std::byte(i * 7 + 3);
  const std::span<const std::byte> all(*owner);
  struct Case {
    uint64_t offset;
    size_t begin, size;
    uint64_t checksum;
  };
  // Offsets and sizes across varint widths; a zero offset or checksum is
  // left out, as protobuf leaves out a proto3 field at its default.
  for (const Case& c : std::vector<Case>{{0, 0, 1, 0},
                                         {0, 0, 127, 1},
                                         {127, 5, 128, Checksum(all.subspan(5, 128))},
                                         {16384, 0, 16383, 0},
                                         {1ull << 40, 10, 300000 - 10, ~0ull},
                                         {5, 0, 0, 7},
                                         {0, 0, 0, 0}}) {
    const std::span<const std::byte> piece = all.subspan(c.begin, c.size);
    grpc::ByteBuffer frame =
        ChunkFrame(v1::WriteReplicasRequest::kChunkFieldNumber, c.offset, piece, c.checksum, owner);
    const std::string wire = Flatten(frame);
    EXPECT_EQ(wire, Serialized(c.offset, piece, c.checksum))
        << "offset " << c.offset << " size " << c.size << " checksum " << c.checksum;
    EXPECT_EQ(
        Flatten(CopiedChunkFrame(v1::WriteReplicasRequest::kChunkFieldNumber, c.offset, piece)),
        Serialized(c.offset, piece, Checksum(piece)))
        << "copied: offset " << c.offset << " size " << c.size;
    v1::WriteReplicasRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire));
    ASSERT_TRUE(parsed.has_chunk());
    EXPECT_EQ(parsed.chunk().offset(), c.offset);
    EXPECT_EQ(parsed.chunk().checksum(), c.checksum);
    EXPECT_EQ(parsed.chunk().data(),
              std::string(reinterpret_cast<const char*>(piece.data()), piece.size()));
  }
}

TEST_F(ChunkFrameTest, PointsIntoTheBytes_AndHoldsTheirOwnerUntilReleased) {
  auto owner = std::make_shared<std::vector<std::byte>>(1 << 20, std::byte{9});
  const std::span<const std::byte> piece = std::span<const std::byte>(*owner).subspan(4096, 65536);
  {
    grpc::ByteBuffer frame =
        ChunkFrame(v1::WriteReplicasRequest::kChunkFieldNumber, 4096, piece, 42, owner);
    EXPECT_EQ(owner.use_count(), 2);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(frame.Dump(&slices).ok());
    bool aliased = false;
    for (const grpc::Slice& s : slices) {
      aliased |=
          s.begin() == reinterpret_cast<const uint8_t*>(piece.data()) && s.size() == piece.size();
    }
    EXPECT_TRUE(aliased) << "the frame copied the tensor's bytes";
    grpc::ByteBuffer copy = frame;  // gRPC's own copies share the slice
    frame.Clear();
    EXPECT_EQ(owner.use_count(), 2);
  }
  EXPECT_EQ(owner.use_count(), 1);
}

// `wire` as a byte buffer cut into slices at `cuts` (gRPC's reads cut a
// message anywhere).
grpc::ByteBuffer Sliced(const std::string& wire, std::vector<size_t> cuts) {
  cuts.push_back(wire.size());
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(wire.data() + at, cut - at);
    at = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST_F(ChunkFrameTest, ReceivedChunk_ReadsWhatProtobufWrites_CutAnywhere) {
  std::string data(70000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13 + 1);
  const auto bytes = std::as_bytes(std::span<const char>(data));
  for (uint64_t offset : {uint64_t{0}, uint64_t{300}, uint64_t{1} << 40}) {
    for (uint64_t checksum : {uint64_t{0}, Checksum(bytes)}) {
      const std::string wire = Serialized(offset, bytes, checksum);
      for (std::vector<size_t> cuts :
           std::vector<std::vector<size_t>>{{},
                                            {1},
                                            {2},
                                            {3},
                                            {7},
                                            {8},
                                            {9},
                                            {wire.size() - 1},
                                            {1, 2, 3, 4, 5, 6, 7, 8},
                                            {100, 100, 65536},
                                            {wire.size() - 9, wire.size() - 2}}) {
        auto chunk =
            ReceivedChunk::Parse(Sliced(wire, cuts), v1::WriteReplicasRequest::kChunkFieldNumber);
        ASSERT_TRUE(chunk.has_value()) << "offset " << offset << " cut at " << cuts.size();
        EXPECT_EQ(chunk->offset(), offset);
        EXPECT_EQ(chunk->checksum(), checksum);
        ASSERT_EQ(chunk->size(), data.size());
        std::string out(data.size(), '\0');
        chunk->CopyTo(std::as_writable_bytes(std::span<char>(out)));
        EXPECT_EQ(out, data);
      }
    }
  }
  // And what ChunkFrame sends, slices as they are.
  auto owner = std::make_shared<std::string>(data);
  auto chunk = ReceivedChunk::Parse(
      ChunkFrame(v1::WriteReplicasRequest::kChunkFieldNumber, 9, bytes, 5, owner),
      v1::WriteReplicasRequest::kChunkFieldNumber);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(chunk->offset(), 9u);
  EXPECT_EQ(chunk->checksum(), 5u);
}

TEST_F(ChunkFrameTest, ReceivedChunk_AnyOtherLayout_LeftToProtobuf) {
  const std::string piece = "abcd";
  const auto bytes = std::as_bytes(std::span<const char>(piece));
  const std::string good = Serialized(4, bytes, 7);
  ASSERT_TRUE(ReceivedChunk::Parse(Sliced(good, {}), 2).has_value());  // the control
  v1::WriteReplicasRequest header;
  header.mutable_header()->set_name("w");
  v1::TensorChunk reordered;  // checksum before data: valid protobuf, not ChunkFrame's order
  std::string inner;
  inner += '\x18';
  inner += '\x07';
  inner += '\x12';
  inner += '\x04';
  inner += piece;
  const std::string out_of_order = std::string("\x12") + static_cast<char>(inner.size()) + inner;
  ASSERT_TRUE(reordered.ParseFromString(inner));
  for (const std::string& wire : {
           header.SerializeAsString(),                               // another field of the oneof
           good + std::string("\x08\x01", 2),                        // a field after the chunk
           good.substr(0, good.size() - 1),                          // cut short
           out_of_order, std::string(), std::string("\x12\x00", 2),  // a chunk without data
       }) {
    EXPECT_FALSE(ReceivedChunk::Parse(Sliced(wire, {}), 2).has_value())
        << "bytes: " << ::testing::PrintToString(wire);
  }
  EXPECT_FALSE(ReceivedChunk::Parse(Sliced(good, {}), 1).has_value()) << "another field number";
}

}  // namespace
}  // namespace repvar

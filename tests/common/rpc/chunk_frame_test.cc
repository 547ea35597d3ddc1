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

}  // namespace
}  // namespace repvar

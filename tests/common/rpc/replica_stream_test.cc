// SPDX-License-Identifier: Apache-2.0
// A value read as byte buffers (the coordinator's ReadReplica calls, a
// step's StepRead, the client's ReadVariable) is rebuilt from what a daemon
// sends (SendTensorFrames) exactly as from the protobuf messages: the same
// value, every chunk checked, a bad stream refused.
#include "common/rpc/replica_stream.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/rpc/chunk_frame.h"
#include "common/rpc/chunks.h"
#include "common/rpc/to_proto.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

class ReplicaReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::byte> bytes(12000);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 13 + 1);
    auto t = Tensor::FromBytes(TensorSpec{DType::kFloat32, {3000}}, bytes);
    ASSERT_OK(t);
    value_ = std::make_shared<const Tensor>(*std::move(t));
  }

  // What a worker sends for the replica at `version`: a header, then
  // chunks of 4,096 bytes.
  std::vector<grpc::ByteBuffer> Frames(int64_t version) const {
    v1::ReadVariableChunk head;
    HeaderToProto(*value_, head.mutable_header());
    head.set_version(version);
    return FramesAfter(head);
  }
  // `head`, then the value in chunks of 4,096 bytes, as `Message`s.
  template <typename Message>
  std::vector<grpc::ByteBuffer> FramesAfter(const Message& head) const {
    std::vector<grpc::ByteBuffer> out;
    EXPECT_TRUE(SendTensorFrames(head, Message::kChunkFieldNumber, value_, 4096,
                                 [&](const grpc::ByteBuffer& m) {
                                   out.push_back(m);
                                   return true;
                                 }));
    return out;
  }

  static grpc::ByteBuffer AsBuffer(const google::protobuf::MessageLite& m) {
    return MessageFrame(m);
  }

  grpc::internal::GrpcLibraryInitializer init_;  // ByteBuffer needs gRPC's core
  std::shared_ptr<const Tensor> value_;
};

TEST_F(ReplicaReceiverTest, ChunkFrames_RebuildTheValue_AsTheProtobufMessagesDo) {
  ReplicaReceiver framed;
  ReplicaReceiver parsed;
  for (grpc::ByteBuffer& frame : Frames(7)) {
    // The same bytes parsed by protobuf, for the reference receiver.
    grpc::ByteBuffer copy(frame);
    v1::ReadVariableChunk msg;
    ASSERT_TRUE(grpc::SerializationTraits<v1::ReadVariableChunk>::Deserialize(&copy, &msg).ok());
    ASSERT_OK(parsed.OnMessage(msg));
    ASSERT_OK(framed.OnFrame(frame));
  }
  auto a = framed.Finish();
  auto b = parsed.Finish();
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a->version, 7);
  EXPECT_EQ(a->version, b->version);
  EXPECT_EQ(a->value.checksum, value_->checksum);
  ASSERT_EQ(a->value.bytes.size(), value_->bytes.size());
  EXPECT_EQ(std::memcmp(a->value.bytes.data(), value_->bytes.data(), value_->bytes.size()), 0);
  EXPECT_EQ(std::memcmp(b->value.bytes.data(), value_->bytes.data(), value_->bytes.size()), 0);
}

// A chunk in another layout (a field protobuf accepts but ChunkFrame never
// writes) is parsed by protobuf and taken; a wrong checksum, a chunk before
// the header and a message that does not parse are refused. (A parsed
// buffer is used up: each case reads fresh frames.)
TEST_F(ReplicaReceiverTest, OtherLayoutTaken_BadChecksum_ChunkBeforeHeader_Unparseable_Refused) {
  {
    ReplicaReceiver r;
    ASSERT_OK(r.OnFrame(Frames(3)[0]));
    ForEachChunk(value_->bytes.span(), 4096, [&](uint64_t off, std::span<const std::byte> piece) {
      v1::ReadVariableChunk msg;
      ChunkToProto(off, piece, msg.mutable_chunk());
      msg.set_version(3);  // not where a chunk frame has it: left to protobuf
      grpc::ByteBuffer b = AsBuffer(msg);
      ASSERT_FALSE(ReceivedChunk::Parse(b, v1::ReadVariableChunk::kChunkFieldNumber));
      ASSERT_OK(r.OnFrame(b));
    });
    auto got = r.Finish();
    ASSERT_OK(got);
    EXPECT_EQ(got->value.checksum, value_->checksum);
  }
  {
    ReplicaReceiver r;
    ASSERT_OK(r.OnFrame(Frames(3)[0]));
    const auto piece = value_->bytes.span().subspan(0, 4096);
    grpc::ByteBuffer bad =
        ChunkFrame(v1::ReadVariableChunk::kChunkFieldNumber, 0, piece, Checksum(piece) + 1, value_);
    EXPECT_THAT(r.OnFrame(bad), StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  {
    ReplicaReceiver r;
    EXPECT_THAT(r.OnFrame(Frames(3)[1]),
                StatusIs(absl::StatusCode::kDataLoss, "before the header"));
  }
  {
    ReplicaReceiver r;
    const std::string junk = "\x0a\xff\xff\xff\xff\x0f";  // a length past the end
    grpc::Slice slice(junk.data(), junk.size());
    grpc::ByteBuffer b(&slice, 1);
    EXPECT_THAT(r.OnFrame(b), StatusIs(absl::StatusCode::kInvalidArgument, "does not parse"));
  }
}

// A receiver into the caller's memory takes the same frames: into a buffer
// of the value's size, or a vector sized as they arrive, each chunk checked
// there. A header of another size than the buffer, one above the vector's
// limit and a second header are refused.
TEST_F(ReplicaReceiverTest, IntoCallersMemory_TheSameValue_OtherSizesAndSecondHeadersRefused) {
  std::vector<std::byte> out(value_->bytes.size());
  ReplicaReceiver into(out);
  std::vector<std::byte> grow;
  ReplicaReceiver grown(&grow, value_->bytes.size());
  for (grpc::ByteBuffer& frame : Frames(5)) {
    grpc::ByteBuffer copy(frame);
    ASSERT_OK(into.OnFrame(frame));
    ASSERT_OK(grown.OnFrame(copy));
  }
  EXPECT_THAT(into.Finish(), StatusIs(absl::StatusCode::kFailedPrecondition));
  for (ReplicaReceiver* r : {&into, &grown}) {
    auto got = r->FinishInPlace();
    ASSERT_OK(got);
    EXPECT_EQ(got->version, 5);
    EXPECT_EQ(got->header.checksum, value_->checksum);
    EXPECT_EQ(got->header.spec, value_->spec);
  }
  const std::vector<std::byte> want(value_->bytes.span().begin(), value_->bytes.span().end());
  EXPECT_EQ(out, want);
  EXPECT_EQ(grow, want);
  {
    std::vector<std::byte> smaller(value_->bytes.size() - 4);
    ReplicaReceiver r(smaller);
    EXPECT_THAT(r.OnFrame(Frames(5)[0]), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  {
    std::vector<std::byte> g;
    ReplicaReceiver r(&g, value_->bytes.size() - 1);
    EXPECT_THAT(r.OnFrame(Frames(5)[0]), StatusIs(absl::StatusCode::kResourceExhausted));
  }
  {
    ReplicaReceiver r;
    ASSERT_OK(r.OnFrame(Frames(5)[0]));
    EXPECT_THAT(r.OnFrame(Frames(5)[0]), StatusIs(absl::StatusCode::kDataLoss, "second header"));
  }
}

// The coordinator's ReadVariable stream (its header inside a ReadHeader)
// goes through the same receiver: the same value and version into the
// caller's buffer, the header's size told to a caller whose buffer is of
// another size, a bad chunk and a second header refused.
TEST_F(ReplicaReceiverTest, TheCoordinatorsReadStream_TheSameReceiver_TheSameChecks) {
  auto frames = [&] {
    v1::ReadVariableResponse head;
    HeaderToProto(*value_, head.mutable_header()->mutable_tensor());
    head.mutable_header()->set_version(11);
    return FramesAfter(head);
  };
  std::vector<std::byte> out(value_->bytes.size());
  ReadReceiver into(out);
  EXPECT_EQ(into.announced_bytes(), std::nullopt);
  for (grpc::ByteBuffer& frame : frames()) ASSERT_OK(into.OnFrame(frame));
  auto got = into.FinishInPlace();
  ASSERT_OK(got);
  EXPECT_EQ(got->version, 11);
  EXPECT_EQ(got->header.checksum, value_->checksum);
  EXPECT_EQ(into.announced_bytes(), value_->bytes.size());
  EXPECT_EQ(out, std::vector<std::byte>(value_->bytes.span().begin(), value_->bytes.span().end()));
  {
    std::vector<std::byte> larger(value_->bytes.size() + 4);
    ReadReceiver r(larger);
    EXPECT_THAT(r.OnFrame(frames()[0]), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(r.announced_bytes(), value_->bytes.size());
  }
  {
    ReadReceiver r;
    std::vector<grpc::ByteBuffer> f = frames();
    ASSERT_OK(r.OnFrame(f[0]));
    const auto piece = value_->bytes.span().subspan(0, 4096);
    grpc::ByteBuffer bad = ChunkFrame(v1::ReadVariableResponse::kChunkFieldNumber, 0, piece,
                                      Checksum(piece) ^ 1, value_);
    EXPECT_THAT(r.OnFrame(bad), StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  {
    ReadReceiver r;
    ASSERT_OK(r.OnFrame(frames()[0]));
    EXPECT_THAT(r.OnFrame(frames()[0]), StatusIs(absl::StatusCode::kDataLoss, "second header"));
  }
}

// A stream scripted frame by frame, for ReceiveFrames.
class ScriptedReader final : public grpc::ClientReaderInterface<grpc::ByteBuffer> {
 public:
  ScriptedReader(std::vector<grpc::ByteBuffer> frames, grpc::Status end)
      : frames_(std::move(frames)), end_(std::move(end)) {}
  bool Read(grpc::ByteBuffer* msg) override {
    if (next_ >= frames_.size()) return false;
    *msg = frames_[next_++];
    return true;
  }
  grpc::Status Finish() override { return end_; }
  bool NextMessageSize(uint32_t* size) override {
    *size = 1 << 20;
    return true;
  }
  void WaitForInitialMetadata() override {}
  size_t read() const { return next_; }

 private:
  std::vector<grpc::ByteBuffer> frames_;
  grpc::Status end_;
  size_t next_ = 0;
};

// ReceiveFrames: a whole stream is received; a damaged one stops at
// the frame at fault and is DATA_LOSS (the receiver's INVALID_ARGUMENT is
// the stream's damage, not the caller's mistake); the call's own error
// (a worker's NOT_FOUND) comes back as it is.
TEST_F(ReplicaReceiverTest, ReceiveFrames_DamageIsDataLoss_TheCallsOwnErrorsPassThrough) {
  {
    ScriptedReader reader(Frames(2), grpc::Status::OK);
    grpc::ClientContext ctx;
    ReplicaReceiver r;
    ASSERT_OK(ReceiveFrames(ctx, reader, r));
    auto got = r.Finish();
    ASSERT_OK(got);
    EXPECT_EQ(got->value.checksum, value_->checksum);
  }
  {
    std::vector<grpc::ByteBuffer> frames = Frames(2);
    const auto piece = value_->bytes.span().subspan(0, 4096);
    frames[1] =
        ChunkFrame(v1::ReadVariableChunk::kChunkFieldNumber, 0, piece, Checksum(piece) ^ 1, value_);
    ScriptedReader reader(frames, grpc::Status::OK);
    grpc::ClientContext ctx;
    ReplicaReceiver r;
    EXPECT_THAT(ReceiveFrames(ctx, reader, r), StatusIs(absl::StatusCode::kDataLoss, "checksum"));
    EXPECT_EQ(reader.read(), 2u) << "stopped at the damaged frame";
  }
  {
    ScriptedReader reader({}, grpc::Status(grpc::StatusCode::NOT_FOUND, "no replica 9"));
    grpc::ClientContext ctx;
    ReplicaReceiver r;
    EXPECT_THAT(ReceiveFrames(ctx, reader, r),
                StatusIs(absl::StatusCode::kNotFound, "no replica 9"));
  }
}

}  // namespace
}  // namespace repvar

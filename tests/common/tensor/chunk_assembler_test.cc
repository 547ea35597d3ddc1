// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/chunk_assembler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "common/tensor/element_math.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

Tensor Iota(int n) {
  auto t = Tensor::Zeros(TensorSpec{DType::kFloat32, {n}});
  for (int i = 0; i < n; ++i) StoreElement(*t, i, i);
  t->UpdateChecksum();
  return *std::move(t);
}

TEST(ChunkAssembler, InOrderChunks_RebuildTheTensor) {
  Tensor src = Iota(1000);
  auto a = ChunkAssembler::Start(src.spec, src.bytes.size(), src.checksum, UINT64_MAX);
  ASSERT_OK(a);
  ForEachChunk(src.bytes.span(), 1000, [&](uint64_t off, std::span<const std::byte> p) {
    ASSERT_OK(a->Add(off, p, Checksum(p)));
  });
  auto t = a->Finish();
  ASSERT_OK(t);
  EXPECT_EQ(std::memcmp(t->bytes.data(), src.bytes.data(), src.bytes.size()), 0);
}

TEST(ChunkAssembler, BadInput_InvalidArgument) {
  Tensor src = Iota(1000);
  auto bytes = src.bytes.span();
  auto start = [&] {
    return *ChunkAssembler::Start(src.spec, bytes.size(), src.checksum, UINT64_MAX);
  };
  {  // out of order
    auto a = start();
    EXPECT_THAT(a.Add(100, bytes.subspan(100, 100), Checksum(bytes.subspan(100, 100))),
                StatusIs(absl::StatusCode::kInvalidArgument, "out of order"));
  }
  {  // bad chunk checksum
    auto a = start();
    EXPECT_THAT(a.Add(0, bytes.subspan(0, 100), 1234),
                StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  {  // truncated
    auto a = start();
    ASSERT_OK(a.Add(0, bytes.subspan(0, 100), Checksum(bytes.subspan(0, 100))));
    EXPECT_THAT(a.Finish(), StatusIs(absl::StatusCode::kInvalidArgument, "truncated"));
  }
  {  // whole-tensor checksum
    auto a = *ChunkAssembler::Start(src.spec, bytes.size(), src.checksum + 1, UINT64_MAX);
    ASSERT_OK(a.Add(0, bytes, Checksum(bytes)));
    EXPECT_THAT(a.Finish(), StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  {  // overrun: header says fewer bytes than the spec
    EXPECT_THAT(ChunkAssembler::Start(src.spec, 10, 0, UINT64_MAX),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  {  // too big
    EXPECT_THAT(ChunkAssembler::Start(src.spec, bytes.size(), 0, 100),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }
}

// A chunk copied into place by its receiver (in pieces, from gRPC's slices)
// is checked on what was copied: a damaged one is refused and leaves nothing
// received, and the good one after it completes the tensor.
TEST(ChunkAssembler, FilledInPlace_CheckedOnTheCopy_ARefusedChunkLeavesNothing) {
  Tensor src = Iota(1000);
  const auto bytes = src.bytes.span();
  auto a = *ChunkAssembler::Start(src.spec, bytes.size(), src.checksum, UINT64_MAX);
  auto fill_from = [](std::span<const std::byte> from, bool damage) {
    return [from, damage](std::span<std::byte> out) {
      ASSERT_EQ(out.size(), from.size());
      std::memcpy(out.data(), from.data(), 7);  // in two pieces
      std::memcpy(out.data() + 7, from.data() + 7, from.size() - 7);
      if (damage) out[3] ^= std::byte{1};
    };
  };
  const auto first = bytes.subspan(0, 1000);
  EXPECT_THAT(a.Add(0, first.size(), Checksum(first), fill_from(first, true)),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum mismatch in chunk at 0"));
  EXPECT_EQ(a.received(), 0u);
  ASSERT_OK(a.Add(0, first.size(), Checksum(first), fill_from(first, false)));
  const auto rest = bytes.subspan(1000);
  ASSERT_OK(a.Add(1000, rest.size(), Checksum(rest), fill_from(rest, false)));
  auto t = a.Finish();
  ASSERT_OK(t);
  EXPECT_EQ(std::memcmp(t->bytes.data(), src.bytes.data(), src.bytes.size()), 0);
}

// A third-party sender may leave checksums out (0, protobuf's default): the
// receiver computes them; any other value is still checked.
// A forwarding daemon sends on the chunk sums it verified instead of hashing
// the bytes again: kept only for even chunks that all came with a checksum,
// and only for the same chunks (any other range is hashed).
TEST(ChunkAssembler, VerifiedChunkSums_KeptForEvenChunks_SentOnForTheSameChunksOnly) {
  Tensor src = Iota(640);  // 2,560 bytes: chunks of 1,024, 1,024 and 512
  auto assemble = [&](std::vector<size_t> sizes, bool sums) {
    auto a = ChunkAssembler::Start(src.spec, src.bytes.size(), src.checksum, UINT64_MAX);
    EXPECT_OK(a);
    uint64_t off = 0;
    for (size_t n : sizes) {
      auto piece = src.bytes.span().subspan(off, n);
      EXPECT_OK(a->Add(off, piece, sums ? Checksum(piece) : kChecksumNotGiven));
      off += n;
    }
    auto t = a->Finish();
    EXPECT_OK(t);
    return *std::move(t);
  };
  Tensor t = assemble({1024, 1024, 512}, true);
  ASSERT_EQ(t.chunk_checksums.chunk_bytes, 1024u);
  ASSERT_EQ(t.chunk_checksums.sums.size(), 3u);
  for (uint64_t off : {0, 1024, 2048}) {
    const size_t n = std::min<size_t>(1024, src.bytes.size() - off);
    EXPECT_EQ(t.chunk_checksums.sums[off / 1024], Checksum(src.bytes.span().subspan(off, n)));
  }

  // The kept sum is what a sender of that chunk gets (a wrong one shows it
  // was not hashed again; the next receiver would refuse it); any other
  // range is hashed.
  Tensor marked = std::move(t);
  marked.chunk_checksums.sums[1] ^= 1;
  const auto range = [&](uint64_t off, size_t n) {
    return Checksum(src.bytes.span().subspan(off, n));
  };
  EXPECT_EQ(marked.ChunkChecksum(1024, 1024), range(1024, 1024) ^ 1);
  EXPECT_EQ(marked.ChunkChecksum(2048, 512), range(2048, 512));
  EXPECT_EQ(marked.ChunkChecksum(1024, 512), range(1024, 512));
  EXPECT_EQ(marked.ChunkChecksum(512, 1024), range(512, 1024));
  EXPECT_EQ(marked.ChunkChecksum(0, 2048), range(0, 2048));
  {  // ...and the next receiver refuses it: every hop checks every chunk.
    auto next = ChunkAssembler::Start(src.spec, src.bytes.size(), src.checksum, UINT64_MAX);
    ASSERT_OK(next);
    const auto bytes = marked.bytes.span();
    ASSERT_OK(next->Add(0, bytes.subspan(0, 1024), marked.ChunkChecksum(0, 1024)));
    EXPECT_THAT(next->Add(1024, bytes.subspan(1024, 1024), marked.ChunkChecksum(1024, 1024)),
                StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  }
  marked.UpdateChecksum();  // the bytes were rewritten: the sums go
  EXPECT_EQ(marked.ChunkChecksum(1024, 1024), range(1024, 1024));

  // Not kept: a short chunk before the last, a larger one after the first,
  // chunks without a checksum.
  EXPECT_EQ(assemble({1024, 512, 1024}, true).chunk_checksums.chunk_bytes, 0u);
  EXPECT_EQ(assemble({512, 1024, 1024}, true).chunk_checksums.chunk_bytes, 0u);
  EXPECT_EQ(assemble({1024, 1024, 512}, false).chunk_checksums.chunk_bytes, 0u);
  EXPECT_EQ(assemble({2560}, true).chunk_checksums.sums.size(), 1u);  // one chunk: kept
}

TEST(ChunkAssembler, ChecksumZero_IsNotGiven_TheReceiverComputesIt) {
  Tensor src = Iota(1000);
  auto bytes = src.bytes.span();
  auto a = ChunkAssembler::Start(src.spec, bytes.size(), kChecksumNotGiven, UINT64_MAX);
  ASSERT_OK(a);
  ASSERT_OK(a->Add(0, bytes.subspan(0, 2000), kChecksumNotGiven));
  ASSERT_OK(a->Add(2000, bytes.subspan(2000), Checksum(bytes.subspan(2000))));
  auto t = a->Finish();
  ASSERT_OK(t);
  EXPECT_EQ(t->checksum, src.checksum);
  auto b = ChunkAssembler::Start(src.spec, bytes.size(), kChecksumNotGiven, UINT64_MAX);
  EXPECT_THAT(b->Add(0, bytes.subspan(0, 2000), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum mismatch"));
}

// Resident memory of this process, from /proc.
uint64_t RssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long pages = 0, resident = 0;
  EXPECT_EQ(std::fscanf(f, "%lu %lu", &pages, &resident), 2);
  std::fclose(f);
  return resident * 4096;
}

// A header announcing 1 GiB costs nothing until bytes come; memory then
// follows the bytes, within the budget, and goes back when the assembly
// is dropped.
TEST(ChunkAssembler, AnnouncedBytes_NoMemoryUntilTheyArrive_ThenWithinTheBudget) {
  MemoryBudget budget(64 << 20);
  const int64_t n = int64_t{1} << 28;  // 1 GiB of float32
  const uint64_t before = RssBytes();
  {
    auto a = ChunkAssembler::Start(TensorSpec{DType::kFloat32, {n}}, uint64_t(n) * 4, 0, UINT64_MAX,
                                   &budget);
    ASSERT_OK(a);
    EXPECT_EQ(budget.used(), 0u);
    EXPECT_LT(RssBytes() - before, uint64_t{16} << 20);
    std::vector<std::byte> chunk(kMaxChunkBytes, std::byte{1});
    const uint64_t sum = Checksum(chunk);
    uint64_t offset = 0;
    absl::Status s;
    while ((s = a->Add(offset, chunk, sum)).ok()) offset += chunk.size();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "bytes of memory"));
    EXPECT_GT(offset, 0u);
    EXPECT_LE(budget.used(), budget.capacity());
    EXPECT_GE(budget.used(), offset);
    EXPECT_LT(RssBytes() - before, uint64_t{128} << 20);
  }
  EXPECT_EQ(budget.used(), 0u);
}

TEST(ChunkAssembler, SmallTensors_ChargedWhole_ReleasedWithTheCharge) {
  MemoryBudget budget(1 << 20);
  Tensor src = Iota(1000);
  auto a = ChunkAssembler::Start(src.spec, src.bytes.size(), src.checksum, UINT64_MAX, &budget);
  ASSERT_OK(a);
  EXPECT_EQ(budget.used(), src.bytes.size());
  ASSERT_OK(a->Add(0, src.bytes.span(), src.checksum));
  ASSERT_OK(a->Finish());
  MemoryCharge held = a->TakeCharge();
  a = absl::InternalError("dropped");
  EXPECT_EQ(budget.used(), src.bytes.size()) << "the taker holds it";
  held.Reset();
  EXPECT_EQ(budget.used(), 0u);
  // Too big for the budget at all: refused at Start.
  Tensor big = Iota(300000);  // 1.2 MiB: a heap buffer, resident at once
  EXPECT_THAT(ChunkAssembler::Start(big.spec, big.bytes.size(), big.checksum, UINT64_MAX, &budget),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

// StartInto(span): the bytes land in the caller's memory, each chunk checked
// there, and nothing of the value's size is allocated; the checks are
// Start's.
TEST(ChunkAssembler, IntoCallersMemory_TheSameChecks_ARefusedChunkLeavesNothing) {
  Tensor src = Iota(1000);
  const TensorHeader header{src.spec, src.bytes.size(), src.checksum};
  std::vector<std::byte> out(src.bytes.size());
  {
    auto a = ChunkAssembler::StartInto(header, std::span(out));
    ASSERT_OK(a);
    ForEachChunk(src.bytes.span(), 1000, [&](uint64_t off, std::span<const std::byte> p) {
      ASSERT_OK(a->Add(off, p, Checksum(p)));
    });
    EXPECT_THAT(a->Finish(), StatusIs(absl::StatusCode::kFailedPrecondition));
    auto sum = a->FinishInPlace();
    ASSERT_OK(sum);
    EXPECT_EQ(*sum, src.checksum);
    EXPECT_EQ(std::memcmp(out.data(), src.bytes.data(), out.size()), 0);
  }
  // A buffer of another size: refused before anything is written.
  std::vector<std::byte> small(src.bytes.size() - 4, std::byte{7});
  EXPECT_THAT(ChunkAssembler::StartInto(header, std::span(small)),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot fill a buffer"));
  EXPECT_EQ(small, std::vector<std::byte>(small.size(), std::byte{7}));
  // A bad chunk is refused and counts for nothing; a gap and a short value
  // are refused as with Start.
  auto bytes = src.bytes.span();
  auto a = ChunkAssembler::StartInto(header, std::span(out));
  ASSERT_OK(a);
  EXPECT_THAT(a->Add(0, bytes.subspan(0, 100), 1234),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  EXPECT_EQ(a->received(), 0u);
  EXPECT_THAT(a->Add(100, bytes.subspan(100, 100), Checksum(bytes.subspan(100, 100))),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of order"));
  ASSERT_OK(a->Add(0, bytes.subspan(0, 100), Checksum(bytes.subspan(0, 100))));
  EXPECT_THAT(a->FinishInPlace(), StatusIs(absl::StatusCode::kInvalidArgument, "truncated"));
  // The whole value's checksum is checked at the end.
  auto wrong =
      ChunkAssembler::StartInto({src.spec, src.bytes.size(), src.checksum + 1}, std::span(out));
  ASSERT_OK(wrong);
  ASSERT_OK(wrong->Add(0, bytes, src.checksum));
  EXPECT_THAT(wrong->FinishInPlace(), StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  // A read's sender gives every checksum: 0 is not "not given" here, for a
  // chunk or for the whole (Start takes it so: ChecksumZero_* above).
  auto unsummed = ChunkAssembler::StartInto(header, std::span(out));
  ASSERT_OK(unsummed);
  EXPECT_THAT(unsummed->Add(0, bytes, kChecksumNotGiven),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  auto unsummed_whole = ChunkAssembler::StartInto({src.spec, src.bytes.size(), 0}, std::span(out));
  ASSERT_OK(unsummed_whole);
  ASSERT_OK(unsummed_whole->Add(0, bytes, src.checksum));
  EXPECT_THAT(unsummed_whole->FinishInPlace(),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  // Start's tensor is not in place.
  auto own = ChunkAssembler::Start(header, UINT64_MAX);
  ASSERT_OK(own);
  ASSERT_OK(own->Add(0, bytes, Checksum(bytes)));
  EXPECT_THAT(own->FinishInPlace(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

// StartInto(vector): the vector is sized as the bytes arrive (a refused
// chunk takes its room back), within `max_bytes`; a header announcing more
// is refused before anything is reserved.
TEST(ChunkAssembler, IntoAGrowingVector_SizedAsBytesArrive_WithinTheLimit) {
  Tensor src = Iota(3000);
  const TensorHeader header{src.spec, src.bytes.size(), src.checksum};
  auto bytes = src.bytes.span();
  std::vector<std::byte> grow(5, std::byte{1});  // emptied first
  auto a = ChunkAssembler::StartInto(header, &grow, src.bytes.size());
  ASSERT_OK(a);
  EXPECT_TRUE(grow.empty());
  ASSERT_OK(a->Add(0, bytes.subspan(0, 4096), Checksum(bytes.subspan(0, 4096))));
  EXPECT_EQ(grow.size(), 4096u);
  EXPECT_THAT(a->Add(4096, bytes.subspan(4096, 4096), 1234),
              StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  EXPECT_EQ(grow.size(), 4096u) << "a refused chunk leaves nothing";
  ASSERT_OK(a->Add(4096, bytes.subspan(4096), Checksum(bytes.subspan(4096))));
  auto sum = a->FinishInPlace();
  ASSERT_OK(sum);
  EXPECT_EQ(*sum, src.checksum);
  EXPECT_EQ(grow, std::vector<std::byte>(bytes.begin(), bytes.end()));
  // Over the limit: RESOURCE_EXHAUSTED, the vector untouched. A self-
  // consistent header of 2^62 bytes is the case a limit exists for.
  std::vector<std::byte> kept(3, std::byte{9});
  const int64_t huge = int64_t{1} << 60;
  EXPECT_THAT(ChunkAssembler::StartInto(
                  TensorHeader{TensorSpec{DType::kFloat32, {huge}}, uint64_t(huge) * 4, 0}, &kept,
                  uint64_t{1} << 40),
              StatusIs(absl::StatusCode::kResourceExhausted, "exceeds the limit"));
  EXPECT_THAT(ChunkAssembler::StartInto(header, &kept, src.bytes.size() - 1),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(kept, std::vector<std::byte>(3, std::byte{9}));
  // A header whose size is not its shape's, as with Start.
  EXPECT_THAT(ChunkAssembler::StartInto({src.spec, src.bytes.size() + 4, 0}, &kept, UINT64_MAX),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// X3 for a read's vector: a header announcing 1 GiB reserves room but makes
// none of it resident; memory follows the chunks as they arrive.
TEST(ChunkAssembler, IntoAGrowingVector_AnnouncedBytes_NoMemoryUntilTheyArrive) {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of float32
  std::vector<std::byte> grow;
  const uint64_t before = RssBytes();
  auto a = ChunkAssembler::StartInto(
      TensorHeader{TensorSpec{DType::kFloat32, {n}}, uint64_t(n) * 4, 0}, &grow, UINT64_MAX);
  ASSERT_OK(a);
  EXPECT_LT(RssBytes() - before, uint64_t{16} << 20);
  std::vector<std::byte> chunk(kMaxChunkBytes, std::byte{1});
  const uint64_t sum = Checksum(chunk);
  for (uint64_t offset = 0; offset < uint64_t{8} * chunk.size(); offset += chunk.size()) {
    ASSERT_OK(a->Add(offset, chunk, sum));
  }
  EXPECT_EQ(grow.size(), 8 * chunk.size());
  EXPECT_LT(RssBytes() - before, uint64_t{8} * chunk.size() + (uint64_t{48} << 20));
}

}  // namespace
}  // namespace repvar

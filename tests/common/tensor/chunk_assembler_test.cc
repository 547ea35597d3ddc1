// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/chunk_assembler.h"

#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace repvar

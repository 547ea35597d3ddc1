// SPDX-License-Identifier: Apache-2.0
// Buffers: a file mapping holds the file's bytes without copying them into
// memory (and refuses a file of another size); released mappings return to
// the system once idle; a vector reserved for a bulk read asks for huge
// pages before it is touched.
#include "common/tensor/buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar {
namespace {

using ::repvar::testing::StatusIs;

// Every buffer is aligned for any element type (16); from 4 KiB up to
// 64, a cache line, for vector loads over large tensors. Each holds its
// bytes and frees with the allocator it came from (ASan checks the pair).
TEST(BufferTest, Allocate_AlignedForAnyElement_ACacheLineFromFourKiB) {
  for (size_t size : {size_t{1}, size_t{64}, size_t{4095}, size_t{4096}, size_t{100000}}) {
    auto b = Buffer::Allocate(size);
    ASSERT_OK(b);
    ASSERT_EQ(b->size(), size);
    const auto address = reinterpret_cast<uintptr_t>(b->data());
    EXPECT_EQ(address % 16, 0u) << size;
    if (size >= 4096) {
      EXPECT_EQ(address % 64, 0u) << size;
    }
    std::memset(b->data(), 0xab, size);
    Buffer moved = *std::move(b);
    EXPECT_EQ(moved.data()[size - 1], std::byte{0xab});
  }
}

TEST(BufferTest, MapFile_TheFilesBytes_OfExactlyTheRecordedSize) {
  repvar::testing::TempDir dir;
  const std::string path = dir.path() + "/blob";
  std::string bytes(3 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  std::ofstream(path, std::ios::binary) << bytes;

  auto b = Buffer::MapFile(path, bytes.size());
  ASSERT_OK(b);
  EXPECT_TRUE(b->file_backed());
  ASSERT_EQ(b->size(), bytes.size());
  EXPECT_EQ(std::memcmp(b->data(), bytes.data(), bytes.size()), 0);
  EXPECT_EQ(b->Prefault(b->size()), 0u) << "a read-only mapping is never written";

  // The mapping outlives the file's name (a blob collected while read).
  std::filesystem::remove(path);
  EXPECT_EQ(std::memcmp(b->data() + 12345, bytes.data() + 12345, 1000), 0);
  const size_t pooled = PooledBufferBytes();
  *b = Buffer();
  EXPECT_EQ(PooledBufferBytes(), pooled) << "a file mapping is unmapped, not pooled";
}

TEST(BufferTest, MapFile_OtherSizeIsDataLoss_MissingIsNotFound) {
  repvar::testing::TempDir dir;
  const std::string path = dir.path() + "/blob";
  std::ofstream(path, std::ios::binary) << std::string(100, 'x');
  EXPECT_THAT(Buffer::MapFile(path, 400),
              StatusIs(absl::StatusCode::kDataLoss, path + " has 100 bytes, not 400"));
  EXPECT_OK(Buffer::MapFile(path, 100));
  EXPECT_THAT(Buffer::MapFile(dir.path() + "/none", 100), StatusIs(absl::StatusCode::kNotFound));
}

TEST(BufferTest, ReleaseIdleBuffers_UnmapsOnlyMappingsIdleThatLong) {
  ReleaseIdleBuffers(absl::ZeroDuration());
  ASSERT_EQ(PooledBufferBytes(), 0u);
  {
    auto b = Buffer::Allocate(4 << 20);
    ASSERT_OK(b);
  }
  EXPECT_GE(PooledBufferBytes(), size_t{4} << 20) << "released into the pool for reuse";
  EXPECT_EQ(ReleaseIdleBuffers(absl::Hours(1)), 0u);
  EXPECT_GE(PooledBufferBytes(), size_t{4} << 20);
  EXPECT_GE(ReleaseIdleBuffers(absl::ZeroDuration()), size_t{4} << 20);
  EXPECT_EQ(PooledBufferBytes(), 0u);
}

// The VmFlags line of the mapping in /proc/self/smaps that holds `p`.
std::string VmFlagsAt(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(BufferTest, ReserveForBulk_KeepsTheBytes_AsksForHugePagesBeforeTouching) {
  std::vector<std::byte> v = {std::byte{7}, std::byte{9}};
  const size_t n = size_t{16} << 20;
  ReserveForBulk(v, n);
  ASSERT_GE(v.capacity(), n);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0], std::byte{7});
  EXPECT_EQ(v[1], std::byte{9});
  const auto start = reinterpret_cast<uintptr_t>(v.data());
  const uintptr_t huge = (start + (2 << 20) - 1) / (2 << 20) * (2 << 20);  // inside the block
  EXPECT_NE(VmFlagsAt(reinterpret_cast<const void*>(huge)).find(" hg"), std::string::npos)
      << VmFlagsAt(reinterpret_cast<const void*>(huge));

  std::vector<std::byte> small;
  ReserveForBulk(small, 100);
  EXPECT_GE(small.capacity(), 100u);
  const std::byte* before = v.data();
  ReserveForBulk(v, n / 2);  // room enough: nothing moves
  EXPECT_EQ(v.data(), before);
}

TEST(BufferTest, AssignBulk_HoldsExactlyTheBytes_WhateverWasThere) {
  std::vector<std::byte> v(5, std::byte{1});
  for (size_t n : {size_t{0}, size_t{3}, size_t{3} << 20}) {
    std::vector<std::byte> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
    AssignBulk(v, src);
    EXPECT_EQ(v, src) << n;
  }
}

// Whether each 4 KiB page of [p, p + n) is resident (mincore).
std::vector<bool> Resident(const std::byte* p, size_t n) {
  const auto start = reinterpret_cast<uintptr_t>(p) / 4096 * 4096;
  const size_t pages = (reinterpret_cast<uintptr_t>(p) + n - start + 4095) / 4096;
  std::vector<unsigned char> in(pages);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(start), pages * 4096, in.data()), 0);
  std::vector<bool> out;
  for (unsigned char c : in) out.push_back(c & 1);
  return out;
}

// The room up to the bytes about to arrive becomes resident, not the rest
// of what was reserved (an announced size costs no memory), and the bytes
// already there are kept.
TEST(BufferTest, MakeRoomResident_UpToTheArrivingBytes_NotTheWholeReservation) {
  std::vector<std::byte> v = {std::byte{7}};
  const size_t n = size_t{16} << 20;
  ReserveForBulk(v, n);
  // The heap may hand back pages touched before: the whole pages of the
  // room go back to the kernel first (nothing is kept there).
  const auto room = reinterpret_cast<uintptr_t>(v.data() + v.size());
  const uintptr_t first = (room + 4095) / 4096 * 4096;
  const uintptr_t last = reinterpret_cast<uintptr_t>(v.data() + v.capacity()) / 4096 * 4096;
  ASSERT_EQ(madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED), 0);
  const std::vector<bool> before = Resident(v.data() + (8 << 20), 4 << 20);
  ASSERT_EQ(std::count(before.begin(), before.end(), true), 0);

  MakeRoomResident(v, 4 << 20);
  const std::vector<bool> arriving = Resident(v.data(), 4 << 20);
  EXPECT_EQ(std::count(arriving.begin(), arriving.end(), false), 0);
  const std::vector<bool> rest = Resident(v.data() + (8 << 20), 4 << 20);
  EXPECT_EQ(std::count(rest.begin(), rest.end(), true), 0) << "an announced size costs nothing";
  EXPECT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0], std::byte{7});
}

// Whether this build runs under AddressSanitizer (GCC says so one way,
// clang another).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// A burst of allocations after PrefaultHeap finds resident memory: here one
// block of nearly the size, which the heap hands back from the freed one.
TEST(BufferTest, PrefaultHeap_TheNextAllocationsAreResident) {
  if (kAddressSanitizer) {
    GTEST_SKIP() << "ASan's allocator holds freed memory back (quarantine): what PrefaultHeap "
                    "relies on is glibc's; the plain build runs this test";
  }
  TuneMallocForBulkTransfers();  // as the daemons do: freed memory stays
  const size_t n = size_t{1} << 20;
  // Whatever the heap would hand out next goes back to the kernel first
  // (earlier tests in this process may have left resident memory free).
  auto* stale = static_cast<std::byte*>(std::malloc(n));
  ASSERT_NE(stale, nullptr);
  const uintptr_t from = (reinterpret_cast<uintptr_t>(stale) + 4095) / 4096 * 4096;
  const uintptr_t to = (reinterpret_cast<uintptr_t>(stale) + n) / 4096 * 4096;
  ASSERT_EQ(madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED), 0);
  std::free(stale);
  PrefaultHeap(n);
  auto* p = static_cast<std::byte*>(std::malloc(n - 8192));
  ASSERT_NE(p, nullptr);
  const std::vector<bool> pages = Resident(p + 4096, n - 16384);
  EXPECT_EQ(std::count(pages.begin(), pages.end(), false), 0);
  std::free(p);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// MappingCache: a worker's buffer mapped again is the same mapping, with the
// same bytes; access modes never share a mapping; the bound unmaps only what
// no lease holds; a cached file's inode cannot name another file. Real
// memfds, no sockets.
#include "client/mapping_cache.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using testing::StatusIs;

constexpr size_t kFile = 64 << 10;

// A memfd of kFile bytes, each byte `fill`.
int Memfd(char fill) {
  int fd = memfd_create("mapping-cache-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, kFile), 0);
  std::string bytes(kFile, fill);
  EXPECT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(kFile));
  return fd;
}

// The same file through another descriptor, as a trainer opens the worker's
// buffer through /proc/<pid>/fd for every lease.
int Reopen(int fd, bool writable) {
  return open(absl::StrCat("/proc/self/fd/", fd).c_str(), writable ? O_RDWR : O_RDONLY);
}

TEST(MappingCache, TheSameBufferAgain_IsTheSameWarmMapping_WritesReachTheFile) {
  MappingCache cache(size_t{1} << 20);
  const int fd = Memfd('a');
  auto first = cache.Acquire(fd, kFile, /*writable=*/true);
  ASSERT_OK(first);
  EXPECT_EQ(static_cast<char>((*first)[0]), 'a');
  std::memset(*first, 'b', kFile);
  cache.Release(*first);

  const int again = Reopen(fd, true);
  auto second = cache.Acquire(again, 100, true);
  ASSERT_OK(second);
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(static_cast<char>((*second)[kFile - 1]), 'b');
  char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, 7), 1);
  EXPECT_EQ(c, 'b');  // shared: the worker sees what the trainer wrote
  cache.Release(*second);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
  close(again);
  close(fd);
}

TEST(MappingCache, ReadAndWriteLeases_NeverShareAMapping) {
  MappingCache cache(size_t{1} << 20);
  const int fd = Memfd('a');
  const int ro = Reopen(fd, false);
  auto w = cache.Acquire(fd, kFile, true);
  auto r = cache.Acquire(ro, kFile, false);
  ASSERT_OK(w);
  ASSERT_OK(r);
  EXPECT_NE(*w, *r);
  (*w)[5] = std::byte{'z'};
  EXPECT_EQ(static_cast<char>((*r)[5]), 'z');
  cache.Release(*w);
  cache.Release(*r);
  EXPECT_EQ(cache.stats().entries, 2u);
  close(ro);
  close(fd);
}

TEST(MappingCache, OverTheBound_TheLeastRecentlyUsedUnheldMappingGoes) {
  MappingCache cache(2 * kFile);
  const int a = Memfd('a'), b = Memfd('b'), c = Memfd('c');
  for (int fd : {a, b}) {
    auto m = cache.Acquire(fd, kFile, true);
    ASSERT_OK(m);
    cache.Release(*m);
  }
  auto ma = cache.Acquire(a, kFile, true);  // a is now the most recent
  ASSERT_OK(ma);
  cache.Release(*ma);
  auto mc = cache.Acquire(c, kFile, true);  // b goes
  ASSERT_OK(mc);
  cache.Release(*mc);
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_EQ(cache.stats().mapped_bytes, 2 * kFile);
  const uint64_t misses = cache.stats().misses;
  ASSERT_OK(cache.Acquire(a, kFile, true));
  EXPECT_EQ(cache.stats().misses, misses);  // a stayed
  ASSERT_OK(cache.Acquire(b, kFile, true));
  EXPECT_EQ(cache.stats().misses, misses + 1);  // b was unmapped
  for (int fd : {a, b, c}) close(fd);
}

TEST(MappingCache, HeldMappingsOutliveTheBound_ReleasedOnesGo) {
  MappingCache cache(0);  // caches nothing once released
  const int a = Memfd('a'), b = Memfd('b');
  auto ma = cache.Acquire(a, kFile, true);
  auto mb = cache.Acquire(b, kFile, true);
  ASSERT_OK(ma);
  ASSERT_OK(mb);
  EXPECT_EQ(cache.stats().entries, 2u);  // both held: neither unmapped
  cache.Release(*ma);
  EXPECT_EQ(cache.stats().entries, 1u);
  std::memset(*mb, 'x', kFile);  // still mapped
  cache.Release(*mb);
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().mapped_bytes, 0u);
  close(a);
  close(b);
}

TEST(MappingCache, AFileClosedByTheWorker_StaysItselfWhileCached_ANewFileIsMappedFresh) {
  MappingCache cache(size_t{1} << 20);
  const int a = Memfd('a');
  auto ma = cache.Acquire(a, kFile, true);
  ASSERT_OK(ma);
  cache.Release(*ma);
  close(a);  // the worker drops the buffer: the cached mapping keeps its file
  const int b = Memfd('b');
  auto mb = cache.Acquire(b, kFile, true);
  ASSERT_OK(mb);
  EXPECT_NE(*mb, *ma);
  EXPECT_EQ(static_cast<char>((*mb)[0]), 'b');
  EXPECT_EQ(cache.stats().misses, 2u);
  cache.Release(*mb);
  close(b);
}

TEST(MappingCache, ALeaseLongerThanTheBuffer_IsRefusedAndMapsNothing) {
  MappingCache cache(size_t{1} << 20);
  const int fd = Memfd('a');
  EXPECT_THAT(cache.Acquire(fd, kFile + 1, true).status(),
              StatusIs(absl::StatusCode::kOutOfRange, "holds"));
  EXPECT_EQ(cache.stats().entries, 0u);
  close(fd);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// Blob files: named by content, written tmp -> sync -> rename -> directory
// sync (a power loss right after Keep keeps them; the negative control
// without syncs loses them), and never served damaged: a flipped bit, a
// truncated or missing file is DATA_LOSS naming the file and the offset.
#include "server/store/blob_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "tests/testing/power_loss_fs.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tensors.h"

namespace repvar::server {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::Floats;
using ::repvar::testing::PowerLossFileSystem;
using ::repvar::testing::StatusIs;

std::vector<float> Ramp(int n, float from = 0) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + static_cast<float>(i) * 0.5f;
  return v;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

ino_t Inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

// The recycled files in `dir`, by inode.
std::set<ino_t> FreeInodes(const std::string& dir) {
  std::set<ino_t> out;
  for (const std::string& name : Files(dir)) {
    if (absl::StartsWith(name, "free-")) out.insert(Inode(dir + "/" + name));
  }
  return out;
}

class BlobStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<PowerLossFileSystem> fs_ = std::make_shared<PowerLossFileSystem>();
  repvar::testing::TempDir dir_;
  std::string blobs_dir_ = dir_.path() + "/blobs";
  // 64-byte chunks: damage is located to the chunk.
  BlobStoreOptions options_{.inline_bytes = 32, .chunk_bytes = 64};
  // Recycling blobs of any size, up to three of 400 bytes.
  BlobStoreOptions recycling_{
      .inline_bytes = 32, .chunk_bytes = 64, .recycle_bytes = 1200, .recycle_min_bytes = 1};

  std::unique_ptr<BlobStore> Store(BlobStoreOptions o) {
    auto s = std::make_unique<BlobStore>(fs_.get(), blobs_dir_, o);
    EXPECT_OK(s->Open());
    return s;
  }
};

TEST_F(BlobStoreTest, SmallTensor_Inline_NoFile) {
  auto store = Store(options_);
  disk::TensorRef ref;
  ASSERT_OK(store->Keep(*F32({1, 2, 3}), &ref));
  EXPECT_EQ(ref.where_case(), disk::TensorRef::kInlineBytes);
  EXPECT_TRUE(Files(blobs_dir_).empty());
  auto back = store->Load(ref);
  ASSERT_OK(back);
  EXPECT_EQ(Floats(**back), (std::vector<float>{1, 2, 3}));
}

TEST_F(BlobStoreTest, LargeTensor_OneFileNamedByContent_SameBytesShareIt) {
  auto store = Store(options_);
  auto t = F32(Ramp(100));  // 400 bytes, 7 chunks
  disk::TensorRef a, b;
  ASSERT_OK(store->Keep(*t, &a));
  ASSERT_OK(store->Keep(*F32(Ramp(100)), &b));
  EXPECT_EQ(a.blob(), b.blob());
  EXPECT_EQ(a.chunk_checksums_size(), 7);
  EXPECT_EQ(Files(blobs_dir_), std::vector<std::string>{a.blob()});
  EXPECT_EQ(store->blobs_written(), 1u);
  auto back = store->Load(a);
  ASSERT_OK(back);
  EXPECT_EQ(Floats(**back), Ramp(100));
  EXPECT_EQ((*back)->checksum, t->checksum);
}

// A value staged while the workers take it is not written again when its
// record keeps it; a staged blob the collector took first is written again;
// either way it survives power loss once the record is kept.
TEST_F(BlobStoreTest, Stage_ThenKeep_WrittenOnce_CollectedStageWrittenAgain) {
  auto store = Store(options_);
  auto t = F32(Ramp(100));
  ASSERT_OK(store->Stage(*t));
  EXPECT_EQ(store->blobs_written(), 1u);
  disk::TensorRef ref;
  ASSERT_OK(store->Keep(*t, &ref));
  EXPECT_EQ(store->blobs_written(), 1u);
  ASSERT_OK(store->CollectGarbage({}));  // a checkpoint came between
  disk::TensorRef again;
  ASSERT_OK(store->Keep(*t, &again));
  EXPECT_EQ(store->blobs_written(), 2u);
  fs_->CutPowerAt(1);
  fs_->LoseUnsyncedData();
  EXPECT_OK(Store(options_)->Load(again));
  ASSERT_OK(store->Stage(*F32({1})));  // inline: nothing to stage
  EXPECT_EQ(store->blobs_written(), 2u);
}

TEST_F(BlobStoreTest, PowerLossAfterKeep_TheBlobSurvives) {
  auto store = Store(options_);
  disk::TensorRef ref;
  ASSERT_OK(store->Keep(*F32(Ramp(100)), &ref));
  fs_->CutPowerAt(1);
  fs_->LoseUnsyncedData();
  EXPECT_OK(Store(options_)->Load(ref));
}

TEST_F(BlobStoreTest, NegativeControl_WithoutSyncs_PowerLossLosesTheBlob) {
  BlobStoreOptions unsynced = options_;
  unsynced.sync = false;
  auto store = Store(unsynced);
  disk::TensorRef ref;
  ASSERT_OK(store->Keep(*F32(Ramp(100)), &ref));
  fs_->LoseUnsyncedData();
  EXPECT_THAT(Store(options_)->Load(ref), StatusIs(absl::StatusCode::kDataLoss, ref.blob()));
}

// Counts the writeback a blob's writer starts (RangeSync): offset and
// length of each, in order.
class RangeSyncs final : public rocksdb::FileSystemWrapper {
 public:
  explicit RangeSyncs(std::shared_ptr<rocksdb::FileSystem> base)
      : FileSystemWrapper(std::move(base)) {}
  const char* Name() const override { return "RangeSyncs"; }
  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    return Wrapped(target()->NewWritableFile(fname, options, result, dbg), result);
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override {
    return Wrapped(target()->ReuseWritableFile(fname, old_fname, options, result, dbg), result);
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;

 private:
  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> f, RangeSyncs* owner)
        : FSWritableFileOwnerWrapper(std::move(f)), owner_(owner) {}
    rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const rocksdb::IOOptions& o,
                                rocksdb::IODebugContext* dbg) override {
      owner_->ranges.emplace_back(offset, nbytes);
      return target()->RangeSync(offset, nbytes, o, dbg);
    }

   private:
    RangeSyncs* const owner_;
  };
  rocksdb::IOStatus Wrapped(rocksdb::IOStatus s, std::unique_ptr<rocksdb::FSWritableFile>* f) {
    if (s.ok()) *f = std::make_unique<File>(std::move(*f), this);
    return s;
  }
};

// A blob hands its pages to the disk as it is written, every
// range_sync_bytes, from its start and without gaps (the tail is left to
// the sync, which alone makes it durable); with range_sync_bytes 0, or
// without syncs, it does not.
TEST_F(BlobStoreTest, Write_StartsWritebackEveryRangeSyncBytes_NoneWhenOffOrUnsynced) {
  auto counted = std::make_shared<RangeSyncs>(fs_);
  auto keep_one = [&](BlobStoreOptions o, const std::string& dir, disk::TensorRef* ref) {
    counted->ranges.clear();
    *ref = disk::TensorRef();
    BlobStore store(counted.get(), dir, o);
    ASSERT_OK(store.Open());
    ASSERT_OK(store.Keep(*F32(Ramp(1000)), ref));  // 4,000 bytes in 64-byte chunks
  };
  BlobStoreOptions off = options_, unsynced = options_, every256 = options_;
  off.range_sync_bytes = 0;
  unsynced.sync = false;
  unsynced.range_sync_bytes = every256.range_sync_bytes = 256;
  disk::TensorRef ref;
  keep_one(off, dir_.path() + "/off", &ref);
  EXPECT_TRUE(counted->ranges.empty());
  keep_one(unsynced, dir_.path() + "/unsynced", &ref);
  EXPECT_TRUE(counted->ranges.empty());

  keep_one(every256, blobs_dir_, &ref);
  ASSERT_EQ(counted->ranges.size(), 15u);
  for (size_t i = 0; i < counted->ranges.size(); ++i) {
    EXPECT_EQ(counted->ranges[i], std::make_pair(uint64_t{256} * i, uint64_t{256}));
  }
  fs_->CutPowerAt(1);
  fs_->LoseUnsyncedData();
  EXPECT_OK(Store(options_)->Load(ref));
}

// Startup maps a blob without reading it; its first use checks it. A
// store that reads values whole checks them at Load.
TEST_F(BlobStoreTest, FlippedByte_DataLossAtFirstUse_NamingTheFileAndOffset) {
  auto store = Store(options_);
  disk::TensorRef ref;
  ASSERT_OK(store->Keep(*F32(Ramp(100)), &ref));
  const std::string path = blobs_dir_ + "/" + ref.blob();
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  const std::string damage = absl::StrCat(path, ": bytes 192..256 do not match");
  auto fresh = Store(options_);  // a restart
  auto mapped = fresh->Load(ref);
  ASSERT_OK(mapped);
  EXPECT_TRUE((*mapped)->bytes.file_backed());
  EXPECT_FALSE(fresh->CheckIfKnown(**mapped).has_value());
  EXPECT_THAT(fresh->Check(**mapped), StatusIs(absl::StatusCode::kDataLoss, damage));
  EXPECT_TRUE(fresh->CheckIfKnown(**mapped).has_value())
      << "found damaged: answered without a pass";
  EXPECT_THAT(fresh->Check(**mapped), StatusIs(absl::StatusCode::kDataLoss, damage))
      << "remembered";

  BlobStoreOptions in_memory = options_;
  in_memory.map_values = false;
  EXPECT_THAT(Store(in_memory)->Load(ref), StatusIs(absl::StatusCode::kDataLoss, damage));
}

// The coordinator's copy of a value is the file: once kept, a value is held
// as a mapping of its blob (no copy in memory), with the same bytes, and is
// good without a pass over them; a value loaded at startup is good once
// checked.
TEST_F(BlobStoreTest, Mapped_TheBlobFileItself_SameBytes) {
  auto store = Store(options_);
  auto t = F32(Ramp(100));
  disk::TensorRef ref;
  ASSERT_OK(store->Keep(*t, &ref));
  auto mapped = store->Mapped(t);
  ASSERT_OK(mapped);
  EXPECT_TRUE((*mapped)->bytes.file_backed());
  EXPECT_EQ(Floats(**mapped), Ramp(100));
  EXPECT_EQ((*mapped)->checksum, t->checksum);
  EXPECT_TRUE(store->CheckIfKnown(**mapped).has_value()) << "kept in this run: good without a pass";
  EXPECT_OK(store->Check(**mapped));
  disk::TensorRef described;
  store->Describe(**mapped, &described);
  EXPECT_EQ(described.SerializeAsString(), ref.SerializeAsString());

  auto small = F32({1, 2});
  auto same = store->Mapped(small);
  ASSERT_OK(same);
  EXPECT_EQ(same->get(), small.get()) << "an inline value stays in memory";

  EXPECT_TRUE(store->CheckIfKnown(*small).has_value()) << "in memory: checked as it arrived";

  auto restarted = Store(options_);
  auto loaded = restarted->Load(ref);
  ASSERT_OK(loaded);
  EXPECT_FALSE(restarted->CheckIfKnown(**loaded).has_value())
      << "loaded at startup: its first use checks it";
  EXPECT_OK(restarted->Check(**loaded));
  EXPECT_TRUE(restarted->CheckIfKnown(**loaded).has_value());
  EXPECT_EQ(Floats(**loaded), Ramp(100));

  BlobStoreOptions unsynced = options_;
  unsynced.sync = false;
  auto kept_in_memory = Store(unsynced)->Mapped(t);
  ASSERT_OK(kept_in_memory);
  EXPECT_EQ(kept_in_memory->get(), t.get()) << "an unsynced file is no home for a value";
}

TEST_F(BlobStoreTest, TruncatedOrMissing_DataLossNamingTheFile) {
  auto store = Store(options_);
  disk::TensorRef ref;
  ASSERT_OK(store->Keep(*F32(Ramp(100)), &ref));
  const std::string path = blobs_dir_ + "/" + ref.blob();
  std::filesystem::resize_file(path, 150);
  EXPECT_THAT(
      store->Load(ref),
      StatusIs(absl::StatusCode::kDataLoss,
               absl::StrCat(path, " has 150 bytes; its record says 400 (damaged at offset 150)")));
  std::filesystem::remove(path);
  EXPECT_THAT(store->Load(ref),
              StatusIs(absl::StatusCode::kDataLoss, absl::StrCat(path, " is missing")));
}

TEST_F(BlobStoreTest, Open_RemovesTmpFiles_CollectGarbage_DeletesOnlyUnnamedBlobs) {
  auto store = Store(options_);
  disk::TensorRef a, b;
  ASSERT_OK(store->Keep(*F32(Ramp(100)), &a));
  ASSERT_OK(store->Keep(*F32(Ramp(50)), &b));
  std::ofstream(blobs_dir_ + "/tmp-left-by-a-crash.bin") << "x";
  store = Store(options_);
  EXPECT_EQ(Files(blobs_dir_).size(), 2u);
  auto deleted = store->CollectGarbage({a.blob()});
  ASSERT_OK(deleted);
  EXPECT_EQ(*deleted, 1);
  EXPECT_EQ(Files(blobs_dir_), std::vector<std::string>{a.blob()});
}

// A freed blob nothing maps is kept under a free name and the next blob of
// its size is written over it: the same file (inode), holding the new bytes,
// which survive a power loss like any other blob's. The control: with
// recycling off the freed blob is deleted and nothing is reused.
TEST_F(BlobStoreTest, Recycle_FreedBlobOfTheSameSize_IsWrittenOverInPlace) {
  for (const bool recycle : {true, false}) {
    SCOPED_TRACE(recycle ? "recycling" : "control");
    std::filesystem::remove_all(blobs_dir_);
    fs_ = std::make_shared<PowerLossFileSystem>();
    BlobStoreOptions o = recycling_;
    if (!recycle) o.recycle_bytes = 0;
    auto store = Store(o);
    disk::TensorRef a, b;
    ASSERT_OK(store->Keep(*F32(Ramp(100)), &a));
    const ino_t inode = Inode(blobs_dir_ + "/" + a.blob());
    ASSERT_OK(store->CollectGarbage({}));
    EXPECT_EQ(store->recycled_bytes(), recycle ? 400u : 0u);
    EXPECT_EQ(FreeInodes(blobs_dir_).size(), recycle ? 1u : 0u);
    ASSERT_OK(store->Keep(*F32(Ramp(100, 7)), &b));
    ASSERT_NE(a.blob(), b.blob());
    EXPECT_EQ(Files(blobs_dir_), std::vector<std::string>{b.blob()});
    EXPECT_EQ(store->blobs_reused(), recycle ? 1u : 0u);
    EXPECT_EQ(store->recycled_bytes(), 0u);
    if (recycle) {
      EXPECT_EQ(Inode(blobs_dir_ + "/" + b.blob()), inode);
    }
    fs_->CutPowerAt(1);
    fs_->LoseUnsyncedData();
    auto reopened = Store(o);
    auto back = reopened->Load(b);
    ASSERT_OK(back);
    EXPECT_OK(reopened->Check(**back));
    EXPECT_EQ(Floats(**back), Ramp(100, 7));
  }
}

// A freed blob someone still maps is deleted, never written over: its
// reader keeps the bytes it mapped while a blob of the same size is
// written. Once no mapping is left, a freed blob is recycled again.
TEST_F(BlobStoreTest, Recycle_AMappedBlob_IsDeletedAndItsReaderKeepsItsBytes) {
  auto store = Store(recycling_);
  disk::TensorRef a, b;
  ASSERT_OK(store->Keep(*F32(Ramp(100)), &a));
  auto reader = store->Load(a);
  ASSERT_OK(reader);
  ASSERT_OK(store->CollectGarbage({}));
  EXPECT_EQ(store->recycled_bytes(), 0u);
  EXPECT_TRUE(Files(blobs_dir_).empty());
  ASSERT_OK(store->Keep(*F32(Ramp(100, 7)), &b));
  EXPECT_EQ(store->blobs_reused(), 0u);
  EXPECT_EQ(Floats(**reader), Ramp(100));
  EXPECT_OK(store->Check(**reader));

  auto released = store->Load(b);
  ASSERT_OK(released);
  released->reset();
  ASSERT_OK(store->CollectGarbage({}));
  EXPECT_EQ(store->recycled_bytes(), 400u) << "no mapping of b is left";
}

// Recycled files are bounded in bytes (the oldest deleted first), reused
// only by a blob of exactly their size, taken up again by the next process
// (the newest, up to its bound) and given back on demand.
TEST_F(BlobStoreTest, Recycle_BoundedOldestFirst_ExactSizeOnly_KeptAcrossRestarts_Dropped) {
  BlobStoreOptions o = recycling_;
  o.recycle_bytes = 1300;
  auto store = Store(o);
  std::vector<ino_t> inodes;  // blobs of 400, 416, 432 and 448 bytes
  for (int floats : {100, 104, 108, 112}) {
    disk::TensorRef ref;
    ASSERT_OK(store->Keep(*F32(Ramp(floats)), &ref));
    inodes.push_back(Inode(blobs_dir_ + "/" + ref.blob()));
    ASSERT_OK(store->CollectGarbage({}));
  }
  EXPECT_EQ(store->blobs_reused(), 0u);
  EXPECT_EQ(store->recycled_bytes(), 416u + 432 + 448);
  EXPECT_EQ(FreeInodes(blobs_dir_), (std::set<ino_t>{inodes[1], inodes[2], inodes[3]}));

  disk::TensorRef smaller;
  ASSERT_OK(store->Keep(*F32(Ramp(50)), &smaller));
  EXPECT_EQ(store->blobs_reused(), 0u) << "no recycled file of 200 bytes";
  EXPECT_EQ(FreeInodes(blobs_dir_).size(), 3u);

  o.recycle_bytes = 900;
  store = Store(o);
  EXPECT_EQ(store->recycled_bytes(), 432u + 448);
  EXPECT_EQ(FreeInodes(blobs_dir_), (std::set<ino_t>{inodes[2], inodes[3]}));
  disk::TensorRef again;
  ASSERT_OK(store->Keep(*F32(Ramp(108, 9)), &again));
  EXPECT_EQ(store->blobs_reused(), 1u);
  EXPECT_EQ(Inode(blobs_dir_ + "/" + again.blob()), inodes[2]);
  EXPECT_EQ(store->DropRecycled(), 448u);
  EXPECT_TRUE(FreeInodes(blobs_dir_).empty());
  EXPECT_EQ(Files(blobs_dir_).size(), 2u);  // smaller, again
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "tests/testing/power_loss_fs.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <utility>

namespace repvar::testing {
namespace {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string Trimmed(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::optional<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A file being written: every write and sync is one mutation; a sync
// records how many bytes now survive a power loss.
class TrackedFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  TrackedFile(PowerLossFileSystem* fs, std::string fname, uint64_t size,
              std::unique_ptr<rocksdb::FSWritableFile> file)
      : FSWritableFileOwnerWrapper(std::move(file)),
        fs_(fs),
        fname_(std::move(fname)),
        pos_(size) {}

  IOStatus Append(const rocksdb::Slice& data, const IOOptions& o, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Mutate("append"); !s.ok()) return s;
    IOStatus s = target()->Append(data, o, dbg);
    if (s.ok()) pos_ += data.size();
    return s;
  }
  IOStatus Append(const rocksdb::Slice& data, const IOOptions& o,
                  const rocksdb::DataVerificationInfo& v, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Mutate("append"); !s.ok()) return s;
    IOStatus s = target()->Append(data, o, v, dbg);
    if (s.ok()) pos_ += data.size();
    return s;
  }
  IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const IOOptions& o,
                            IODebugContext* dbg) override {
    if (IOStatus s = fs_->Mutate("append"); !s.ok()) return s;
    IOStatus s = target()->PositionedAppend(data, offset, o, dbg);
    if (s.ok()) pos_ = std::max(pos_.load(), offset + data.size());
    return s;
  }
  IOStatus Truncate(uint64_t size, const IOOptions& o, IODebugContext* dbg) override {
    if (IOStatus s = fs_->Mutate("truncate"); !s.ok()) return s;
    pos_ = size;
    return target()->Truncate(size, o, dbg);
  }
  IOStatus Sync(const IOOptions& o, IODebugContext* dbg) override {
    // RocksDB syncs its log while other threads append to it (SyncWAL): the
    // sync covers what was written when it began.
    const uint64_t covered = pos_.load();
    if (IOStatus s = target()->Flush(o, dbg); !s.ok()) return s;
    fs_->SyncHook(fname_);
    if (fs_->real_syncs()) {
      if (IOStatus s = target()->Sync(o, dbg); !s.ok()) return s;
    }
    return fs_->Sync(fname_, covered);
  }
  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override { return Sync(o, dbg); }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& o,
                     IODebugContext* dbg) override {
    // Starts writeback; promises nothing about a power loss.
    if (IOStatus s = fs_->Mutate("range sync"); !s.ok()) return s;
    return target()->RangeSync(offset, nbytes, o, dbg);
  }

 private:
  PowerLossFileSystem* const fs_;
  const std::string fname_;
  std::atomic<uint64_t> pos_;  // appended while a sync runs (SyncWAL)
};

class TrackedDirectory final : public rocksdb::FSDirectoryWrapper {
 public:
  TrackedDirectory(PowerLossFileSystem* fs, std::string name,
                   std::unique_ptr<rocksdb::FSDirectory> dir)
      : FSDirectoryWrapper(std::move(dir)), fs_(fs), name_(std::move(name)) {}

  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override {
    if (fs_->real_syncs()) {
      if (IOStatus s = FSDirectoryWrapper::Fsync(o, dbg); !s.ok()) return s;
    }
    return fs_->SyncDir(name_);
  }
  IOStatus FsyncWithDirOptions(const IOOptions& o, IODebugContext* dbg,
                               const rocksdb::DirFsyncOptions& d) override {
    if (fs_->real_syncs()) {
      if (IOStatus s = FSDirectoryWrapper::FsyncWithDirOptions(o, dbg, d); !s.ok()) return s;
    }
    return fs_->SyncDir(name_);
  }

 private:
  PowerLossFileSystem* const fs_;
  const std::string name_;
};

}  // namespace

PowerLossFileSystem::PowerLossFileSystem(std::shared_ptr<rocksdb::FileSystem> base, bool real_syncs)
    : FileSystemWrapper(std::move(base)), real_syncs_(real_syncs) {}

void PowerLossFileSystem::CutPowerAt(uint64_t n) {
  absl::MutexLock lock(&mu_);
  cut_at_ = mutations_ + std::max<uint64_t>(n, 1);
}

bool PowerLossFileSystem::power_cut() const {
  absl::MutexLock lock(&mu_);
  return cut_at_ != 0 && mutations_ >= cut_at_;
}

uint64_t PowerLossFileSystem::mutations() const {
  absl::MutexLock lock(&mu_);
  return mutations_;
}

void PowerLossFileSystem::FailSyncs(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_syncs_ = fail;
}

void PowerLossFileSystem::SetFreeSpace(std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  free_space_ = bytes;
}

void PowerLossFileSystem::SetSyncHook(std::function<void(const std::string&)> hook) {
  absl::MutexLock lock(&mu_);
  sync_hook_ = std::move(hook);
}

void PowerLossFileSystem::SyncHook(const std::string& fname) {
  std::function<void(const std::string&)> hook;
  {
    absl::MutexLock lock(&mu_);
    hook = sync_hook_;
  }
  if (hook) hook(fname);
}

IOStatus PowerLossFileSystem::Mutate(const char* what) {
  absl::MutexLock lock(&mu_);
  if (cut_at_ != 0 && mutations_ >= cut_at_) {
    return IOStatus::IOError(std::string("the power is off (") + what + ")");
  }
  ++mutations_;
  if (cut_at_ != 0 && mutations_ >= cut_at_) {
    return IOStatus::IOError(std::string("the power went off (") + what + ")");
  }
  return IOStatus::OK();
}

IOStatus PowerLossFileSystem::Sync(const std::string& fname, uint64_t size) {
  if (IOStatus s = Mutate("sync"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (fail_syncs_) return IOStatus::IOError("sync failed (injected)");
  files_[fname].synced = size;
  return IOStatus::OK();
}

IOStatus PowerLossFileSystem::SyncDir(const std::string& dir) {
  if (IOStatus s = Mutate("directory sync"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (fail_syncs_) return IOStatus::IOError("directory sync failed (injected)");
  const std::string d = Trimmed(dir);
  for (auto& [name, state] : files_) {
    if (DirOf(name) == d) {
      state.entry_synced = true;
      state.previous.reset();
    }
  }
  return IOStatus::OK();
}

IOStatus PowerLossFileSystem::Track(const std::string& fname, IOStatus s,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    bool reopened) {
  if (!s.ok()) return s;
  uint64_t size = 0;
  if (reopened) (void)target()->GetFileSize(fname, IOOptions(), &size, nullptr);
  *result = std::make_unique<TrackedFile>(this, fname, size, std::move(*result));
  return s;
}

IOStatus PowerLossFileSystem::NewWritableFile(const std::string& fname,
                                              const rocksdb::FileOptions& options,
                                              std::unique_ptr<rocksdb::FSWritableFile>* result,
                                              IODebugContext* dbg) {
  if (IOStatus s = Mutate("create"); !s.ok()) return s;
  const bool existed = target()->FileExists(fname, IOOptions(), dbg).ok();
  {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(fname);
    FileState state;
    // An existing entry stays (now empty); a new one is lost until its
    // directory is synced.
    state.entry_synced = existed && (it == files_.end() || it->second.entry_synced);
    files_[fname] = state;
  }
  return Track(fname, target()->NewWritableFile(fname, options, result, dbg), result, false);
}

IOStatus PowerLossFileSystem::ReopenWritableFile(const std::string& fname,
                                                 const rocksdb::FileOptions& options,
                                                 std::unique_ptr<rocksdb::FSWritableFile>* result,
                                                 IODebugContext* dbg) {
  if (IOStatus s = Mutate("reopen"); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (!files_.contains(fname)) {
      uint64_t size = 0;
      const bool existed = target()->GetFileSize(fname, IOOptions(), &size, dbg).ok();
      files_[fname] = FileState{size, existed, std::nullopt};
    }
  }
  return Track(fname, target()->ReopenWritableFile(fname, options, result, dbg), result, true);
}

IOStatus PowerLossFileSystem::ReuseWritableFile(const std::string& fname,
                                                const std::string& old_fname,
                                                const rocksdb::FileOptions& options,
                                                std::unique_ptr<rocksdb::FSWritableFile>* result,
                                                IODebugContext* dbg) {
  if (IOStatus s = RenameFile(old_fname, fname, IOOptions(), dbg); !s.ok()) return s;
  return NewWritableFile(fname, options, result, dbg);
}

IOStatus PowerLossFileSystem::NewDirectory(const std::string& name, const IOOptions& options,
                                           std::unique_ptr<rocksdb::FSDirectory>* result,
                                           IODebugContext* dbg) {
  IOStatus s = target()->NewDirectory(name, options, result, dbg);
  if (s.ok()) *result = std::make_unique<TrackedDirectory>(this, name, std::move(*result));
  return s;
}

IOStatus PowerLossFileSystem::RenameFile(const std::string& src, const std::string& target_name,
                                         const IOOptions& options, IODebugContext* dbg) {
  if (IOStatus s = Mutate("rename"); !s.ok()) return s;
  // What a power loss before the next directory sync brings back: the old
  // file of that name, when there was one.
  std::optional<std::string> previous;
  {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(target_name);
    const bool durable_before = it == files_.end() || it->second.entry_synced;
    if (durable_before) previous = ReadWhole(target_name);
    if (it != files_.end() && !it->second.entry_synced) previous = it->second.previous;
  }
  IOStatus s = target()->RenameFile(src, target_name, options, dbg);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  FileState moved;
  if (auto it = files_.find(src); it != files_.end()) {
    moved = it->second;
    files_.erase(it);
  } else {
    uint64_t size = 0;
    (void)target()->GetFileSize(target_name, IOOptions(), &size, nullptr);
    moved.synced = size;
  }
  moved.entry_synced = false;
  moved.previous = std::move(previous);
  files_[target_name] = std::move(moved);
  return s;
}

IOStatus PowerLossFileSystem::LinkFile(const std::string& src, const std::string& target_name,
                                       const IOOptions& options, IODebugContext* dbg) {
  if (IOStatus s = Mutate("link"); !s.ok()) return s;
  IOStatus s = target()->LinkFile(src, target_name, options, dbg);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  FileState linked;
  if (auto it = files_.find(src); it != files_.end()) linked.synced = it->second.synced;
  files_[target_name] = linked;
  return s;
}

IOStatus PowerLossFileSystem::DeleteFile(const std::string& fname, const IOOptions& options,
                                         IODebugContext* dbg) {
  if (IOStatus s = Mutate("delete"); !s.ok()) return s;
  IOStatus s = target()->DeleteFile(fname, options, dbg);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    files_.erase(fname);
  }
  return s;
}

IOStatus PowerLossFileSystem::CreateDir(const std::string& dirname, const IOOptions& options,
                                        IODebugContext* dbg) {
  if (IOStatus s = Mutate("mkdir"); !s.ok()) return s;
  return target()->CreateDir(dirname, options, dbg);
}

IOStatus PowerLossFileSystem::CreateDirIfMissing(const std::string& dirname,
                                                 const IOOptions& options, IODebugContext* dbg) {
  if (IOStatus s = Mutate("mkdir"); !s.ok()) return s;
  return target()->CreateDirIfMissing(dirname, options, dbg);
}

IOStatus PowerLossFileSystem::GetFreeSpace(const std::string& path, const IOOptions& options,
                                           uint64_t* diskfree, IODebugContext* dbg) {
  {
    absl::MutexLock lock(&mu_);
    if (free_space_) {
      *diskfree = *free_space_;
      return IOStatus::OK();
    }
  }
  return target()->GetFreeSpace(path, options, diskfree, dbg);
}

void PowerLossFileSystem::LoseUnsyncedData() {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, state] : files_) {
    if (!state.entry_synced) {
      if (state.previous) {
        std::ofstream(name, std::ios::binary | std::ios::trunc) << *state.previous;
      } else {
        ::unlink(name.c_str());
      }
      continue;
    }
    (void)::truncate(name.c_str(), static_cast<off_t>(state.synced));
  }
  files_.clear();
  cut_at_ = 0;
}

}  // namespace repvar::testing

// SPDX-License-Identifier: Apache-2.0
// A file system that can lose its power, for the state log's crash tests
// (after RocksDB's FaultInjectionTestFS and LevelDB's fault_injection_test):
// it passes everything to the real file system underneath and remembers what
// a power loss would keep — of each file, the bytes up to its last sync; of
// each directory, the entries present at its last sync.
//
//   CutPowerAt(n)       the n-th mutating operation from now (a write, sync,
//                       create, rename, delete, directory sync) and every
//                       one after it fail with IOError: the machine is off
//   LoseUnsyncedData()  then makes the disk look as it would at power-on:
//                       files cut back to their synced length, entries
//                       created since their directory's last sync removed
//
// It can also fail syncs (IOError) and report little free space. Files that
// existed before it was created count as synced. Thread-safe.
#ifndef REPVAR_TESTS_TESTING_POWER_LOSS_FS_H_
#define REPVAR_TESTS_TESTING_POWER_LOSS_FS_H_

#include <rocksdb/file_system.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"

namespace repvar::testing {

class PowerLossFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  // `real_syncs`: pass syncs on to the disk (false: only remember them;
  // what survives a power loss is decided here either way, and trials run
  // faster).
  explicit PowerLossFileSystem(
      std::shared_ptr<rocksdb::FileSystem> base = rocksdb::FileSystem::Default(),
      bool real_syncs = true);
  const char* Name() const override { return "PowerLossFileSystem"; }

  // ---- Faults ----
  // Power fails at the n-th mutating operation from now (n >= 1).
  void CutPowerAt(uint64_t n);
  bool power_cut() const;
  uint64_t mutations() const;  // counted so far
  void LoseUnsyncedData();
  // Every file or directory sync fails with IOError (the data is written).
  void FailSyncs(bool fail);
  // GetFreeSpace reports `bytes` (nullopt: the real figure).
  void SetFreeSpace(std::optional<uint64_t> bytes);
  // Called with the file's name at the start of every file sync, after the
  // bytes it covers are fixed (a test holds a sync there); null: none.
  void SetSyncHook(std::function<void(const std::string&)> hook);
  void SyncHook(const std::string& fname);

  // ---- rocksdb::FileSystem ----
  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& options,
                                 std::unique_ptr<rocksdb::FSDirectory>* result,
                                 rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& target,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus LinkFile(const std::string& src, const std::string& target,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& fname, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus CreateDir(const std::string& dirname, const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus CreateDirIfMissing(const std::string& dirname,
                                       const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& options,
                                 uint64_t* diskfree, rocksdb::IODebugContext* dbg) override;

  // ---- For the wrapped files ----
  // Counts one mutating operation; IOError once the power is off.
  rocksdb::IOStatus Mutate(const char* what);
  rocksdb::IOStatus Sync(const std::string& fname, uint64_t size);
  rocksdb::IOStatus SyncDir(const std::string& dir);
  bool real_syncs() const { return real_syncs_; }

 private:
  struct FileState {
    uint64_t synced = 0;        // bytes that survive a power loss
    bool entry_synced = false;  // its directory entry survives
    // The file a rename replaced, back after a power loss before the next
    // directory sync.
    std::optional<std::string> previous;
  };
  rocksdb::IOStatus Track(const std::string& fname, rocksdb::IOStatus s,
                          std::unique_ptr<rocksdb::FSWritableFile>* result, bool reopened);

  const bool real_syncs_;
  mutable absl::Mutex mu_;
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
  uint64_t mutations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cut_at_ ABSL_GUARDED_BY(mu_) = 0;  // 0: never
  bool fail_syncs_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<uint64_t> free_space_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> sync_hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_POWER_LOSS_FS_H_

// SPDX-License-Identifier: Apache-2.0
#include "server/store/blob_store.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_util.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

const rocksdb::IOOptions kIo;

}  // namespace

absl::Status FromIo(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(message);
  if (s.IsCorruption()) return absl::DataLossError(message);
  return absl::InternalError(message);
}

BlobStore::BlobStore(rocksdb::FileSystem* fs, std::string dir, BlobStoreOptions options)
    : fs_(fs), dir_(std::move(dir)), options_(options) {}

absl::Status BlobStore::Open() {
  REPVAR_RETURN_IF_ERROR(FromIo(fs_->CreateDirIfMissing(dir_, kIo, nullptr), "create " + dir_));
  std::vector<std::string> children;
  REPVAR_RETURN_IF_ERROR(FromIo(fs_->GetChildren(dir_, kIo, &children, nullptr), "list " + dir_));
  std::map<uint64_t, std::string> recycled;  // by serial: oldest first
  for (const std::string& name : children) {
    uint64_t serial = 0;
    if (absl::StartsWith(name, "tmp-")) {
      REPVAR_RETURN_IF_ERROR(
          FromIo(fs_->DeleteFile(dir_ + "/" + name, kIo, nullptr), "delete " + name));
    } else if (absl::StartsWith(name, "free-") && absl::SimpleAtoi(name.substr(5), &serial)) {
      recycled[serial] = dir_ + "/" + name;
    }
  }
  if (!recycled.empty()) tmp_serial_ = std::max(tmp_serial_.load(), recycled.rbegin()->first + 1);
  // Taken up in the order they were recycled: the bound keeps the newest,
  // as it would have in that run.
  for (const auto& [serial, path] : recycled) {
    uint64_t size = 0;
    REPVAR_RETURN_IF_ERROR(FromIo(fs_->GetFileSize(path, kIo, &size, nullptr), "stat " + path));
    if (Recyclable(size)) {
      REPVAR_RETURN_IF_ERROR(KeepRecycled(Recycled{path, size}));
    } else {
      REPVAR_RETURN_IF_ERROR(FromIo(fs_->DeleteFile(path, kIo, nullptr), "delete " + path));
    }
  }
  return absl::OkStatus();
}

std::string BlobStore::BlobNameOf(const Tensor& t) const {
  if (BlobBytes(t) == 0) return "";
  return absl::StrFormat("%016x-%d.bin", t.checksum, t.bytes.size());
}

BlobStore::BlobInfo BlobStore::Summarize(const Tensor& t) const {
  BlobInfo info;
  info.chunk_bytes = options_.chunk_bytes;
  ForEachChunk(t.bytes.span(), options_.chunk_bytes,
               [&](uint64_t offset, std::span<const std::byte> chunk) {
                 info.sums.push_back(t.ChunkChecksum(offset, chunk.size()));
               });
  return info;
}

void BlobStore::Describe(const Tensor& t, disk::TensorRef* ref) {
  auto* spec = ref->mutable_spec();
  spec->set_dtype(static_cast<int>(t.spec.dtype));
  for (int64_t d : t.spec.dims) spec->add_dims(d);
  ref->set_byte_size(t.bytes.size());
  ref->set_checksum(t.checksum);
  if (BlobBytes(t) == 0) {
    ref->set_inline_bytes(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    return;
  }
  const std::string name = BlobNameOf(t);
  ref->set_blob(name);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = known_.find(name); it != known_.end()) {
      ref->set_chunk_bytes(it->second.chunk_bytes);
      for (uint64_t sum : it->second.sums) ref->add_chunk_checksums(sum);
      return;
    }
  }
  // Not written or loaded by this process (the same bytes were on disk):
  // summed from `t`, and the file checked against that at its first use.
  BlobInfo info = Summarize(t);
  ref->set_chunk_bytes(info.chunk_bytes);
  for (uint64_t sum : info.sums) ref->add_chunk_checksums(sum);
  absl::MutexLock lock(&mu_);
  known_.try_emplace(name, std::move(info));
}

absl::Status BlobStore::Keep(const Tensor& t, disk::TensorRef* ref) {
  Describe(t, ref);
  if (BlobBytes(t) == 0) return absl::OkStatus();
  const std::string& name = ref->blob();
  uint64_t size = 0;
  if (fs_->GetFileSize(dir_ + "/" + name, kIo, &size, nullptr).ok() && size == t.bytes.size()) {
    // The same bytes are on disk already (Load checks them). Its directory
    // entry may be from a run that crashed before syncing it.
    return options_.sync ? SyncDir() : absl::OkStatus();
  }
  return Write(name, t);
}

absl::Status BlobStore::Stage(const Tensor& t) {
  if (BlobBytes(t) == 0) return absl::OkStatus();
  const std::string name = BlobNameOf(t);
  uint64_t size = 0;
  if (fs_->GetFileSize(dir_ + "/" + name, kIo, &size, nullptr).ok() && size == t.bytes.size()) {
    return absl::OkStatus();
  }
  return Write(name, t);
}

absl::Status BlobStore::Write(const std::string& name, const Tensor& t) {
  const std::string tmp = absl::StrCat(dir_, "/tmp-", tmp_serial_.fetch_add(1), "-", name);
  const std::string path = dir_ + "/" + name;
  BlobInfo info;
  info.chunk_bytes = options_.chunk_bytes;
  info.checked = BlobInfo::Checked::kGood;  // these bytes were checked as they arrived
  bool reused = false;
  auto written = [&]() -> absl::Status {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    REPVAR_RETURN_IF_ERROR(OpenForWrite(tmp, t.bytes.size(), &file, &reused));
    absl::Status s;
    uint64_t handed = 0;  // bytes handed to the disk so far (RangeSync)
    ForEachChunk(
        t.bytes.span(), options_.chunk_bytes,
        [&](uint64_t offset, std::span<const std::byte> chunk) {
          if (!s.ok()) return;
          info.sums.push_back(t.ChunkChecksum(offset, chunk.size()));  // kept, or hashed here
          s = FromIo(file->Append(
                         rocksdb::Slice(reinterpret_cast<const char*>(chunk.data()), chunk.size()),
                         kIo, nullptr),
                     "write " + tmp);
          const uint64_t end = offset + chunk.size();
          if (s.ok() && options_.sync && options_.range_sync_bytes > 0 &&
              end - handed >= options_.range_sync_bytes) {
            s = FromIo(file->RangeSync(handed, end - handed, kIo, nullptr), "write back " + tmp);
            handed = end;
          }
        });
    REPVAR_RETURN_IF_ERROR(s);
    if (options_.sync) REPVAR_RETURN_IF_ERROR(FromIo(file->Sync(kIo, nullptr), "sync " + tmp));
    REPVAR_RETURN_IF_ERROR(FromIo(file->Close(kIo, nullptr), "close " + tmp));
    if (reused) {
      // Written over from its start: as long as before, and no longer.
      uint64_t size = 0;
      REPVAR_RETURN_IF_ERROR(FromIo(fs_->GetFileSize(tmp, kIo, &size, nullptr), "stat " + tmp));
      if (size != t.bytes.size()) {
        return absl::InternalError(absl::StrCat(tmp, " has ", size, " bytes after ", t.bytes.size(),
                                                " were written over it"));
      }
    }
    REPVAR_RETURN_IF_ERROR(FromIo(fs_->RenameFile(tmp, path, kIo, nullptr), "rename " + tmp));
    return options_.sync ? SyncDir() : absl::OkStatus();
  }();
  if (!written.ok()) {
    (void)fs_->DeleteFile(tmp, kIo, nullptr);
    return written;
  }
  ++blobs_written_;
  if (reused) ++blobs_reused_;
  blob_bytes_written_ += t.bytes.size();
  absl::MutexLock lock(&mu_);
  known_.insert_or_assign(name, std::move(info));
  return absl::OkStatus();
}

absl::Status BlobStore::OpenForWrite(const std::string& tmp, uint64_t size,
                                     std::unique_ptr<rocksdb::FSWritableFile>* file, bool* reused) {
  *reused = false;
  std::optional<Recycled> recycled;
  {
    absl::MutexLock lock(&mu_);
    // The most recently recycled: the likeliest to be in the page cache.
    for (auto it = recycled_.rbegin(); it != recycled_.rend(); ++it) {
      if (it->size != size) continue;
      recycled = *it;
      recycled_bytes_ -= it->size;
      recycled_.erase(std::next(it).base());
      break;
    }
  }
  if (recycled) {
    rocksdb::IOStatus s =
        fs_->ReuseWritableFile(tmp, recycled->path, rocksdb::FileOptions(), file, nullptr);
    if (s.ok()) {
      *reused = true;
      return absl::OkStatus();
    }
    spdlog::debug("blob file {} not reused: {}", recycled->path, s.ToString());
    (void)fs_->DeleteFile(recycled->path, kIo, nullptr);
  }
  return FromIo(fs_->NewWritableFile(tmp, rocksdb::FileOptions(), file, nullptr), "create " + tmp);
}

absl::Status BlobStore::SyncDir() {
  std::unique_ptr<rocksdb::FSDirectory> dir;
  REPVAR_RETURN_IF_ERROR(FromIo(fs_->NewDirectory(dir_, kIo, &dir, nullptr), "open " + dir_));
  REPVAR_RETURN_IF_ERROR(
      FromIo(dir->FsyncWithDirOptions(
                 kIo, nullptr, rocksdb::DirFsyncOptions(rocksdb::DirFsyncOptions::kNewFileSynced)),
             "sync " + dir_));
  return FromIo(dir->Close(kIo, nullptr), "close " + dir_);
}

absl::StatusOr<std::shared_ptr<const Tensor>> BlobStore::Load(const disk::TensorRef& ref) {
  TensorSpec spec;
  auto dtype = DTypeFromInt(ref.spec().dtype());
  if (!dtype.ok()) return absl::DataLossError(absl::StrCat("tensor dtype ", ref.spec().dtype()));
  spec.dtype = *dtype;
  spec.dims.assign(ref.spec().dims().begin(), ref.spec().dims().end());
  auto size = spec.ByteSize();
  if (!size.ok() || static_cast<uint64_t>(*size) != ref.byte_size()) {
    return absl::DataLossError(absl::StrCat("a tensor of ", spec.ToString(), " recorded with ",
                                            ref.byte_size(), " bytes"));
  }
  if (ref.where_case() == disk::TensorRef::kInlineBytes) {
    const std::string& data = ref.inline_bytes();
    auto t =
        Tensor::FromBytes(spec, std::as_bytes(std::span<const char>(data.data(), data.size())));
    if (!t.ok() || t->checksum != ref.checksum()) {
      return absl::DataLossError(
          absl::StrCat("an inline tensor of ", spec.ToString(), " does not match its checksum"));
    }
    return std::make_shared<const Tensor>(*std::move(t));
  }
  if (ref.where_case() != disk::TensorRef::kBlob || ref.blob().empty() ||
      ref.blob().find('/') != std::string::npos) {
    return absl::DataLossError("a tensor recorded with neither bytes nor a blob name");
  }
  const std::string path = dir_ + "/" + ref.blob();
  const uint64_t chunk = ref.chunk_bytes();
  const uint64_t n = ref.byte_size();
  if (chunk == 0 || static_cast<uint64_t>(ref.chunk_checksums_size()) != (n + chunk - 1) / chunk) {
    return absl::DataLossError(absl::StrCat("blob ", path, ": recorded with ",
                                            ref.chunk_checksums_size(), " chunk checksums"));
  }
  uint64_t on_disk = 0;
  if (rocksdb::Status s = fs_->GetFileSize(path, kIo, &on_disk, nullptr); !s.ok()) {
    return absl::DataLossError(absl::StrCat("blob ", path, " is missing: ", s.ToString()));
  }
  if (on_disk != n) {
    return absl::DataLossError(absl::StrCat("blob ", path, " has ", on_disk,
                                            " bytes; its record says ", n, " (damaged at offset ",
                                            std::min(on_disk, n), ")"));
  }
  if (!mapping()) return ReadWhole(ref, path, spec);
  auto mapped = Buffer::MapFile(path, n);
  if (absl::IsInternal(mapped.status())) {
    // No mapping to be had (vm.max_map_count, address space): the value is
    // read into memory instead, checked whole.
    spdlog::warn("blob {} is read into memory: {}", path, mapped.status().ToString());
    return ReadWhole(ref, path, spec);
  }
  if (!mapped.ok()) {
    return absl::Status(mapped.status().code(),
                        absl::StrCat("blob ", path, ": ", mapped.status().message()));
  }
  {
    absl::MutexLock lock(&mu_);
    auto [it, added] = known_.try_emplace(ref.blob());
    if (added) {
      it->second.chunk_bytes = chunk;
      it->second.sums.assign(ref.chunk_checksums().begin(), ref.chunk_checksums().end());
    }
  }
  auto t =
      std::make_shared<const Tensor>(Tensor{std::move(spec), *std::move(mapped), ref.checksum()});
  absl::MutexLock lock(&mu_);
  TrackMapping(ref.blob(), t);
  return t;
}

absl::StatusOr<std::shared_ptr<const Tensor>> BlobStore::ReadWhole(const disk::TensorRef& ref,
                                                                   const std::string& path,
                                                                   const TensorSpec& spec) {
  const uint64_t chunk = ref.chunk_bytes();
  const uint64_t n = ref.byte_size();
  std::unique_ptr<rocksdb::FSRandomAccessFile> file;
  REPVAR_RETURN_IF_ERROR(FromIo(
      fs_->NewRandomAccessFile(path, rocksdb::FileOptions(), &file, nullptr), "open " + path));
  REPVAR_ASSIGN_OR_RETURN(Tensor t, Tensor::ForOverwrite(spec));
  for (uint64_t off = 0, i = 0; off < n; off += chunk, ++i) {
    const size_t len = static_cast<size_t>(std::min(chunk, n - off));
    char* dst = reinterpret_cast<char*>(t.bytes.data() + off);
    rocksdb::Slice got;
    REPVAR_RETURN_IF_ERROR(FromIo(file->Read(off, len, kIo, &got, dst, nullptr), "read " + path));
    if (got.size() != len) {
      return absl::DataLossError(
          absl::StrCat("blob ", path, ": short read at offset ", off + got.size()));
    }
    if (got.data() != dst) std::memcpy(dst, got.data(), len);
    if (Checksum(std::as_bytes(std::span<const char>(dst, len))) != ref.chunk_checksums(i)) {
      return absl::DataLossError(absl::StrCat("blob ", path, ": bytes ", off, "..", off + len,
                                              " do not match their checksum (damaged at offset ",
                                              off, " or after)"));
    }
  }
  t.UpdateChecksum();
  if (t.checksum != ref.checksum()) {
    return absl::DataLossError(absl::StrCat("blob ", path, " does not match its checksum"));
  }
  return std::make_shared<const Tensor>(std::move(t));
}

absl::StatusOr<std::shared_ptr<const Tensor>> BlobStore::Mapped(std::shared_ptr<const Tensor> t) {
  if (t == nullptr || !mapping() || BlobBytes(*t) == 0 || t->bytes.file_backed()) return t;
  const std::string name = BlobNameOf(*t);
  auto mapped = Buffer::MapFile(dir_ + "/" + name, t->bytes.size());
  if (!mapped.ok()) {
    return absl::Status(mapped.status().code(),
                        absl::StrCat("blob ", dir_, "/", name, ": ", mapped.status().message()));
  }
  // The same bytes, so the same chunk sums (Check verifies the file's bytes
  // against them before the value is served).
  auto kept = std::make_shared<const Tensor>(
      Tensor{t->spec, *std::move(mapped), t->checksum, t->chunk_checksums});
  absl::MutexLock lock(&mu_);
  TrackMapping(name, kept);
  return kept;
}

void BlobStore::TrackMapping(const std::string& name, const std::shared_ptr<const Tensor>& t) {
  std::vector<std::weak_ptr<const Tensor>>& held = mappings_[name];
  std::erase_if(held, [](const std::weak_ptr<const Tensor>& w) { return w.expired(); });
  held.push_back(t);
}

std::optional<absl::Status> BlobStore::CheckIfKnown(const Tensor& t) {
  if (!t.bytes.file_backed()) return absl::OkStatus();
  const std::string name = BlobNameOf(t);
  absl::MutexLock lock(&mu_);
  auto it = known_.find(name);
  if (it == known_.end()) return std::nullopt;
  switch (it->second.checked) {
    case BlobInfo::Checked::kGood:
      return absl::OkStatus();
    case BlobInfo::Checked::kDamaged:
      return it->second.damage;
    case BlobInfo::Checked::kNo:
      break;
  }
  return std::nullopt;
}

absl::Status BlobStore::Check(const Tensor& t) {
  if (std::optional<absl::Status> known = CheckIfKnown(t)) return *std::move(known);
  // Its first use.
  const std::string name = BlobNameOf(t);
  const std::string path = dir_ + "/" + name;
  BlobInfo info;
  {
    absl::MutexLock lock(&mu_);
    auto it = known_.find(name);
    if (it != known_.end()) info = it->second;
  }
  // Outside the lock: a pass over the file's bytes. Two first uses at once
  // both check; they find the same.
  absl::Status found;
  if (info.chunk_bytes == 0) {
    if (Checksum(t.bytes.span()) != t.checksum) {
      found = absl::DataLossError(absl::StrCat("blob ", path, " does not match its checksum"));
    }
  } else {
    const uint64_t n = t.bytes.size();
    for (uint64_t off = 0, i = 0; off < n && found.ok(); off += info.chunk_bytes, ++i) {
      const size_t len = static_cast<size_t>(std::min(info.chunk_bytes, n - off));
      if (i >= info.sums.size() || Checksum(t.bytes.span().subspan(off, len)) != info.sums[i]) {
        found = absl::DataLossError(absl::StrCat("blob ", path, ": bytes ", off, "..", off + len,
                                                 " do not match their checksum (damaged at offset ",
                                                 off, " or after)"));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  BlobInfo& known = known_[name];
  if (known.chunk_bytes == 0) known = std::move(info);
  known.checked = found.ok() ? BlobInfo::Checked::kGood : BlobInfo::Checked::kDamaged;
  known.damage = found;
  return found;
}

absl::StatusOr<int> BlobStore::CollectGarbage(const absl::flat_hash_set<std::string>& live) {
  std::vector<std::string> children;
  REPVAR_RETURN_IF_ERROR(FromIo(fs_->GetChildren(dir_, kIo, &children, nullptr), "list " + dir_));
  int collected = 0;
  for (const std::string& name : children) {
    if (!absl::EndsWith(name, ".bin") || absl::StartsWith(name, "tmp-") || live.contains(name)) {
      continue;
    }
    bool mapped = false;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = mappings_.find(name); it != mappings_.end()) {
        for (const auto& w : it->second) mapped = mapped || !w.expired();
        mappings_.erase(it);
      }
      known_.erase(name);
    }
    uint64_t size = 0;
    rocksdb::IOStatus s = fs_->GetFileSize(dir_ + "/" + name, kIo, &size, nullptr);
    if (s.IsNotFound()) continue;
    REPVAR_RETURN_IF_ERROR(FromIo(s, "stat " + name));
    REPVAR_ASSIGN_OR_RETURN(const bool gone, Recycle(name, size, mapped));
    if (gone) ++collected;
  }
  return collected;
}

absl::StatusOr<bool> BlobStore::Recycle(const std::string& name, uint64_t size, bool mapped) {
  const std::string path = dir_ + "/" + name;
  if (!mapped && Recyclable(size)) {
    // No directory sync: a power loss that undoes the rename brings the
    // garbage back under its name, for the next collection.
    const std::string free_path = absl::StrCat(dir_, "/free-", tmp_serial_.fetch_add(1));
    rocksdb::IOStatus s = fs_->RenameFile(path, free_path, kIo, nullptr);
    if (s.IsNotFound()) return false;
    REPVAR_RETURN_IF_ERROR(FromIo(s, "recycle " + name));
    REPVAR_RETURN_IF_ERROR(KeepRecycled(Recycled{free_path, size}));
    return true;
  }
  // Deleted: a mapping of it keeps its bytes as they are until it goes.
  rocksdb::IOStatus s = fs_->DeleteFile(path, kIo, nullptr);
  if (s.IsNotFound()) return false;
  REPVAR_RETURN_IF_ERROR(FromIo(s, "delete " + name));
  return true;
}

absl::Status BlobStore::KeepRecycled(Recycled r) {
  std::vector<Recycled> evicted;
  {
    absl::MutexLock lock(&mu_);
    recycled_bytes_ += r.size;
    recycled_.push_back(std::move(r));
    while (recycled_bytes_ > options_.recycle_bytes) {
      evicted.push_back(recycled_.front());
      recycled_bytes_ -= recycled_.front().size;
      recycled_.pop_front();
    }
  }
  for (const Recycled& e : evicted) {
    rocksdb::IOStatus d = fs_->DeleteFile(e.path, kIo, nullptr);
    if (!d.IsNotFound()) REPVAR_RETURN_IF_ERROR(FromIo(d, "delete " + e.path));
  }
  return absl::OkStatus();
}

uint64_t BlobStore::DropRecycled() {
  std::deque<Recycled> dropped;
  uint64_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    dropped.swap(recycled_);
    bytes = std::exchange(recycled_bytes_, 0);
  }
  for (const Recycled& r : dropped) {
    if (rocksdb::IOStatus s = fs_->DeleteFile(r.path, kIo, nullptr); !s.ok() && !s.IsNotFound()) {
      spdlog::warn("deleting the recycled blob file {}: {}", r.path, s.ToString());
    }
  }
  return bytes;
}

uint64_t BlobStore::recycled_bytes() const {
  absl::MutexLock lock(&mu_);
  return recycled_bytes_;
}

}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
#include "server/store/rocks_state_log.h"

#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/arena_message.h"
#include "common/base/metrics.h"
#include "common/base/status_util.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

constexpr char kFormatKey[] = "format";
constexpr char kFormat[] = "repvar-state 1";
constexpr char kMetaKey[] = "c/meta";
constexpr char kCheckpointBegin[] = "c/";
constexpr char kCheckpointEnd[] = "c0";  // '0' follows '/'
constexpr char kWorkers[] = "c/w/";
constexpr char kVariables[] = "c/v/";
constexpr char kOutcomes[] = "c/o/";
constexpr char kLog[] = "l/";

void AppendBigEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t ReadBigEndian(absl::string_view in) {
  uint64_t v = 0;
  for (char c : in) v = (v << 8) | static_cast<uint8_t>(c);
  return v;
}
absl::string_view Suffix(const rocksdb::Slice& key, size_t prefix) {
  return absl::string_view(key.data() + prefix, key.size() - prefix);
}
std::string Key(absl::string_view prefix, uint64_t n) {
  std::string k(prefix);
  AppendBigEndian(&k, n, 8);
  return k;
}
std::string WorkerKey(const TaskKey& t) {
  std::string k = absl::StrCat(kWorkers, t.job);
  k.push_back('\0');
  AppendBigEndian(&k, static_cast<uint32_t>(t.task), 4);
  return k;
}

// Calls `fn(slot)` for every tensor a record carries.
template <typename R, typename F>
void ForEachValue(R& record, F&& fn) {
  for (auto& change : record.changes) {
    std::visit(
        [&](auto& c) {
          using T = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<T, VariableCreated>) fn(c.initializer.value);
          if constexpr (std::is_same_v<T, ValueKept>) fn(c.value);
          if constexpr (std::is_same_v<T, WritePrepared>) {
            for (auto& v : c.values) fn(v.value);
          }
          if constexpr (std::is_same_v<T, ValueCommitted>) {
            fn(c.value);
            if (c.initializer) fn(c.initializer->value);
          }
        },
        change);
  }
}

// The tensor bytes a record puts in blob files.
uint64_t BlobBytesOf(const Record& record, const BlobStore& blobs) {
  uint64_t total = 0;
  ForEachValue(record, [&](const std::shared_ptr<const Tensor>& t) {
    if (t != nullptr) total += blobs.BlobBytes(*t);
  });
  return total;
}

// A checkpoint names blobs that are on disk already: describe, do not write.
class Described final : public TensorFiles {
 public:
  explicit Described(BlobStore& blobs) : blobs_(blobs) {}
  absl::Status Keep(const Tensor& t, disk::TensorRef* ref) override {
    blobs_.Describe(t, ref);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<const Tensor>> Load(const disk::TensorRef& ref) override {
    return blobs_.Load(ref);
  }

 private:
  BlobStore& blobs_;
};

absl::Status Parse(google::protobuf::MessageLite* m, const rocksdb::Slice& bytes,
                   absl::string_view what) {
  if (!m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("state on disk: ", what, " does not parse"));
  }
  return absl::OkStatus();
}

}  // namespace

RocksStateLog::RocksStateLog(RocksStateLogOptions options, std::shared_ptr<rocksdb::FileSystem> fs,
                             std::unique_ptr<rocksdb::Env> env)
    : options_(std::move(options)),
      fs_(std::move(fs)),
      env_(std::move(env)),
      blobs_(fs_.get(), options_.dir + "/blobs", [&] {
        BlobStoreOptions b = options_.blobs;
        b.sync = options_.sync;
        return b;
      }()) {}

RocksStateLog::~RocksStateLog() {
  if (db_ != nullptr) (void)db_->Close();
}

absl::StatusOr<std::unique_ptr<RocksStateLog>> RocksStateLog::Open(RocksStateLogOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("the data dir is empty");
  std::shared_ptr<rocksdb::FileSystem> fs =
      options.fs != nullptr ? options.fs : rocksdb::FileSystem::Default();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  REPVAR_RETURN_IF_ERROR(FromIo(fs->CreateDirIfMissing(options.dir, rocksdb::IOOptions(), nullptr),
                                "create " + options.dir));
  std::unique_ptr<RocksStateLog> log(new RocksStateLog(std::move(options), fs, std::move(env)));

  rocksdb::Options o;
  o.create_if_missing = true;
  o.env = log->env_.get();
  o.paranoid_checks = true;
  // Every record is synced before it is acknowledged, so only a record that
  // was never acknowledged can be torn; anything else is corruption.
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 2;
  o.max_background_jobs = 2;
  rocksdb::DB* db = nullptr;
  const std::string path = log->options_.dir + "/db";
  rocksdb::Status s = rocksdb::DB::Open(o, path, &db);
  if (!s.ok()) {
    if (s.IsIOError() && absl::StrContains(absl::AsciiStrToLower(s.ToString()), "lock")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data dir ", log->options_.dir,
          " is in use by another coordinator (its RocksDB LOCK is held): ", s.ToString()));
    }
    return FromIo(s, "open " + path);
  }
  log->db_.reset(db);
  REPVAR_RETURN_IF_ERROR(log->blobs_.Open());

  std::string format;
  s = db->Get(rocksdb::ReadOptions(), kFormatKey, &format);
  if (s.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    if (it->Valid()) {
      return absl::DataLossError(
          absl::StrCat("data dir ", log->options_.dir, " holds data but no format key"));
    }
    rocksdb::WriteOptions w;
    w.sync = log->options_.sync;
    REPVAR_RETURN_IF_ERROR(FromIo(db->Put(w, kFormatKey, kFormat), "write the format key"));
  } else if (!s.ok()) {
    return FromIo(s, "read the format key");
  } else if (format != kFormat) {
    return absl::FailedPreconditionError(absl::StrCat("data dir ", log->options_.dir, " holds \"",
                                                      format, "\"; this build reads \"", kFormat,
                                                      "\""));
  }
  return log;
}

// A storage failure after which memory and disk may disagree: stop, and let
// a restart recover what was synced (fsyncgate: never retry and pretend).
absl::Status RocksStateLog::Fatal(absl::Status s) {
  {
    // Nothing is reported durable after this (and RocksDB is not asked to
    // sync a log it failed to write).
    absl::MutexLock lock(&sync_mu_);
    if (sync_failed_.ok()) sync_failed_ = s;
  }
  if (options_.on_fatal) {
    options_.on_fatal(s);
    return absl::InternalError(absl::StrCat("state log: ", s.message()));
  }
  spdlog::critical("state log: {}; stopping (a restart recovers what was synced)", s.ToString());
  spdlog::shutdown();
  std::fprintf(stderr, "state log: %s; stopping (a restart recovers what was synced)\n",
               s.ToString().c_str());
  std::abort();
}

absl::Status RocksStateLog::CheckSpace(uint64_t bytes) {
  uint64_t free = 0;
  rocksdb::IOStatus s = fs_->GetFreeSpace(options_.dir, rocksdb::IOOptions(), &free, nullptr);
  if (s.IsNotSupported()) return absl::OkStatus();
  REPVAR_RETURN_IF_ERROR(FromIo(s, "free space of " + options_.dir));
  auto short_of_room = [&] {
    return free < options_.min_free_bytes || free - options_.min_free_bytes < bytes;
  };
  if (short_of_room() && blobs_.DropRecycled() > 0) {
    // The recycled blob files gave their room back.
    REPVAR_RETURN_IF_ERROR(
        FromIo(fs_->GetFreeSpace(options_.dir, rocksdb::IOOptions(), &free, nullptr),
               "free space of " + options_.dir));
  }
  if (short_of_room()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data dir ", options_.dir, " has ", free, " bytes free; this change needs ", bytes,
        " more than the reserve of ", options_.min_free_bytes, " (nothing was changed)"));
  }
  return absl::OkStatus();
}

absl::Status RocksStateLog::CheckRoom(uint64_t value_bytes) {
  return CheckSpace(value_bytes + (uint64_t{1} << 20));
}

absl::StatusOr<uint64_t> RocksStateLog::Append(Record& record) {
  if (!recovered_) return absl::FailedPreconditionError("the state log appends after Recover");
  if (needs_resume_) {
    if (!db_->Resume().ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("data dir ", options_.dir, " is still out of space"));
    }
    needs_resume_ = false;
  }
  const uint64_t blob_bytes = BlobBytesOf(record, blobs_);
  REPVAR_RETURN_IF_ERROR(CheckSpace(blob_bytes + (uint64_t{1} << 20)));
  // A batch of a thousand creates is a thousand messages with their
  // placements: built on one arena, freed at once.
  ArenaMessage<disk::Record> encoded;
  if (absl::Status s = EncodeRecord(record, blobs_, encoded.get()); !s.ok()) {
    if (absl::IsResourceExhausted(s)) return s;
    return Fatal(s);
  }
  rocksdb::WriteBatch batch;
  batch.Put(Key(kLog, next_sequence_), encoded->SerializeAsString());
  // Not synced here: Durable syncs it, for every writer waiting then.
  if (rocksdb::Status s = db_->Write(rocksdb::WriteOptions(), &batch); !s.ok()) {
    bool unsynced = false;
    {
      absl::MutexLock lock(&sync_mu_);
      unsynced = durable_ < appended_ || syncing_;
    }
    // Out of space, with every earlier record synced: refused, nothing
    // changed, and RocksDB resumes at the next append. With records still
    // waiting for their sync, the log they are in failed under them.
    if (s.IsNoSpace() && !unsynced) {
      needs_resume_ = true;
      return FromIo(s, "append a record");
    }
    return Fatal(FromIo(s, "append a record"));
  }
  const uint64_t position = next_sequence_++;
  {
    absl::MutexLock lock(&sync_mu_);
    appended_ = position;
  }
  MapValues(record);
  ++since_checkpoint_;
  ++stats_.records;
  return position;
}

void RocksStateLog::MapValues(Record& record) {
  ForEachValue(record, [&](std::shared_ptr<const Tensor>& value) {
    if (value == nullptr) return;
    auto mapped = blobs_.Mapped(value);
    if (!mapped.ok()) {
      // Still correct, only heavier: the value stays in memory.
      spdlog::warn("state log: a value stays in memory: {}", mapped.status().ToString());
      return;
    }
    value = *std::move(mapped);
  });
}

absl::Status RocksStateLog::Durable(uint64_t position) {
  absl::MutexLock lock(&sync_mu_);
  if (position > appended_) {
    return absl::InvalidArgumentError(
        absl::StrCat("state log: position ", position, " was never appended"));
  }
  auto not_syncing = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_) { return !syncing_; };
  while (durable_ < position) {
    if (!sync_failed_.ok()) return sync_failed_;
    if (syncing_) {
      // Someone is syncing a group that may or may not include `position`.
      sync_mu_.Await(absl::Condition(&not_syncing));
      continue;
    }
    // Lead the next group: everything appended so far.
    syncing_ = true;
    const uint64_t target = appended_;
    sync_mu_.Unlock();
    static Histogram& sync_seconds = Metrics::Global().GetHistogram(
        "repvar_state_log_sync_seconds", "fsync of the coordinator's state log (one per group)");
    const absl::Time sync_start = absl::Now();
    const rocksdb::Status s = options_.sync ? db_->SyncWAL() : rocksdb::Status::OK();
    sync_seconds.Observe(absl::Now() - sync_start);
    sync_mu_.Lock();
    syncing_ = false;
    ++syncs_;
    if (!s.ok()) {
      const absl::Status failed = FromIo(s, "sync the state log");
      sync_mu_.Unlock();
      (void)Fatal(failed);  // returns only when a test asked it to
      sync_mu_.Lock();
      return sync_failed_;
    }
    durable_ = std::max(durable_, target);
  }
  return absl::OkStatus();
}

bool RocksStateLog::IsDurable(uint64_t position) {
  absl::MutexLock lock(&sync_mu_);
  // Without syncs Durable returns at once (after a failed sync, never).
  return sync_failed_.ok() && (durable_ >= position || !options_.sync);
}

void RocksStateLog::MarkDurable(uint64_t position) {
  absl::MutexLock lock(&sync_mu_);
  appended_ = std::max(appended_, position);
  durable_ = std::max(durable_, position);
}

void RocksStateLog::CountFromHere() {
  since_checkpoint_ = 0;
  blob_bytes_at_checkpoint_ = blobs_.blob_bytes_written();
}

void RocksStateLog::Applied(const ClusterState& state) {
  if (since_checkpoint_ < options_.checkpoint_every &&
      blobs_.blob_bytes_written() - blob_bytes_at_checkpoint_ < options_.checkpoint_blob_bytes) {
    return;
  }
  if (absl::Status s = WriteCheckpoint(state); !s.ok()) {
    if (!absl::IsResourceExhausted(s)) {
      (void)Fatal(s);
      return;
    }
    // Records stay in the log; try again after as many more.
    spdlog::warn("state log: checkpoint postponed: {}", s.ToString());
    CountFromHere();
  }
}

absl::Status RocksStateLog::WriteCheckpoint(const ClusterState& state) {
  Described files(blobs_);
  rocksdb::WriteBatch batch;
  batch.DeleteRange(kCheckpointBegin, kCheckpointEnd);
  disk::Checkpoint meta;
  meta.set_last_sequence(next_sequence_ - 1);
  meta.set_next_variable_id(state.next_variable_id());
  meta.set_topology_version(state.topology_version());
  meta.set_last_committed_step(state.last_committed_step());
  if (state.last_step().epoch > 0) {
    const LastStep& last = state.last_step();
    EncodeStepCommitted(StepCommitted{last.step, last.epoch, last.changed},
                        meta.mutable_last_step());
  }
  meta.set_last_epoch(state.last_epoch());
  meta.set_fences_reserved(state.fences_reserved());
  for (const auto& [key, w] : state.workers()) {
    disk::WorkerRecord row;
    EncodeWorker(w, &row);
    batch.Put(WorkerKey(key), row.SerializeAsString());
  }
  absl::flat_hash_set<std::string> live;
  for (const auto& [id, v] : state.variables()) {
    disk::VariableRecord row;
    REPVAR_RETURN_IF_ERROR(EncodeVariable(v, files, &row));
    batch.Put(Key(kVariables, id), row.SerializeAsString());
    for (const auto* t : {v.value.get(), v.initializer.value.get()}) {
      if (t != nullptr && blobs_.BlobBytes(*t) > 0) live.insert(blobs_.BlobNameOf(*t));
    }
  }
  if (!state.prepared().empty()) {
    Record prepared;
    for (const auto& [fence, p] : state.prepared()) prepared.changes.push_back(p);
    ForEachValue(prepared, [&](const std::shared_ptr<const Tensor>& t) {
      if (t != nullptr && blobs_.BlobBytes(*t) > 0) live.insert(blobs_.BlobNameOf(*t));
    });
    REPVAR_RETURN_IF_ERROR(EncodeRecord(prepared, files, meta.mutable_prepared()));
  }
  batch.Put(kMetaKey, meta.SerializeAsString());
  uint64_t n = 0;
  state.ForEachOutcome([&](const std::string& id, const StoredOutcome& o) {
    disk::RequestRecorded row;
    EncodeOutcome(id, o, &row);
    batch.Put(Key(kOutcomes, n++), row.SerializeAsString());
  });
  batch.DeleteRange(Key(kLog, 0), Key(kLog, next_sequence_));
  REPVAR_RETURN_IF_ERROR(CheckSpace(batch.GetDataSize()));
  rocksdb::WriteOptions w;
  w.sync = options_.sync;
  REPVAR_RETURN_IF_ERROR(FromIo(db_->Write(w, &batch), "write a checkpoint"));
  // A synced write syncs the log before it: the records are durable too.
  if (options_.sync) MarkDurable(next_sequence_ - 1);
  CountFromHere();
  ++stats_.checkpoints;
  // Only now are the blobs of the records it replaced garbage.
  REPVAR_ASSIGN_OR_RETURN(int collected, blobs_.CollectGarbage(live));
  if (collected > 0) spdlog::debug("state log: {} blobs no longer named were collected", collected);
  return absl::OkStatus();
}

absl::Status RocksStateLog::LoadCheckpoint(ClusterStateData& data, uint64_t& last_sequence) {
  std::string bytes;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kMetaKey, &bytes);
  if (s.IsNotFound()) return absl::OkStatus();  // never checkpointed
  REPVAR_RETURN_IF_ERROR(FromIo(s, "read the checkpoint"));
  disk::Checkpoint meta;
  REPVAR_RETURN_IF_ERROR(Parse(&meta, bytes, "the checkpoint"));
  last_sequence = meta.last_sequence();
  data.next_variable_id = meta.next_variable_id();
  data.topology_version = meta.topology_version();
  data.last_committed_step = meta.last_committed_step();
  if (meta.has_last_step()) {
    StepCommitted last = DecodeStepCommitted(meta.last_step());
    data.last_step = LastStep{last.step, last.epoch, std::move(last.changed)};
  }
  data.last_epoch = meta.last_epoch();
  data.fences_reserved = meta.fences_reserved();
  if (meta.has_prepared()) {
    REPVAR_ASSIGN_OR_RETURN(Record prepared, DecodeRecord(meta.prepared(), blobs_));
    for (Change& c : prepared.changes) {
      auto* p = std::get_if<WritePrepared>(&c);
      if (p == nullptr) return absl::DataLossError("checkpoint: a prepared write of another kind");
      data.prepared.push_back(std::move(*p));
    }
  }

  rocksdb::ReadOptions r;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(r));
  for (it->Seek(kWorkers); it->Valid() && it->key().starts_with(kWorkers); it->Next()) {
    disk::WorkerRecord row;
    REPVAR_RETURN_IF_ERROR(Parse(&row, it->value(), "a checkpointed worker"));
    REPVAR_ASSIGN_OR_RETURN(WorkerRecord w, DecodeWorker(row));
    TaskKey key = w.task;
    data.workers.emplace(std::move(key), std::move(w));
  }
  PlacementInterner placements;
  for (it->Seek(kVariables); it->Valid() && it->key().starts_with(kVariables); it->Next()) {
    disk::VariableRecord row;
    REPVAR_RETURN_IF_ERROR(Parse(&row, it->value(), "a checkpointed variable"));
    REPVAR_ASSIGN_OR_RETURN(VariableRecord v, DecodeVariable(row, blobs_, &placements));
    const uint64_t id = ReadBigEndian(Suffix(it->key(), sizeof(kVariables) - 1));
    data.variables.emplace(id, std::move(v));
  }
  for (it->Seek(kOutcomes); it->Valid() && it->key().starts_with(kOutcomes); it->Next()) {
    disk::RequestRecorded row;
    REPVAR_RETURN_IF_ERROR(Parse(&row, it->value(), "a checkpointed answer"));
    REPVAR_ASSIGN_OR_RETURN(auto outcome, DecodeOutcome(row));
    data.outcomes.push_back(std::move(outcome));
  }
  return FromIo(it->status(), "read the checkpoint");
}

absl::Status RocksStateLog::Recover(ClusterState& state) {
  if (recovered_) return absl::FailedPreconditionError("the state log was recovered already");
  ClusterStateData data;
  uint64_t last = 0;
  REPVAR_RETURN_IF_ERROR(LoadCheckpoint(data, last));
  REPVAR_RETURN_IF_ERROR(state.Restore(std::move(data)));

  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(Key(kLog, last + 1)); it->Valid() && it->key().starts_with(kLog); it->Next()) {
    const uint64_t seq = ReadBigEndian(Suffix(it->key(), sizeof(kLog) - 1));
    if (seq != last + 1) {
      return absl::DataLossError(
          absl::StrCat("state log: record ", last + 1, " is missing (the next is ", seq, ")"));
    }
    disk::Record row;
    REPVAR_RETURN_IF_ERROR(Parse(&row, it->value(), absl::StrCat("record ", seq)));
    auto record = DecodeRecord(row, blobs_);
    if (!record.ok()) {
      return absl::Status(record.status().code(),
                          absl::StrCat("record ", seq, ": ", record.status().message()));
    }
    state.Apply(*record);
    last = seq;
    ++stats_.replayed;
  }
  REPVAR_RETURN_IF_ERROR(FromIo(it->status(), "read the state log"));
  next_sequence_ = last + 1;
  MarkDurable(last);
  recovered_ = true;
  // A fresh checkpoint: the replayed records go, and with them the blobs
  // only they named (and those of changes that were never recorded).
  if (absl::Status s = WriteCheckpoint(state); !s.ok()) {
    if (!absl::IsResourceExhausted(s)) return s;
    spdlog::warn("state log: no checkpoint at startup: {}", s.ToString());
  }
  return absl::OkStatus();
}

RocksStateLog::Stats RocksStateLog::stats() const {
  Stats s = stats_;
  s.last_sequence = next_sequence_ - 1;
  s.blobs_written = blobs_.blobs_written();
  s.blobs_reused = blobs_.blobs_reused();
  absl::MutexLock lock(&sync_mu_);
  s.syncs = syncs_;
  return s;
}

}  // namespace repvar::server

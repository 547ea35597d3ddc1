// SPDX-License-Identifier: Apache-2.0
// The state log on real RocksDB in a temporary directory: what a coordinator
// applied comes back exactly after a reopen (through checkpoints or the log
// alone); ids and sequences go on from there; a second process, an unknown
// format, no room and a failed sync are each refused or fatal as the
// contract says; replaced values' blobs are collected; a damaged blob stops
// recovery naming it.
#include "server/store/rocks_state_log.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "server/core/registry.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/power_loss_fs.h"
#include "tests/testing/random_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tensors.h"

namespace repvar::server {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::PowerLossFileSystem;
using ::repvar::testing::RandomCluster;
using ::repvar::testing::StatusIs;

absl::StatusOr<uint64_t> Append(StateLog& log, Record record) { return log.Append(record); }

class RocksStateLogTest : public ::testing::Test {
 protected:
  repvar::testing::TempDir dir_;
  std::shared_ptr<PowerLossFileSystem> fs_ = std::make_shared<PowerLossFileSystem>();

  RocksStateLogOptions Options(uint64_t checkpoint_every = 4096) {
    RocksStateLogOptions o;
    o.dir = dir_.path() + "/data";
    o.fs = fs_;
    o.checkpoint_every = checkpoint_every;
    o.blobs.inline_bytes = 8;  // values of more than two floats go to blob files
    o.blobs.chunk_bytes = 16;
    o.min_free_bytes = 1 << 20;
    return o;
  }
  std::unique_ptr<RocksStateLog> Open(RocksStateLogOptions o) {
    auto log = RocksStateLog::Open(std::move(o));
    EXPECT_OK(log);
    return log.ok() ? *std::move(log) : nullptr;
  }
  // What a fresh process recovers from the data dir.
  std::string Recovered(RocksStateLogOptions o) {
    auto log = Open(std::move(o));
    ClusterState state(RandomCluster::StateOptions());
    EXPECT_OK(log->Recover(state));
    return state.Dump();
  }
  // Creates "w" (3 floats, 2 replicas) and assigns it `times` values
  // {i, 1, 2}, i = 0.., in a cluster recovered from `log`.
  static void AssignW(StateLog* log, int times) {
    RandomCluster cluster(4, log);
    ASSERT_OK(cluster.core().Recover());
    cluster.Start();
    VariableDef def{.name = "w", .tensor = {DType::kFloat32, {3}}, .replica_count = 2};
    ASSERT_OK(cluster.core().CreateVariables({}, {{def, {}}}));
    for (int i = 0; i < times; ++i) {
      ASSERT_OK(
          cluster.core().Assign({}, {"w", AssignOp::kAssign, F32({static_cast<float>(i), 1, 2})}));
    }
  }
  std::vector<std::string> Blobs() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/data/blobs")) {
      out.push_back(e.path().string());
    }
    return out;
  }
};

TEST_F(RocksStateLogTest, Reopen_RecoversExactlyWhatWasApplied_ThroughCheckpointsOrTheLogAlone) {
  for (uint64_t every : {uint64_t{1}, uint64_t{7}, uint64_t{1000000}}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      std::filesystem::remove_all(dir_.path() + "/data");
      std::string expected;
      uint64_t checkpoints = 0;
      {
        auto log = Open(Options(every));
        RandomCluster cluster(seed, log.get(), 1 + static_cast<int>(seed));
        ASSERT_OK(cluster.core().Recover());
        cluster.Run(150);
        expected = cluster.CoordinatorState();
        checkpoints = log->stats().checkpoints;
      }
      EXPECT_EQ(Recovered(Options(every)), expected) << "every " << every << " seed " << seed;
      if (every == 1000000) {
        EXPECT_EQ(checkpoints, 1u) << "only the one at startup";
      }
      if (every == 7) {
        EXPECT_GT(checkpoints, 5u);
      }
    }
  }
}

// A write decided (WritePrepared) and not resolved when the process
// stopped is kept by checkpoints (taken here after every record) and
// committed by the next start (Registry::Recover: roll-forward), answer
// included; every replica of it is STALE until verified.
TEST_F(RocksStateLogTest, PreparedWrite_KeptByCheckpoints_RolledForwardAtRecovery) {
  repvar::testing::FakeClock clock;
  uint64_t id = 0;
  int64_t version = 0;
  std::shared_ptr<const Tensor> value;
  {
    auto log = Open(Options(/*checkpoint_every=*/1));
    RandomCluster cluster(5, log.get(), 3);
    ASSERT_OK(cluster.core().Recover());
    cluster.Run(60);
    cluster.core().registry().Read([&](const ClusterState& s) {
      for (const auto& [i, v] : s.variables()) {
        id = i;
        version = v.version;
      }
    });
    ASSERT_NE(id, 0u);
    value = F32({9, 9, 9});
    WritePrepared p{
        uint64_t{1} << 62,
        {PreparedValue{id, version + 1, value->checksum, value}},
        RequestRecorded{RequestKey{"req-prepared", 7}, "assign",
                        std::vector<WriteOutcome>{{version + 1, value->checksum}}, clock.Now()}};
    auto at = cluster.core().registry().Commit(
        [&](const ClusterState&) -> absl::StatusOr<Record> { return Record{{p}}; },
        Registry::Durability::kUnsynced);
    ASSERT_OK(at);
    ASSERT_OK(cluster.core().registry().AwaitDurable(*at));
    EXPECT_GT(log->stats().checkpoints, 1u);
  }
  EXPECT_THAT(Recovered(Options(1)), ::testing::HasSubstr("prepared 4611686018427387904"));

  auto log = Open(Options(1));
  Registry registry(RegistryOptions{.state = RandomCluster::StateOptions()}, &clock, log.get());
  ASSERT_OK(registry.Recover());
  registry.Read([&](const ClusterState& s) {
    EXPECT_TRUE(s.prepared().empty());
    const VariableRecord* v = s.FindId(id);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->version, version + 1);
    EXPECT_EQ(v->checksum, value->checksum);
    EXPECT_TRUE(v->needs_resync);
    for (size_t i = 0; i < v->replica_count(); ++i) {
      EXPECT_NE(v->StateOf(i), ReplicaState::kUpToDate);
    }
  });
  auto answer = registry.Outcome(RequestKey{"req-prepared", 7}, "assign");
  ASSERT_OK(answer);
  EXPECT_TRUE(answer->has_value()) << "the answer was not committed with the write";
}

TEST_F(RocksStateLogTest, RecoverThenContinue_IdsAndSequencesGoOn) {
  std::string expected;
  uint64_t last_sequence = 0;
  {
    auto log = Open(Options(10));
    RandomCluster cluster(1, log.get());
    ASSERT_OK(cluster.core().Recover());
    cluster.Run(100);
    last_sequence = log->stats().last_sequence;
  }
  {
    auto log = Open(Options(10));
    RandomCluster cluster(2, log.get());
    ASSERT_OK(cluster.core().Recover());
    // Recovery goes on from the last record (verifying what the recorded
    // workers hold may add some).
    EXPECT_GE(log->stats().last_sequence, last_sequence);
    // New registrations, creates and steps on top of the recovered state: a
    // reused id or epoch would crash ClusterState::Apply.
    cluster.Run(100);
    EXPECT_GT(log->stats().last_sequence, last_sequence);
    expected = cluster.CoordinatorState();
  }
  EXPECT_EQ(Recovered(Options(10)), expected);
}

TEST_F(RocksStateLogTest, SecondProcessOnTheSameDir_FailedPreconditionNamingTheLock) {
  auto first = Open(Options());
  EXPECT_THAT(RocksStateLog::Open(Options()),
              StatusIs(absl::StatusCode::kFailedPrecondition, "in use by another coordinator"));
  first.reset();
  EXPECT_OK(RocksStateLog::Open(Options()));  // free again
}

TEST_F(RocksStateLogTest, UnknownFormat_Refused) {
  Open(Options()).reset();
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir_.path() + "/data/db", &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "format", "repvar-state 99").ok());
    delete db;
  }
  EXPECT_THAT(RocksStateLog::Open(Options()),
              StatusIs(absl::StatusCode::kFailedPrecondition, "repvar-state 99"));
}

TEST_F(RocksStateLogTest, AppendBeforeRecover_FailedPrecondition) {
  auto log = Open(Options());
  EXPECT_THAT(Append(*log, Record{{StepBegun{1, 1}}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "after Recover"));
}

TEST_F(RocksStateLogTest, NoRoom_ResourceExhausted_NothingChanges_ThenWritesAgain) {
  auto log = Open(Options());
  RandomCluster cluster(3, log.get());
  ASSERT_OK(cluster.core().Recover());
  cluster.Start();
  VariableDef def{.name = "w", .tensor = {DType::kFloat32, {3}}, .replica_count = 2};
  ASSERT_OK(cluster.core().CreateVariables({}, {{def, {}}}));
  const std::string before = cluster.CoordinatorState();
  const uint64_t sequence = log->stats().last_sequence;

  fs_->SetFreeSpace(uint64_t{1} << 20);  // below the reserve
  EXPECT_THAT(cluster.core().Assign({}, {"w", AssignOp::kAssign, F32({1, 2, 3})}),
              StatusIs(absl::StatusCode::kResourceExhausted, "bytes free"));
  EXPECT_EQ(cluster.CoordinatorState(), before);
  EXPECT_EQ(log->stats().last_sequence, sequence);

  fs_->SetFreeSpace(std::nullopt);
  EXPECT_OK(cluster.core().Assign({}, {"w", AssignOp::kAssign, F32({1, 2, 3})}));
  EXPECT_EQ(log->stats().last_sequence, sequence + 2);  // WritePrepared, its commit
}

TEST_F(RocksStateLogTest, FailedSync_IsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto log = Open(Options());
        ClusterState state;
        (void)log->Recover(state);
        fs_->FailSyncs(true);
        auto position = Append(*log, Record{{StepBegun{1, 1}}});
        if (position.ok()) (void)log->Durable(*position);
      },
      "state log: .*sync failed.*stopping");
  // The same with the fatal path observed instead of taken: nothing is
  // acknowledged.
  auto o = Options();
  absl::Status fatal;
  o.on_fatal = [&](const absl::Status& s) { fatal = s; };
  auto log = Open(o);
  ClusterState state;
  ASSERT_OK(log->Recover(state));
  fs_->FailSyncs(true);
  auto position = Append(*log, Record{{StepBegun{1, 1}}});
  ASSERT_OK(position);  // written, not yet synced
  EXPECT_FALSE(log->IsDurable(*position));
  EXPECT_THAT(log->Durable(*position), StatusIs(absl::StatusCode::kInternal, "sync"));
  EXPECT_FALSE(fatal.ok());
  // It stays failed: nothing after it is ever reported durable.
  EXPECT_THAT(log->Durable(*position), StatusIs(absl::StatusCode::kInternal, "sync"));
  EXPECT_FALSE(log->IsDurable(*position));
}

// IsDurable tells without waiting what Durable would wait for: a record
// appended is not durable until a sync covers it; without syncs
// (--ephemeral's log) Durable never waits and everything is.
TEST_F(RocksStateLogTest, IsDurable_OnlyWhatASyncCovered_EverythingWithoutSyncs) {
  for (bool sync : {true, false}) {
    SCOPED_TRACE(sync);
    auto o = Options();
    o.sync = sync;
    auto log = Open(o);
    ClusterState state;
    ASSERT_OK(log->Recover(state));
    auto first = Append(*log, Record{{StepBegun{1, 1}}});
    ASSERT_OK(first);
    EXPECT_EQ(log->IsDurable(*first), !sync);
    ASSERT_OK(log->Durable(*first));
    EXPECT_TRUE(log->IsDurable(*first));
    auto second = Append(*log, Record{{StepBegun{2, 2}}});
    ASSERT_OK(second);
    EXPECT_EQ(log->IsDurable(*second), !sync);
    EXPECT_TRUE(log->IsDurable(*first));
    log.reset();
    std::filesystem::remove_all(dir_.path() + "/data");
  }
}

// Group commit: while one sync is under way, the records appended meanwhile
// wait for it and then share the next one - eight records, two syncs.
TEST_F(RocksStateLogTest, GroupCommit_WritersWaitingTogetherShareOneSync) {
  auto log = Open(Options());
  ClusterState state;
  ASSERT_OK(log->Recover(state));
  const uint64_t syncs_before = log->stats().syncs;
  absl::Notification in_sync, release;
  std::atomic<bool> gate{true};
  fs_->SetSyncHook([&](const std::string& fname) {
    // Hold the first sync of the write-ahead log (RocksDB's own file syncs
    // pass).
    if (!absl::EndsWith(fname, ".log") || !gate.exchange(false)) return;
    in_sync.Notify();
    release.WaitForNotification();
  });
  auto first = Append(*log, Record{{StepBegun{1, 1}}});
  ASSERT_OK(first);
  std::vector<std::thread> waiters;
  absl::Status first_durable;
  waiters.emplace_back([&] { first_durable = log->Durable(*first); });
  in_sync.WaitForNotification();  // the first sync is under way, and held
  std::vector<uint64_t> positions;
  for (int64_t i = 2; i <= 8; ++i) {
    auto p = Append(*log, Record{{StepBegun{i, static_cast<uint64_t>(i)}}});
    ASSERT_OK(p);
    positions.push_back(*p);
  }
  std::vector<absl::Status> durable(positions.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    waiters.emplace_back([&, i] { durable[i] = log->Durable(positions[i]); });
  }
  release.Notify();
  for (std::thread& t : waiters) t.join();
  EXPECT_OK(first_durable);
  for (const absl::Status& s : durable) EXPECT_OK(s);
  EXPECT_EQ(log->stats().records, 8u);
  EXPECT_EQ(log->stats().syncs - syncs_before, 2u)
      << "the seven records after the first share a sync";
  fs_->SetSyncHook(nullptr);
  // Durable is answered without a sync once covered.
  EXPECT_OK(log->Durable(positions.back()));
  EXPECT_EQ(log->stats().syncs - syncs_before, 2u);
}

TEST_F(RocksStateLogTest, Checkpoint_CollectsTheBlobsOfReplacedValues) {
  auto log = Open(Options(1));
  AssignW(log.get(), 10);
  EXPECT_EQ(Blobs().size(), 1u) << "only the value of version 10";
}

// Only a checkpoint deletes the blobs of replaced values, so one also comes
// after a bound on the bytes written to blobs, whatever the record count:
// without it a large variable assigned again and again held every version
// on disk until the 4,096th record. The control (no byte bound) keeps them
// all, so the check can fail.
TEST_F(RocksStateLogTest,
       Checkpoint_AfterEnoughBlobBytes_CollectsReplacedValuesBeforeTheRecordCount) {
  for (const bool bounded : {true, false}) {
    SCOPED_TRACE(bounded ? "bounded" : "control");
    RocksStateLogOptions o = Options(/*checkpoint_every=*/4096);
    o.dir = dir_.path() + (bounded ? "/bounded" : "/control");
    o.checkpoint_blob_bytes = bounded ? 40 : uint64_t{1} << 40;  // a value is 12 bytes
    auto log = Open(o);
    // Recovery writes one of its own.
    const uint64_t checkpoints = log->stats().checkpoints + 1;
    AssignW(log.get(), 20);
    size_t blobs = 0;
    for (const auto& e : std::filesystem::directory_iterator(o.dir + "/blobs")) {
      blobs += e.path().extension() == ".bin" ? 1 : 0;
    }
    if (bounded) {
      EXPECT_LE(blobs, 4u) << "the bytes bound checkpointed and collected";
      EXPECT_GE(log->stats().checkpoints, checkpoints + 4);
    } else {
      EXPECT_EQ(blobs, 20u) << "every version kept until the record count";
      EXPECT_EQ(log->stats().checkpoints, checkpoints);
    }
  }
}

// Freed blobs are written over by later values of their size, through
// the state log as the coordinator drives it: a variable assigned again
// and again reuses the same few files, and a restart recovers the last
// value with its bytes intact. The control (recycling off) writes a new
// file every time.
TEST_F(RocksStateLogTest, Recycle_RepeatedAssigns_ReuseFreedBlobs_RecoveringTheLastValue) {
  for (const bool recycle : {true, false}) {
    SCOPED_TRACE(recycle ? "recycling" : "control");
    RocksStateLogOptions o = Options();
    o.dir = dir_.path() + (recycle ? "/recycling" : "/control");
    o.checkpoint_blob_bytes = 40;  // a value is 12 bytes
    o.blobs.recycle_min_bytes = 1;
    o.blobs.recycle_bytes = recycle ? 1024 : 0;
    {
      auto log = Open(o);
      AssignW(log.get(), 20);
      const RocksStateLog::Stats stats = log->stats();
      if (recycle) {
        EXPECT_GE(stats.blobs_reused, 10u);
      } else {
        EXPECT_EQ(stats.blobs_reused, 0u);
      }
    }
    auto log = Open(o);
    ClusterState state(RandomCluster::StateOptions());
    ASSERT_OK(log->Recover(state));
    const VariableRecord* w = state.Find("w");
    ASSERT_NE(w, nullptr);
    ASSERT_NE(w->value, nullptr);
    EXPECT_OK(log->Check(*w->value));
    EXPECT_EQ(repvar::testing::Floats(*w->value), (std::vector<float>{19, 1, 2}));
  }
}

// Recycled files count against the disk until a change needs their room:
// then they are deleted before the change is refused. With room to spare
// they stay.
TEST_F(RocksStateLogTest, Recycle_NoRoom_TheRecycledFilesGoFirst) {
  RocksStateLogOptions o = Options();
  o.checkpoint_blob_bytes = 40;
  o.blobs.recycle_min_bytes = 1;
  auto log = Open(o);
  RandomCluster cluster(4, log.get());
  ASSERT_OK(cluster.core().Recover());
  cluster.Start();
  VariableDef a{.name = "a", .tensor = {DType::kFloat32, {3}}, .replica_count = 2};
  VariableDef b{.name = "b", .tensor = {DType::kFloat32, {5}}, .replica_count = 2};
  ASSERT_OK(cluster.core().CreateVariables({}, {{a, {}}, {b, {}}}));
  for (int i = 0; i < 8; ++i) {
    ASSERT_OK(
        cluster.core().Assign({}, {"a", AssignOp::kAssign, F32({static_cast<float>(i), 1, 2})}));
  }
  auto recycled = [&] {
    int n = 0;
    for (const std::string& path : Blobs()) n += absl::StrContains(path, "/free-") ? 1 : 0;
    return n;
  };
  ASSERT_GT(recycled(), 0);
  EXPECT_OK(log->CheckRoom(1 << 10));
  EXPECT_GT(recycled(), 0) << "room to spare: they stay";
  fs_->SetFreeSpace(uint64_t{1} << 20);  // below the reserve
  EXPECT_THAT(cluster.core().Assign({}, {"b", AssignOp::kAssign, F32({1, 2, 3, 4, 5})}),
              StatusIs(absl::StatusCode::kResourceExhausted, "bytes free"));
  EXPECT_EQ(recycled(), 0);
}

// Recovery maps blobs without reading them (a restart stays fast); a
// damaged one is found at the first use of its value and never served. A
// truncated one is refused at startup (its size is checked).
TEST_F(RocksStateLogTest, DamagedBlob_FoundAtFirstUseNamingTheFile_TruncatedRefusedAtStartup) {
  {
    auto log = Open(Options());
    RandomCluster cluster(5, log.get());
    ASSERT_OK(cluster.core().Recover());
    cluster.Start();
    VariableDef def{.name = "w", .tensor = {DType::kFloat32, {8}}, .replica_count = 2};
    ASSERT_OK(cluster.core().CreateVariables({}, {{def, {}}}));
    ASSERT_OK(cluster.core().Assign({}, {"w", AssignOp::kAssign, F32({1, 2, 3, 4, 5, 6, 7, 8})}));
  }
  auto blobs = Blobs();
  ASSERT_EQ(blobs.size(), 1u);
  {
    std::fstream f(blobs[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x01');
  }
  {
    auto log = Open(Options());
    ClusterState state;
    ASSERT_OK(log->Recover(state));
    const VariableRecord* w = state.Find("w");
    ASSERT_NE(w, nullptr);
    ASSERT_NE(w->value, nullptr);
    EXPECT_TRUE(w->value->bytes.file_backed());
    EXPECT_THAT(log->Check(*w->value),
                StatusIs(absl::StatusCode::kDataLoss, absl::StrCat(blobs[0], ": bytes 16..32")));
  }
  std::filesystem::resize_file(blobs[0], 12);
  auto log = Open(Options());
  ClusterState state;
  EXPECT_THAT(log->Recover(state),
              StatusIs(absl::StatusCode::kDataLoss, absl::StrCat(blobs[0], " has 12 bytes")));
}

// What the state holds of a value written through the log is the blob file,
// not a copy in memory.
TEST_F(RocksStateLogTest, CommittedValue_HeldAsItsBlobFile) {
  auto log = Open(Options());
  RandomCluster cluster(6, log.get());
  ASSERT_OK(cluster.core().Recover());
  cluster.Start();
  VariableDef def{.name = "w", .tensor = {DType::kFloat32, {8}}, .replica_count = 2};
  ASSERT_OK(cluster.core().CreateVariables({}, {{def, {}}}));
  ASSERT_OK(cluster.core().Assign({}, {"w", AssignOp::kAssign, F32({1, 2, 3, 4, 5, 6, 7, 8})}));
  std::shared_ptr<const Tensor> held = cluster.core().registry().Read(
      [](const ClusterState& state) { return state.Find("w")->value; });
  ASSERT_NE(held, nullptr);
  EXPECT_TRUE(held->bytes.file_backed());
  EXPECT_OK(log->Check(*held));
  auto read = cluster.core().Read("w");
  ASSERT_OK(read);
  EXPECT_EQ(repvar::testing::Floats(*read->value), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
}

}  // namespace
}  // namespace repvar::server

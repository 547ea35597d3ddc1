// SPDX-License-Identifier: Apache-2.0
// Power loss at any moment: a coordinator core runs random operations on the
// RocksDB state log over a file system whose power is cut at a random write,
// sync, rename or directory sync (inside a blob write, a record append, a
// checkpoint, blob collection, a freed blob renamed for reuse or written
// over, or RocksDB's own background work). Whatever
// was not synced is then lost, and the state recovered from what is left
// must hold every record the log reported durable (StateLog::Durable: what
// any answer waits for), followed by at most some of the records appended
// after them, in order - nothing acknowledged lost, nothing invented - and a
// coordinator started on it (which rolls forward writes decided by a synced
// WritePrepared whose commit was not synced) must hold every write it
// answered. The
// negative control runs the same trials without syncs and must lose
// acknowledged records, or the test proves nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/core/registry.h"
#include "server/store/rocks_state_log.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/power_loss_fs.h"
#include "tests/testing/random_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar::server {
namespace {

using ::repvar::testing::PowerLossFileSystem;
using ::repvar::testing::RandomCluster;

// Passes everything to the RocksDB log and keeps, beside it, the state made
// of the records it reported durable, and the records appended after them.
class AcknowledgedLog final : public StateLog {
 public:
  explicit AcknowledgedLog(StateLog* log) : log_(log), acked_(RandomCluster::StateOptions()) {}

  absl::StatusOr<uint64_t> Append(Record& record) override {
    auto position = log_->Append(record);
    absl::MutexLock lock(&mu_);
    if (position.ok()) pending_.emplace(*position, record);
    return position;
  }
  absl::Status Durable(uint64_t position) override {
    absl::Status s = log_->Durable(position);
    absl::MutexLock lock(&mu_);
    if (s.ok()) {
      while (!pending_.empty() && pending_.begin()->first <= position) {
        acked_.Apply(pending_.begin()->second);
        pending_.erase(pending_.begin());
      }
    }
    return s;
  }
  absl::Status CheckRoom(uint64_t bytes) override { return log_->CheckRoom(bytes); }
  absl::Status Stage(const Tensor& value) override { return log_->Stage(value); }
  void Applied(const ClusterState& state) override { log_->Applied(state); }
  absl::Status Recover(ClusterState& state) override { return log_->Recover(state); }

  // Whether `recovered` is the acknowledged state followed by a prefix of
  // the records appended after it. Consumes the pending records.
  bool Explains(const std::string& recovered, std::string* detail) {
    absl::MutexLock lock(&mu_);
    std::string candidate = acked_.Dump();
    if (candidate == recovered) return true;
    const std::string acked = candidate;
    for (auto& [position, record] : pending_) {
      acked_.Apply(record);
      candidate = acked_.Dump();
      if (candidate == recovered) return true;
    }
    *detail = absl::StrCat("recovered:\n", recovered, "\nacknowledged:\n", acked, "\n(",
                           pending_.size(), " records appended after it)");
    return false;
  }

 private:
  StateLog* const log_;
  absl::Mutex mu_;
  ClusterState acked_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Record> pending_ ABSL_GUARDED_BY(mu_);  // appended, not yet durable
};

struct Trial {
  uint64_t mutations = 0;     // file system operations the run made
  bool cut = false;           // the power went off before the run ended
  bool recovered = false;     // the data dir opened and recovered
  bool same = false;          // into the acknowledged state (+ some unacknowledged records)
  bool answers_kept = false;  // every answered write at or below its variable's version
  uint64_t answered = 0;      // variables written with an answer
  uint64_t reused = 0;        // blobs written over recycled files before the cut
  std::string detail;
};

// One run of `seed`: the power goes off at the `cut_at`-th mutating file
// system operation (0: never), then the data dir is opened again.
Trial RunTrial(const std::string& dir, uint64_t seed, bool sync, uint64_t cut_at) {
  std::filesystem::remove_all(dir);
  std::mt19937_64 rng(seed);
  auto fs = std::make_shared<PowerLossFileSystem>(rocksdb::FileSystem::Default(),
                                                  /*real_syncs=*/false);
  RocksStateLogOptions o;
  o.dir = dir;
  o.fs = fs;
  o.sync = sync;
  o.checkpoint_every = 1 + rng() % 20;
  o.blobs.inline_bytes = 8;  // most values in blob files
  o.blobs.chunk_bytes = 16;
  // Freed blobs of any size are written over (a few of them kept): power
  // may go off while a file is renamed for reuse or written over.
  o.blobs.recycle_min_bytes = 1;
  o.blobs.recycle_bytes = 256;
  o.min_free_bytes = 0;
  o.on_fatal = [](const absl::Status&) {};  // the process is "dead" anyway
  Trial trial;
  std::unique_ptr<AcknowledgedLog> acknowledged;
  std::map<uint64_t, int64_t> answered;
  {
    auto log = RocksStateLog::Open(o);
    if (!log.ok()) return {.detail = log.status().ToString()};
    acknowledged = std::make_unique<AcknowledgedLog>(log->get());
    RandomCluster cluster(seed, acknowledged.get(), 1 + static_cast<int>(rng() % 6));
    if (!cluster.core().Recover().ok()) return {.detail = "first recover"};
    const uint64_t before = fs->mutations();
    if (cut_at > 0) fs->CutPowerAt(cut_at);
    cluster.Start();
    for (int i = 0; i < 100 && !fs->power_cut(); ++i) cluster.Step();
    trial.mutations = fs->mutations() - before;
    trial.cut = fs->power_cut();
    trial.reused = (*log)->stats().blobs_reused;
    answered = cluster.answered();
  }  // the "process" ends; its writes after the cut all failed
  fs->LoseUnsyncedData();

  o.fs = std::make_shared<PowerLossFileSystem>(rocksdb::FileSystem::Default(), false);
  o.on_fatal = nullptr;
  auto log = RocksStateLog::Open(o);
  if (!log.ok()) {
    trial.detail = log.status().ToString();
    return trial;
  }
  ClusterState state(RandomCluster::StateOptions());
  if (absl::Status s = (*log)->Recover(state); !s.ok()) {
    trial.detail = s.ToString();
    return trial;
  }
  trial.recovered = true;
  trial.same = acknowledged->Explains(state.Dump(), &trial.detail);
  if (!trial.same) return trial;

  // What callers were told: a coordinator starting on what is left (its
  // recovery rolls forward the writes decided before the cut, whose
  // commits were not synced) holds every write it answered.
  log->reset();
  log = RocksStateLog::Open(o);
  if (!log.ok()) {
    trial.detail = log.status().ToString();
    return trial;
  }
  repvar::testing::FakeClock clock;
  Registry registry(RegistryOptions{.state = RandomCluster::StateOptions()}, &clock, log->get());
  if (absl::Status s = registry.Recover(); !s.ok()) {
    trial.detail = s.ToString();
    return trial;
  }
  trial.answered = answered.size();
  trial.answers_kept = registry.Read([&](const ClusterState& s) {
    for (const auto& [id, version] : answered) {
      const VariableRecord* v = s.FindId(id);
      if (v != nullptr && v->version < version) {
        trial.detail = absl::StrCat("variable ", v->def.name, " (id ", id, ") was answered for ",
                                    "version ", version, " and is at version ", v->version);
        return false;
      }
    }
    return true;
  });
  return trial;
}

// A seed's run without a cut counts its operations; the trial cuts the
// power at a random one of them.
Trial CutTrial(const std::string& dir, uint64_t seed, bool sync) {
  const Trial whole = RunTrial(dir, seed, sync, 0);
  std::mt19937_64 rng(seed * 7919);
  return RunTrial(dir, seed, sync, 1 + rng() % std::max<uint64_t>(whole.mutations, 1));
}

TEST(PowerLossTest, CutAtARandomWrite_RecoversExactlyWhatWasAcknowledged) {
  repvar::testing::TempDir dir;
  int cuts = 0;
  uint64_t answered = 0, reused = 0;
  for (uint64_t seed = 1; cuts < 100 && seed <= 150; ++seed) {
    Trial t = CutTrial(dir.path() + "/data", seed, /*sync=*/true);
    ASSERT_TRUE(t.recovered) << "seed " << seed << ": " << t.detail;
    ASSERT_TRUE(t.same) << "seed " << seed << ": " << t.detail;
    ASSERT_TRUE(t.answers_kept) << "seed " << seed << ": " << t.detail;
    cuts += t.cut;
    answered += t.answered;
    reused += t.reused;
  }
  EXPECT_EQ(cuts, 100) << "trials in which the power went off mid-run";
  EXPECT_GT(answered, 30u) << "variables written with an answer, over all trials";
  EXPECT_GE(reused, 10u) << "values written over recycled blob files, over all trials";
}

TEST(PowerLossTest, NegativeControl_WithoutSyncs_AcknowledgedRecordsAreLost) {
  repvar::testing::TempDir dir;
  int lost = 0, cuts = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Trial t = CutTrial(dir.path() + "/data", seed, /*sync=*/false);
    cuts += t.cut;
    lost += !(t.recovered && t.same);
  }
  EXPECT_GT(cuts, 15);
  EXPECT_GT(lost, 10) << "without syncs a power loss must lose acknowledged records";
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// Power loss at any moment: a coordinator core runs random operations on the
// RocksDB state log over a file system whose power is cut at a random write,
// sync, rename or directory sync (inside a blob write, a record append, a
// checkpoint, blob collection or RocksDB's own background work). Whatever
// was not synced is then lost, and the state recovered from what is left
// must be exactly the state the coordinator had applied: every record it
// acknowledged, and nothing it did not. The negative control runs the same
// trials without syncs and must lose acknowledged records, or the test
// proves nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "server/store/rocks_state_log.h"
#include "tests/testing/power_loss_fs.h"
#include "tests/testing/random_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar::server {
namespace {

using ::repvar::testing::PowerLossFileSystem;
using ::repvar::testing::RandomCluster;

struct Trial {
  uint64_t mutations = 0;  // file system operations the run made
  bool cut = false;        // the power went off before the run ended
  bool recovered = false;  // the data dir opened and recovered
  bool same = false;       // into exactly the state the coordinator had applied
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
  o.min_free_bytes = 0;
  o.on_fatal = [](const absl::Status&) {};  // the process is "dead" anyway
  Trial trial;
  std::string applied;
  {
    auto log = RocksStateLog::Open(o);
    if (!log.ok()) return {0, false, false, false, log.status().ToString()};
    RandomCluster cluster(seed, log->get(), 1 + static_cast<int>(rng() % 6));
    if (!cluster.core().Recover().ok()) return {0, false, false, false, "first recover"};
    const uint64_t before = fs->mutations();
    if (cut_at > 0) fs->CutPowerAt(cut_at);
    cluster.Start();
    for (int i = 0; i < 100 && !fs->power_cut(); ++i) cluster.Step();
    trial.mutations = fs->mutations() - before;
    trial.cut = fs->power_cut();
    applied = cluster.CoordinatorState();
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
  trial.same = state.Dump() == applied;
  if (!trial.same) trial.detail = "recovered:\n" + state.Dump() + "\napplied:\n" + applied;
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
  for (uint64_t seed = 1; cuts < 100 && seed <= 150; ++seed) {
    Trial t = CutTrial(dir.path() + "/data", seed, /*sync=*/true);
    ASSERT_TRUE(t.recovered) << "seed " << seed << ": " << t.detail;
    ASSERT_TRUE(t.same) << "seed " << seed << ": " << t.detail;
    cuts += t.cut;
  }
  EXPECT_EQ(cuts, 100) << "trials in which the power went off mid-run";
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

// SPDX-License-Identifier: Apache-2.0
// Records and checkpoint rows survive their trip to disk form and back:
// every kind of change the coordinator commits, and every part of its state.
#include "server/store/state_codec.h"

#include <gtest/gtest.h>

#include <set>

#include "server/store/blob_store.h"
#include "tests/testing/random_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar::server {
namespace {

using ::repvar::testing::RandomCluster;
using ::repvar::testing::StatusIs;

class StateCodecTest : public ::testing::Test {
 protected:
  repvar::testing::TempDir dir_;
  // Tensors above 8 bytes go to blob files: both forms are exercised.
  BlobStore blobs_{rocksdb::FileSystem::Default().get(), dir_.path() + "/blobs",
                   BlobStoreOptions{.inline_bytes = 8, .chunk_bytes = 16}};

  void SetUp() override { ASSERT_OK(blobs_.Open()); }
};

TEST_F(StateCodecTest, EveryRecord_RoundTrips_ReplayGivesTheSameState) {
  std::set<size_t> kinds;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    RandomCluster cluster(seed, nullptr, /*value_elements=*/1 + static_cast<int>(seed % 4));
    cluster.Run(200);
    ClusterState replayed(RandomCluster::StateOptions());
    for (const Record& r : cluster.records()) {
      disk::Record encoded;
      ASSERT_OK(EncodeRecord(r, blobs_, &encoded));
      disk::Record parsed;
      ASSERT_TRUE(parsed.ParseFromString(encoded.SerializeAsString()));
      auto decoded = DecodeRecord(parsed, blobs_);
      ASSERT_OK(decoded);
      ASSERT_EQ(decoded->changes.size(), r.changes.size());
      for (const Change& c : decoded->changes) kinds.insert(c.index());
      replayed.Apply(*decoded);
    }
    EXPECT_EQ(replayed.Dump(), cluster.CoordinatorState()) << "seed " << seed;
  }
  EXPECT_EQ(kinds.size(), std::variant_size_v<Change>);
}

TEST_F(StateCodecTest, CheckpointRows_RoundTrip_RestoreGivesTheSameState) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    RandomCluster cluster(seed, nullptr, 2 + static_cast<int>(seed % 5));
    cluster.Run(200);
    ClusterStateData data;
    cluster.core().registry().Read([&](const ClusterState& s) {
      data.next_variable_id = s.next_variable_id();
      data.topology_version = s.topology_version();
      data.last_committed_step = s.last_committed_step();
      data.last_epoch = s.last_epoch();
      data.fences_reserved = s.fences_reserved();
      disk::StepCommitted last;
      EncodeStepCommitted(
          StepCommitted{s.last_step().step, s.last_step().epoch, s.last_step().changed}, &last);
      const StepCommitted step = DecodeStepCommitted(last);
      data.last_step = LastStep{step.step, step.epoch, step.changed};
      for (const auto& [key, w] : s.workers()) {
        disk::WorkerRecord row;
        EncodeWorker(w, &row);
        auto back = DecodeWorker(row);
        ASSERT_OK(back);
        data.workers.emplace(key, *back);
      }
      for (const auto& [id, v] : s.variables()) {
        disk::VariableRecord row;
        ASSERT_OK(EncodeVariable(v, blobs_, &row));
        auto back = DecodeVariable(row, blobs_);
        ASSERT_OK(back);
        data.variables.emplace(id, *std::move(back));
      }
      s.ForEachOutcome([&](const std::string& id, const StoredOutcome& o) {
        disk::RequestRecorded row;
        EncodeOutcome(id, o, &row);
        auto back = DecodeOutcome(row);
        ASSERT_OK(back);
        data.outcomes.push_back(*std::move(back));
      });
    });
    ClusterState restored(RandomCluster::StateOptions());
    ASSERT_OK(restored.Restore(std::move(data)));
    EXPECT_EQ(restored.Dump(), cluster.CoordinatorState()) << "seed " << seed;
  }
}

TEST_F(StateCodecTest, BadFields_DataLossNamingThem_NothingHalfFilled) {
  disk::Record r;
  r.add_changes();  // a change of no kind
  EXPECT_THAT(DecodeRecord(r, blobs_), StatusIs(absl::StatusCode::kDataLoss, "no kind"));

  disk::VariableRecord v;
  v.mutable_def()->set_name("w");
  v.mutable_def()->set_replica_count(1);
  v.mutable_def()->set_aggregation(1);
  v.mutable_def()->mutable_tensor()->set_dtype(99);
  EXPECT_THAT(DecodeVariable(v, blobs_), StatusIs(absl::StatusCode::kDataLoss, "dtype 99"));
  v.mutable_def()->mutable_tensor()->set_dtype(1);
  v.mutable_def()->set_aggregation(7);
  EXPECT_THAT(DecodeVariable(v, blobs_), StatusIs(absl::StatusCode::kDataLoss, "aggregation 7"));
  v.mutable_def()->set_aggregation(1);
  v.add_replicas()->set_state(9);
  EXPECT_THAT(DecodeVariable(v, blobs_), StatusIs(absl::StatusCode::kDataLoss, "replica state 9"));

  disk::WorkerRecord w;
  w.set_state(5);
  EXPECT_THAT(DecodeWorker(w), StatusIs(absl::StatusCode::kDataLoss, "in state 5"));

  disk::RequestRecorded o;
  o.set_id("x");
  EXPECT_THAT(DecodeOutcome(o), StatusIs(absl::StatusCode::kDataLoss, "no kind"));
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// Records and checkpoint rows survive their trip to disk form and back:
// every kind of change the coordinator commits, and every part of its state.
#include "server/store/state_codec.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
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
  for (size_t k = 0; k < std::variant_size_v<Change>; ++k) {
    EXPECT_TRUE(kinds.contains(k)) << "no record of change kind " << k;
  }
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

// A batch of creates records each distinct placement once and names it by
// index; records written before the table (placements spelled out per
// variable) still decode; a name past the table is DATA_LOSS.
TEST_F(StateCodecTest, Placements_ABatchRecordsEachOnce_OldSpelledOutRecordsStillDecode) {
  std::vector<Placement> accelerators;
  for (int32_t t = 0; t < 4; ++t) {
    for (int32_t id = 0; id < 2; ++id) {
      accelerators.push_back(
          Placement{DeviceName{"tpu_worker", 0, t, "TPU", id}, TaskKey{"tpu_worker", t}});
    }
  }
  Record batch;
  for (int32_t i = 0; i < 100; ++i) {
    VariableCreated c;
    c.id = 1 + i;
    c.def.name = absl::StrCat("v", i);
    c.def.tensor = TensorSpec{DType::kFloat32, {4}};
    c.def.replica_count = 1 + i % 8;
    c.def.aggregation = Aggregation::kMean;
    // Some variables start on another accelerator than the first.
    const size_t first = i % 3 == 0 ? 2 : 0;
    std::vector<Placement> list;
    for (int32_t r = 0; r < c.def.replica_count; ++r) {
      list.push_back(accelerators[(first + r) % accelerators.size()]);
    }
    c.placement = std::move(list);
    batch.changes.push_back(c);
  }
  disk::Record encoded;
  ASSERT_OK(EncodeRecord(batch, blobs_, &encoded));
  EXPECT_EQ(encoded.placements_size(), 8);
  for (const disk::Change& c : encoded.changes()) {
    EXPECT_EQ(c.variable_created().placement_size(), 0);
    EXPECT_EQ(c.variable_created().placement_refs_size(),
              c.variable_created().def().replica_count());
  }
  disk::Record parsed;
  ASSERT_TRUE(parsed.ParseFromString(encoded.SerializeAsString()));
  auto decoded = DecodeRecord(parsed, blobs_);
  ASSERT_OK(decoded);
  ASSERT_EQ(decoded->changes.size(), batch.changes.size());
  for (size_t i = 0; i < batch.changes.size(); ++i) {
    EXPECT_EQ(std::get<VariableCreated>(decoded->changes[i]).placement,
              std::get<VariableCreated>(batch.changes[i]).placement)
        << i;
  }
  // Variables with the same placements share one copy once decoded.
  EXPECT_EQ(&std::get<VariableCreated>(decoded->changes[1]).placement.list(),
            &std::get<VariableCreated>(decoded->changes[17]).placement.list());

  // The form written before the table: each placement in the variable.
  disk::Record old = parsed;
  old.clear_placements();
  for (int i = 0; i < old.changes_size(); ++i) {
    disk::VariableCreated* c = old.mutable_changes(i)->mutable_variable_created();
    c->clear_placement_refs();
    for (const Placement& p : std::get<VariableCreated>(batch.changes[i]).placement) {
      disk::Placement* d = c->add_placement();
      d->mutable_device()->set_job(p.device.job);
      d->mutable_device()->set_replica(p.device.replica);
      d->mutable_device()->set_task(p.device.task);
      d->mutable_device()->set_type(p.device.type);
      d->mutable_device()->set_id(p.device.id);
      d->mutable_task()->set_job(p.task.job);
      d->mutable_task()->set_task(p.task.task);
    }
  }
  auto from_old = DecodeRecord(old, blobs_);
  ASSERT_OK(from_old);
  for (size_t i = 0; i < batch.changes.size(); ++i) {
    EXPECT_EQ(std::get<VariableCreated>(from_old->changes[i]).placement,
              std::get<VariableCreated>(batch.changes[i]).placement)
        << i;
  }

  disk::Record bad = parsed;
  bad.mutable_changes(5)->mutable_variable_created()->set_placement_refs(0, 8);
  EXPECT_THAT(DecodeRecord(bad, blobs_),
              StatusIs(absl::StatusCode::kDataLoss, "names placement 8 of 8"));
  bad = parsed;
  bad.mutable_changes(5)->mutable_variable_created()->add_placement_refs(0);
  EXPECT_THAT(DecodeRecord(bad, blobs_), StatusIs(absl::StatusCode::kDataLoss, "placements"));
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
  EXPECT_THAT(DecodeVariable(v, blobs_),
              StatusIs(absl::StatusCode::kDataLoss, "1 replica records for 0 placements"));
  v.add_placement();
  EXPECT_THAT(DecodeVariable(v, blobs_), StatusIs(absl::StatusCode::kDataLoss, "replica state 9"));
  v.set_replicas_are_exceptions(true);
  v.mutable_replicas(0)->set_state(3);
  v.mutable_replicas(0)->set_index(1);
  EXPECT_THAT(DecodeVariable(v, blobs_),
              StatusIs(absl::StatusCode::kDataLoss, "replica record 1 out of range"));
  v.mutable_replicas(0)->set_index(0);
  EXPECT_OK(DecodeVariable(v, blobs_));
  *v.add_replicas() = v.replicas(0);
  EXPECT_THAT(DecodeVariable(v, blobs_), StatusIs(absl::StatusCode::kDataLoss,
                                                  "replica record 0 out of range or listed twice"));

  disk::Record holders;
  disk::ReplicasWritten* written = holders.add_changes()->mutable_replicas_written();
  written->mutable_all_but()->add_missing(3);
  written->mutable_all_but()->add_missing(1);
  EXPECT_THAT(DecodeRecord(holders, blobs_), StatusIs(absl::StatusCode::kDataLoss, "unsorted"));

  disk::WorkerRecord w;
  w.set_state(5);
  EXPECT_THAT(DecodeWorker(w), StatusIs(absl::StatusCode::kDataLoss, "in state 5"));

  disk::RequestRecorded o;
  o.set_id("x");
  EXPECT_THAT(DecodeOutcome(o), StatusIs(absl::StatusCode::kDataLoss, "no kind"));
}

}  // namespace
}  // namespace repvar::server

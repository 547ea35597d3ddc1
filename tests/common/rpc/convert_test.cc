// SPDX-License-Identifier: Apache-2.0
// proto <-> model: what goes out comes back the same, and what a peer can
// get wrong is refused with INVALID_ARGUMENT naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/rpc/chunks.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/to_proto.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace repvar {
namespace {

using ::repvar::testing::F32;
using ::repvar::testing::StatusIs;

TEST(Convert, VariableDef_RoundTrips_CollectionsSortedAndUnique) {
  VariableDef def;
  def.name = "model/w";
  def.tensor = TensorSpec{DType::kBFloat16, {2, 3}};
  def.trainable = false;
  def.collections = {"b", "a", "b"};
  def.replica_count = 4;
  def.aggregation = Aggregation::kMean;
  def.allow_nonfinite = true;
  v1::VariableSpec proto;
  VariableDefToProto(def, &proto);
  auto back = VariableDefFromProto(proto);
  ASSERT_OK(back);
  def.collections = {"a", "b"};
  EXPECT_EQ(*back, def);
}

TEST(Convert, VariableDef_BadFields_InvalidArgumentNamingThem) {
  v1::VariableSpec proto;
  proto.set_name("w");
  proto.mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  proto.set_aggregation(static_cast<v1::Aggregation>(42));
  EXPECT_THAT(VariableDefFromProto(proto), StatusIs(absl::StatusCode::kInvalidArgument, "42"));
  proto.set_aggregation(v1::AGGREGATION_UNSPECIFIED);
  ASSERT_OK(VariableDefFromProto(proto));  // unspecified reads as NONE
  EXPECT_EQ(VariableDefFromProto(proto)->aggregation, Aggregation::kNone);
  proto.mutable_tensor()->set_dtype(static_cast<v1::DType>(99));
  EXPECT_THAT(VariableDefFromProto(proto), StatusIs(absl::StatusCode::kInvalidArgument, "99"));
  proto.mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  proto.set_name("../x");
  EXPECT_THAT(VariableDefFromProto(proto), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(AssignOpFromProto(7), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(*AssignOpFromProto(0), AssignOp::kAssign);
}

TEST(Convert, Tensor_RoundTrips_BadChecksumRefused) {
  auto t = F32({1, 2, 3});
  v1::Tensor proto;
  TensorToProto(*t, &proto);
  auto back = TensorFromProto(proto);
  ASSERT_OK(back);
  EXPECT_EQ(back->checksum, t->checksum);
  proto.mutable_header()->set_checksum(t->checksum + 1);
  EXPECT_THAT(TensorFromProto(proto), StatusIs(absl::StatusCode::kInvalidArgument, "checksum"));
  proto.mutable_header()->set_byte_size(13);
  EXPECT_THAT(TensorFromProto(proto), StatusIs(absl::StatusCode::kInvalidArgument, "13"));
}

// Writes with specs shared and not, several replicas and none: each comes
// back whole, pointing into the message; one spec is listed once per run.
TEST(Convert, SmallWrites_RoundTripByColumn_SpecsListedOnce) {
  std::vector<ReplicaWrite> writes = {
      {1, "a", 3, {0, 2}, F32({1, 2}), 7},
      {2, "b", 4, {1}, F32({3, 4}), 8},
      {3, "c", 5, {}, F32({5, 6, 7}), 9},
      {4, "d", 6, {3}, F32({8, 9}), 9},
  };
  v1::WriteSmallReplicasRequest proto;
  SmallWritesToProto(11, writes, &proto);
  EXPECT_EQ(proto.specs_size(), 2);
  auto back = SmallWritesFromProto(proto);
  ASSERT_OK(back);
  EXPECT_EQ(back->incarnation, 11u);
  ASSERT_EQ(back->items.size(), writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    const SmallReplicaWrites::Item& got = back->items[i];
    EXPECT_EQ(got.write.variable_id, writes[i].variable_id);
    EXPECT_EQ(got.write.name, writes[i].name);
    EXPECT_EQ(got.write.version, writes[i].version);
    EXPECT_EQ(got.write.replicas, writes[i].replicas);
    EXPECT_EQ(got.write.fence, writes[i].fence);
    EXPECT_EQ(back->specs[got.spec], writes[i].value->spec);
    EXPECT_EQ(got.checksum, writes[i].value->checksum);
    EXPECT_EQ(Checksum(got.bytes), writes[i].value->checksum);
    EXPECT_EQ(got.bytes.data(), BytesOf(proto.data()).data() + (i == 0   ? 0
                                                                : i == 1 ? 8
                                                                : i == 2 ? 16
                                                                         : 28));
  }
}

// Writes that share one Tensor (variables initialized alike) carry its
// bytes once; each comes back pointing at them. Writes with values of their
// own send no value_index at all.
TEST(Convert, SmallWrites_SharedValue_SentOnce_EachWritePointsAtIt) {
  const auto zeros = F32({0, 0});
  const auto other = F32({5, 6, 7});
  std::vector<ReplicaWrite> writes = {
      {1, "a", 1, {0}, zeros, 7},
      {2, "b", 1, {0}, other, 7},
      {3, "c", 1, {1}, zeros, 7},
      {4, "d", 1, {0}, zeros, 7},
  };
  v1::WriteSmallReplicasRequest proto;
  SmallWritesToProto(11, writes, &proto);
  EXPECT_EQ(proto.data().size(), 8u + 12u) << "each distinct value once";
  EXPECT_THAT(proto.value_index(), ::testing::ElementsAre(0, 1, 0, 0));
  auto back = SmallWritesFromProto(proto);
  ASSERT_OK(back);
  ASSERT_EQ(back->items.size(), 4u);
  const std::byte* data = BytesOf(proto.data()).data();
  for (size_t i : {0, 2, 3}) {
    EXPECT_EQ(back->items[i].value, 0u);
    EXPECT_EQ(back->items[i].bytes.data(), data);
    EXPECT_EQ(back->items[i].bytes.size(), 8u);
    EXPECT_EQ(back->specs[back->items[i].spec], zeros->spec);
  }
  EXPECT_EQ(back->items[1].value, 1u);
  EXPECT_EQ(back->items[1].bytes.data(), data + 8);
  EXPECT_EQ(Checksum(back->items[1].bytes), other->checksum);

  v1::WriteSmallReplicasRequest own;
  SmallWritesToProto(11, {writes[0], writes[1]}, &own);
  EXPECT_EQ(own.value_index_size(), 0);

  // Refused: a number past the next new value, one per write or none, and
  // a shared value under another spec.
  v1::WriteSmallReplicasRequest bad = proto;
  bad.set_value_index(1, 2);
  EXPECT_THAT(SmallWritesFromProto(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "value_index[1] is 2 after 1 values"));
  bad = proto;
  bad.add_value_index(0);
  EXPECT_THAT(SmallWritesFromProto(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "4 variable ids but 5 value_index"));
  bad = proto;
  bad.set_value_index(2, 1);  // c shares b's float32[3] as a float32[2]
  EXPECT_THAT(SmallWritesFromProto(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "write 2 shares value 1"));
}

TEST(Convert, Initializer_RoundTripsEveryKind) {
  for (InitializerKind kind :
       {InitializerKind::kNone, InitializerKind::kZeros, InitializerKind::kOnes,
        InitializerKind::kConstant, InitializerKind::kRandomNormal, InitializerKind::kRandomUniform,
        InitializerKind::kValue}) {
    Initializer init;
    init.kind = kind;
    init.constant = 2.5;
    init.a = -1;
    init.b = 3;
    init.seed = 77;
    if (kind == InitializerKind::kValue) init.value = F32({4, 5});
    v1::Initializer proto;
    InitializerToProto(init, &proto);
    auto back = InitializerFromProto(proto);
    ASSERT_OK(back);
    EXPECT_EQ(back->kind, kind);
    if (kind == InitializerKind::kConstant) {
      EXPECT_EQ(back->constant, 2.5);
    }
    if (kind == InitializerKind::kRandomNormal || kind == InitializerKind::kRandomUniform) {
      EXPECT_EQ(back->a, -1);
      EXPECT_EQ(back->b, 3);
      EXPECT_EQ(back->seed, 77u);
    }
    if (kind == InitializerKind::kValue) {
      EXPECT_EQ(back->value->checksum, init.value->checksum);
    }
  }
  v1::Initializer bad;
  bad.mutable_random_normal()->set_generator(static_cast<v1::RandomGenerator>(9));
  EXPECT_THAT(InitializerFromProto(bad), StatusIs(absl::StatusCode::kInvalidArgument, "generator"));
}

TEST(Convert, StepInfo_RoundTrips) {
  StepInfo info;
  info.step = 3;
  info.epoch = 11;
  info.state = StepState::kAggregating;
  info.barrier_timeout = absl::Seconds(7);
  info.begun = absl::FromUnixMillis(1234);
  info.layout_id = 99;
  info.participants.push_back(StepParticipant{TaskKey{"tpu_worker", 1}, 5, "h:1"});
  info.sitting_out.push_back(TaskKey{"tpu_worker", 2});
  StepVariable v;
  v.id = 4;
  v.name = "w";
  v.aggregation = Aggregation::kSum;
  v.spec = TensorSpec{DType::kInt64, {2}};
  v.replica_participant = {0, -1};
  v.allow_nonfinite = true;
  info.variables.push_back(v);
  v1::StepInfo proto;
  StepInfoToProto(info, &proto);
  auto back = StepInfoFromProto(proto);
  ASSERT_OK(back);
  EXPECT_EQ(back->step, 3);
  EXPECT_EQ(back->epoch, 11u);
  EXPECT_EQ(back->state, StepState::kAggregating);
  EXPECT_EQ(back->barrier_timeout, absl::Seconds(7));
  EXPECT_EQ(back->begun, absl::FromUnixMillis(1234));
  EXPECT_EQ(back->layout_id, 99u);
  ASSERT_EQ(back->participants.size(), 1u);
  EXPECT_EQ(back->participants[0].task, (TaskKey{"tpu_worker", 1}));
  EXPECT_EQ(back->participants[0].address, "h:1");
  EXPECT_EQ(back->sitting_out, (std::vector<TaskKey>{{"tpu_worker", 2}}));
  ASSERT_EQ(back->variables.size(), 1u);
  EXPECT_EQ(back->variables[0].spec, v.spec);
  EXPECT_EQ(back->variables[0].replica_participant, v.replica_participant);
  EXPECT_EQ(back->variables[0].aggregation, Aggregation::kSum);
  EXPECT_TRUE(back->variables[0].allow_nonfinite);
}

// A caller that asks for shared lists gets each distinct replica ->
// participant list once; variables that shared one share it again.
TEST(Convert, StepInfo_SharedLists_EachListOnce_SharedAgainOnReceipt) {
  StepInfo info;
  info.participants.push_back(StepParticipant{TaskKey{"tpu_worker", 0}, 5, "h:0"});
  info.participants.push_back(StepParticipant{TaskKey{"tpu_worker", 1}, 6, "h:1"});
  const SharedVector<int32_t> both = std::vector<int32_t>{0, 0, 1, 1};
  for (uint64_t id : {1, 2, 3}) {
    StepVariable v;
    v.id = id;
    v.name = absl::StrCat("v", id);
    v.spec = TensorSpec{DType::kFloat32, {2}};
    v.replica_participant = id == 2 ? SharedVector<int32_t>({0, 0, -1, -1}) : both;
    info.variables.push_back(v);
  }
  v1::StepInfo whole;
  StepInfoToProto(info, &whole);
  EXPECT_EQ(whole.participant_lists_size(), 0);
  EXPECT_EQ(whole.variables(0).replica_participant_size(), 4);
  v1::StepInfo shared;
  StepInfoToProto(info, &shared, /*shared_lists=*/true);
  ASSERT_EQ(shared.participant_lists_size(), 2);
  EXPECT_EQ(shared.variables(0).replica_participant_size(), 0);
  EXPECT_EQ(shared.variables(2).participant_list(), shared.variables(0).participant_list());
  for (const v1::StepInfo& proto : {whole, shared}) {
    auto back = StepInfoFromProto(proto);
    ASSERT_OK(back);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(back->variables[i].replica_participant, info.variables[i].replica_participant);
    }
  }
  auto back = StepInfoFromProto(shared);
  EXPECT_TRUE(
      back->variables[0].replica_participant.SharesWith(back->variables[2].replica_participant));

  shared.mutable_variables(1)->set_participant_list(3);
  EXPECT_THAT(StepInfoFromProto(shared).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "names participant list 3 of 2"));
}

IndexRanges Ranges(std::vector<uint32_t> bounds) {
  return *IndexRanges::FromBounds(std::move(bounds), 1000);
}

TEST(Convert, ReportsFinishesPlansResolutions_RoundTrip) {
  WorkerReport report;
  report.step = 3;
  report.epoch = 11;
  report.task = TaskKey{"w", 0};
  report.incarnation = 5;
  report.changed = Ranges({0, 3, 7, 9});
  report.digest = 0xfeed;
  report.shard = {{2, 0xbeef}};
  report.replicas = {ReplicaReport{4, 1, 77, -1}};
  report.detailed = true;
  v1::ReportStepRequest rp;
  ReportToProto(report, &rp);
  absl::StatusOr<WorkerReport> rback = ReportFromProto(rp);
  ASSERT_OK(rback);
  EXPECT_EQ(rback->task, report.task);
  EXPECT_EQ(rback->changed, report.changed);
  EXPECT_EQ(rback->digest, report.digest);
  EXPECT_EQ(rback->shard, report.shard);
  EXPECT_EQ(rback->replicas, report.replicas);
  EXPECT_TRUE(rback->detailed);
  rp.add_changed_ranges(8);  // an odd count: not (begin, end) pairs
  EXPECT_THAT(ReportFromProto(rp), StatusIs(absl::StatusCode::kInvalidArgument));

  WorkerFinish finish;
  finish.held = Ranges({4, 5});
  finish.digest = 0xabc;
  finish.shard = {{4, 88}};
  finish.nonfinite = {PreparedVariable{4, 88, 2, 1}};
  v1::FinishStepRequest fp;
  FinishToProto(finish, &fp);
  absl::StatusOr<WorkerFinish> fback = FinishFromProto(fp);
  ASSERT_OK(fback);
  EXPECT_EQ(fback->held, finish.held);
  EXPECT_EQ(fback->digest, finish.digest);
  EXPECT_EQ(fback->shard, finish.shard);
  ASSERT_EQ(fback->nonfinite.size(), 1u);
  EXPECT_EQ(fback->nonfinite[0].nonfinite_replica, 1);
  EXPECT_EQ(fback->nonfinite[0].first_nonfinite, 2);
  fp.add_held_ranges(2);
  fp.add_held_ranges(1);  // backwards
  EXPECT_THAT(FinishFromProto(fp), StatusIs(absl::StatusCode::kInvalidArgument));

  StepPlan plan;
  plan.step = 3;
  plan.group = "g1";
  plan.timeout = absl::Seconds(2);
  plan.collectives.push_back(
      StepCollective{StepCollective::Kind::kBroadcast, 7, Ranges({4, 5}), 1, 2, 99, {0, 3}});
  plan.changed = Ranges({0, 10});
  plan.send_detail = true;
  v1::StepPlan pp;
  PlanToProto(plan, &pp);
  auto pback = PlanFromProto(pp);
  ASSERT_OK(pback);
  const StepPlan& got = std::get<StepPlan>(*pback);
  EXPECT_EQ(got.group, "g1");
  EXPECT_EQ(got.changed, plan.changed);
  EXPECT_TRUE(got.send_detail);
  ASSERT_EQ(got.collectives.size(), 1u);
  EXPECT_EQ(got.collectives[0].kind, StepCollective::Kind::kBroadcast);
  EXPECT_EQ(got.collectives[0].variables, plan.collectives[0].variables);
  EXPECT_EQ(got.collectives[0].targets, (std::vector<int32_t>{0, 3}));

  StepResolution failed;
  failed.state = StepState::kFailed;
  failed.status = absl::DeadlineExceededError("missing: w:1");
  v1::StepResolution sp;
  StepResolutionToProto(failed, &sp);
  StepResolution sback = ResolutionFromProto(sp);
  EXPECT_THAT(sback.status, StatusIs(absl::StatusCode::kDeadlineExceeded, "missing: w:1"));
  sp.set_code(0);  // a failure without a code reads as UNKNOWN, never OK
  EXPECT_THAT(ResolutionFromProto(sp).status, StatusIs(absl::StatusCode::kUnknown));
  *pp.mutable_resolution() = sp;
  auto answered = PlanFromProto(pp);
  ASSERT_OK(answered);
  EXPECT_TRUE(std::holds_alternative<StepResolution>(*answered));
}

// Workers get a resolution's short form: the changed ranges and their
// digest, without the per-variable list and the latencies, which grow with
// the variables and the workers. One without ranges (an earlier run's,
// from its record) goes whole.
TEST(Convert, StepResolution_ShortForm_LeavesOutWhatGrowsWithTheCluster) {
  StepResolution r;
  r.state = StepState::kCommitted;
  r.changed_ranges = Ranges({0, 2});
  r.changed_digest = 0x1234;
  r.layout_id = 9;
  r.changed = {CommittedVariable{1, "a", 2, 3}, CommittedVariable{2, "b", 2, 4}};
  r.latencies.emplace_back(TaskKey{"w", 0}, absl::Milliseconds(3));
  v1::StepResolution full, short_form;
  StepResolutionToProto(r, &full);
  StepResolutionToProto(r, &short_form, /*short_form=*/true);
  EXPECT_EQ(full.changed_size(), 2);
  EXPECT_EQ(full.latencies_size(), 1);
  EXPECT_EQ(short_form.changed_size(), 0);
  EXPECT_EQ(short_form.latencies_size(), 0);
  StepResolution back = ResolutionFromProto(short_form);
  EXPECT_TRUE(back.short_form);
  EXPECT_EQ(back.changed_ranges, r.changed_ranges);
  EXPECT_EQ(back.changed_digest, 0x1234u);
  EXPECT_EQ(back.layout_id, 9u);

  StepResolution earlier;  // answered from the record: no ranges
  earlier.state = StepState::kCommitted;
  earlier.changed = r.changed;
  v1::StepResolution whole;
  StepResolutionToProto(earlier, &whole, /*short_form=*/true);
  EXPECT_EQ(whole.changed_size(), 2);
  EXPECT_FALSE(whole.short_form());
}

TEST(Chunks, SendChunks_SplitsInOrderAndStopsAtTheFirstFailedWrite) {
  std::vector<std::byte> bytes(10, std::byte{1});
  std::vector<uint64_t> offsets;
  EXPECT_TRUE(SendChunks<v1::TensorChunk>(
      bytes, 4,
      [&](const v1::TensorChunk& c) {
        offsets.push_back(c.offset());
        return true;
      },
      [](v1::TensorChunk& c) { return &c; }));
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 4, 8}));
  int writes = 0;
  EXPECT_FALSE(SendChunks<v1::TensorChunk>(
      bytes, 4, [&](const v1::TensorChunk&) { return ++writes < 2; },
      [](v1::TensorChunk& c) { return &c; }));
  EXPECT_EQ(writes, 2);
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// Variables (V1-V6) and reads (C1) against the coordinator core.
// Cross-replica writes and failures are in coordinator_writes_test.cc.
#include "tests/server/core/coordinator_fixture.h"

namespace repvar::server {
namespace {

TEST_F(CoordinatorTest, V1_Create_PlacesReplicaIOnOrdinalIAndRecordsIt) {
  Create(Def("w", 4));
  auto v = core_.GetVariable("w");
  ASSERT_OK(v);
  ASSERT_EQ(v->replicas.size(), 4u);
  EXPECT_EQ(v->replicas[0].name, "w/0");
  EXPECT_EQ(v->replicas[3].name, "w/3");
  EXPECT_EQ(v->replicas[0].device.ToString(), "/job:tpu_worker/replica:0/task:0/device:TPU:0");
  EXPECT_EQ(v->replicas[2].device.ToString(), "/job:tpu_worker/replica:0/task:1/device:TPU:0");
  EXPECT_EQ(v->replicas[3].task.task, 1);
  // Placement never moves: a later worker that sorts first changes ordinals, not w.
  Register("a_tpu", 0, 2, 9);
  auto again = core_.GetVariable("w");
  EXPECT_EQ(again->replicas[0].device.ToString(), "/job:tpu_worker/replica:0/task:0/device:TPU:0");
}

TEST_F(CoordinatorTest, V1_Create_MoreReplicasThanAccelerators_FailedPrecondition) {
  EXPECT_THAT(core_.CreateVariables({}, {{Def("w", 7), {}}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "6 accelerators"));
  EXPECT_THAT(core_.GetVariable("w"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinatorTest, V1_Create_AllReplicasOnOneHost_Warns) {
  auto one_host = core_.CreateVariables({}, {{Def("a", 2), {}}});
  ASSERT_OK(one_host);
  ASSERT_EQ(one_host->warnings.size(), 1u);
  EXPECT_NE(one_host->warnings[0].find("one host"), std::string::npos);
  auto spread = core_.CreateVariables({}, {{Def("b", 3), {}}});
  ASSERT_OK(spread);
  EXPECT_TRUE(spread->warnings.empty());
}

TEST_F(CoordinatorTest, V2_Create_IdenticalSpecIsIdempotentAndInitializerIsNotIdentity) {
  Initializer zeros{InitializerKind::kZeros};
  Initializer ones{InitializerKind::kOnes};
  auto first = core_.CreateVariables({}, {{Def("w", 6), zeros}});
  auto second = core_.CreateVariables({}, {{Def("w", 6), ones}});
  ASSERT_OK(first);
  ASSERT_OK(second);
  EXPECT_TRUE(first->created[0]);
  EXPECT_FALSE(second->created[0]);
  EXPECT_EQ(first->variables[0].id, second->variables[0].id);
  // The first initializer stays.
  ASSERT_OK(core_.Initialize({}, {{"w", std::nullopt}}));
  EXPECT_EQ(Floats(*core_.Read("w")->value), (std::vector<float>{0, 0, 0}));
}

TEST_F(CoordinatorTest, V2_Create_DifferentSpecSameName_AlreadyExists) {
  Create(Def("w", 2));
  EXPECT_THAT(core_.CreateVariables({}, {{Def("w", 2, {4}), {}}}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(core_.CreateVariables({}, {{Def("w", 2, {3}, DType::kFloat64), {}}}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(core_.CreateVariables({}, {{Def("w", 3), {}}}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  VariableDef mean = Def("w", 2);
  mean.aggregation = Aggregation::kMean;
  EXPECT_THAT(core_.CreateVariables({}, {{mean, {}}}), StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(CoordinatorTest, V2_Create_BatchIsAllOrNothing) {
  Create(Def("w", 2));
  EXPECT_THAT(core_.CreateVariables({}, {{Def("new", 2), {}}, {Def("w", 2, {9}), {}}}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(core_.GetVariable("new"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinatorTest, V3_Collections_HoldLogicalVariablesOnly) {
  VariableDef w = Def("w", 6);
  w.trainable = true;
  VariableDef step = Def("step", 6, {}, DType::kInt64);
  step.trainable = false;
  step.collections = {"COUNTERS"};
  Create(w);
  Create(step);
  auto global = core_.ListVariables(kGlobalVariables);
  auto trainable = core_.ListVariables(kTrainableVariables);
  auto counters = core_.ListVariables("COUNTERS");
  ASSERT_EQ(global.size(), 2u);
  ASSERT_EQ(trainable.size(), 1u);
  EXPECT_EQ(trainable[0].def.name, "w");
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0].def.name, "step");
  for (const auto& v : core_.ListVariables("")) {
    EXPECT_EQ(v.def.name.find('/'), std::string::npos) << "a replica leaked into a collection";
  }
}

TEST_F(CoordinatorTest, V5_AllDtypesAndScalars_RoundTrip) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                  DType::kInt32, DType::kInt64}) {
    std::string name = absl::StrCat("v", static_cast<int>(d));
    for (std::vector<int64_t> dims : {std::vector<int64_t>{}, std::vector<int64_t>{2, 3}}) {
      std::string n = absl::StrCat(name, "_r", dims.size());
      Create(Def(n, 2, dims, d));
      auto t = Tensor::Zeros(TensorSpec{d, dims});
      ASSERT_OK(t);
      for (int64_t i = 0; i < static_cast<int64_t>(t->bytes.size()); ++i) {
        t->bytes.data()[i] = static_cast<std::byte>(i * 7 + 1);
      }
      t->UpdateChecksum();
      auto value = std::make_shared<const Tensor>(*std::move(t));
      ASSERT_OK(Assign(n, value));
      auto back = core_.Read(n);
      ASSERT_OK(back);
      EXPECT_EQ(back->value->checksum, value->checksum) << n;
      EXPECT_EQ(std::memcmp(back->value->bytes.data(), value->bytes.data(), value->bytes.size()),
                0);
    }
  }
}

TEST_F(CoordinatorTest, V5_OverflowingShape_InvalidArgument) {
  VariableDef d = Def("huge", 1, {int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_THAT(core_.CreateVariables({}, {{d, {}}}), StatusIs(absl::StatusCode::kInvalidArgument));
  VariableDef neg = Def("neg", 1, {3, -1});
  EXPECT_THAT(core_.CreateVariables({}, {{neg, {}}}), StatusIs(absl::StatusCode::kInvalidArgument));
  VariableDef big = Def("big", 1, {int64_t{1} << 40});
  EXPECT_THAT(core_.CreateVariables({}, {{big, {}}}),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(CoordinatorTest, V6_BatchedCreateInitializeAssignAnswerOnce) {
  std::vector<CreateItem> items;
  for (int i = 0; i < 100; ++i) {
    items.push_back({Def(absl::StrCat("b/", i), 2), Initializer{InitializerKind::kOnes}});
  }
  auto created = core_.CreateVariables({}, items);
  ASSERT_OK(created);
  EXPECT_EQ(created->variables.size(), 100u);
  std::vector<InitializeItem> init;
  for (int i = 0; i < 100; ++i) init.push_back({absl::StrCat("b/", i), std::nullopt});
  int calls_before = workers_.calls();
  auto inited = core_.Initialize({}, init);
  ASSERT_OK(inited);
  EXPECT_EQ(workers_.calls() - calls_before, 1) << "one exchange per worker, not per variable";
  std::vector<Assignment> assigns;
  for (int i = 0; i < 100; ++i)
    assigns.push_back({absl::StrCat("b/", i), AssignOp::kAdd, F32({1, 1, 1})});
  auto written = core_.AssignBatch({}, assigns);
  ASSERT_OK(written);
  EXPECT_EQ((*written)[99].version, 2);
  EXPECT_EQ(Floats(*core_.Read("b/42")->value), (std::vector<float>{2, 2, 2}));
}

// A batch over variables of different placements, interleaved (the fan-out
// groups replicas by worker once per placement list): every replica, and
// only those, is written on the worker its placement names.
TEST_F(CoordinatorTest, V6_BatchedInitialize_MixedPlacements_EachReplicaOnItsWorker) {
  std::vector<CreateItem> items;
  for (int i = 0; i < 12; ++i) {
    items.push_back(
        {Def(absl::StrCat("m/", i), 1 + i % 3 * 2), Initializer{InitializerKind::kOnes}});
  }
  ASSERT_OK(core_.CreateVariables({}, items));
  std::vector<InitializeItem> init;
  for (int i = 0; i < 12; ++i) init.push_back({absl::StrCat("m/", i), std::nullopt});
  ASSERT_OK(core_.Initialize({}, init));
  for (int i = 0; i < 12; ++i) {
    auto v = core_.GetVariable(absl::StrCat("m/", i));
    ASSERT_OK(v);
    ASSERT_EQ(v->replicas.size(), static_cast<size_t>(1 + i % 3 * 2));
    for (int32_t r = 0; r < 6; ++r) {
      for (int t = 0; t < 3; ++t) {
        const std::string task = absl::StrCat("tpu_worker:", t);
        const bool placed =
            r < static_cast<int32_t>(v->replicas.size()) && v->replicas[r].task.ToString() == task;
        auto held = workers_.Get(task, v->id, r);
        EXPECT_EQ(held.has_value(), placed) << v->def.name << " replica " << r << " on " << task;
        if (placed && held) {
          EXPECT_EQ(held->version, 1);
        }
      }
    }
  }
}

// Variables initialized alike (the same initializer and spec) share one
// value, made once and sent to each worker once; each still reads its own
// right value, and a later write to one leaves the others as they were.
TEST_F(CoordinatorTest, V6_BatchedInitialize_VariablesInitializedAlike_ShareOneValue) {
  const Initializer zeros{InitializerKind::kZeros};
  const Initializer ones{InitializerKind::kOnes};
  struct Var {
    std::string name;
    std::vector<int64_t> dims;
    Initializer init;
    std::vector<float> want;
  };
  const std::vector<Var> vars = {
      {"z3/a", {3}, zeros, {0, 0, 0}}, {"o3", {3}, ones, {1, 1, 1}},
      {"z3/b", {3}, zeros, {0, 0, 0}}, {"z2", {2}, zeros, {0, 0}},
      {"z3/c", {3}, zeros, {0, 0, 0}},
  };
  std::vector<CreateItem> items;
  std::vector<InitializeItem> init;
  for (const Var& v : vars) {
    items.push_back({Def(v.name, 1, v.dims), v.init});
    init.push_back({v.name, std::nullopt});
  }
  ASSERT_OK(core_.CreateVariables({}, items));
  ASSERT_OK(core_.Initialize({}, init));
  EXPECT_EQ(workers_.DistinctValuesLastSent("tpu_worker:0"), 3u)
      << "zeros[3] (three variables), ones[3], zeros[2]";
  for (const Var& v : vars) {
    auto read = core_.Read(v.name);
    ASSERT_OK(read);
    EXPECT_EQ(Floats(*read->value), v.want) << v.name;
  }
  ASSERT_OK(Assign("z3/b", F32({7, 8, 9})));
  EXPECT_EQ(Floats(*core_.Read("z3/b")->value), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(Floats(*core_.Read("z3/a")->value), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(Floats(*core_.Read("z3/c")->value), (std::vector<float>{0, 0, 0}));
}

// A batched read answers every name or refuses the batch, naming the
// variable: unknown, uninitialized, or the one that takes it past its byte
// bound (checked before any value is read).
TEST_F(CoordinatorTest, C1_ReadBatch_AllOrARefusalNamingTheVariable) {
  Create(Def("a", 2));
  Create(Def("b", 2));
  Create(Def("uninit", 2));
  ASSERT_OK(Assign("a", F32({1, 2, 3})));
  ASSERT_OK(Assign("b", F32({4, 5, 6})));
  const int reads = workers_.reads();
  auto both = core_.ReadBatch({"b", "a"}, 24);
  ASSERT_OK(both);
  EXPECT_EQ(workers_.reads(), reads) << "kept values: no worker asked";
  EXPECT_EQ(Floats(*(*both)[0].value), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(Floats(*(*both)[1].value), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ((*both)[1].version, 1);
  EXPECT_THAT(core_.ReadBatch({"a", "nope"}, 24),
              StatusIs(absl::StatusCode::kNotFound, "\"nope\" does not exist"));
  EXPECT_THAT(core_.ReadBatch({"a", "uninit"}, 24),
              StatusIs(absl::StatusCode::kFailedPrecondition, "uninit is uninitialized"));
  EXPECT_THAT(core_.ReadBatch({"a", "b"}, 23),
              StatusIs(absl::StatusCode::kResourceExhausted, "more than 23 bytes (b takes it"));
  auto none = core_.ReadBatch({}, 0);
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TEST_F(CoordinatorTest, C1_Read_ReturnsLastCommittedValueAndVersion) {
  Create(Def("w", 6));
  ASSERT_OK(Assign("w", F32({1, 2, 3})));
  ASSERT_OK(Assign("w", F32({4, 5, 6})));
  auto r = core_.Read("w");
  ASSERT_OK(r);
  EXPECT_EQ(r->version, 2);
  EXPECT_EQ(Floats(*r->value), (std::vector<float>{4, 5, 6}));
}

}  // namespace
}  // namespace repvar::server

// SPDX-License-Identifier: Apache-2.0
// Replicated steps against real processes: reports (S3), aggregation (S4),
// writes beside a step (S5), bad in-step writes (X2), dead and restarted
// workers (F1, F2), and results that repeat run to run.
#include "tests/integration/step_fixture.h"

namespace repvar {
namespace {

TEST_F(StepTest, S3_OneReportPerWorker_RefusalsHaveDistinctStatuses) {
  Create("w", Aggregation::kNone);
  const uint64_t inc0 = testing::WorkerIncarnation(cluster_.worker_address(0));
  auto scope = StepScope::Begin(*client_, 3, Options(0));
  ASSERT_OK(scope);
  auto stub = v1::CoordinatorWorkers::NewStub(
      grpc::CreateChannel(cluster_.address(), grpc::InsecureChannelCredentials()));
  auto report = [&](v1::ReportStepRequest req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    v1::StepPlan plan;
    return stub->ReportStep(&ctx, req, &plan).error_code();
  };
  v1::ReportStepRequest req;
  req.set_step(3);
  req.set_epoch((*scope)->epoch());
  req.set_job("tpu_worker");
  req.set_task(0);
  req.set_incarnation(inc0);
  auto* rr = req.add_replicas();
  rr->set_variable_id(1);
  rr->set_replica(0);
  rr->set_checksum(42);
  rr->set_first_nonfinite(-1);

  v1::ReportStepRequest stale = req;
  stale.set_incarnation(inc0 + 1);
  EXPECT_EQ(report(stale), grpc::StatusCode::ABORTED);
  v1::ReportStepRequest not_owner = req;
  not_owner.mutable_replicas(0)->set_replica(2);  // replica 2 lives on tpu_worker:1
  EXPECT_EQ(report(not_owner), grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportStepRequest future = req;
  future.set_step(4);
  future.set_epoch((*scope)->epoch() + 1);
  EXPECT_EQ(report(future), grpc::StatusCode::OUT_OF_RANGE);
  v1::ReportStepRequest closed = req;
  closed.set_step(2);
  closed.set_epoch((*scope)->epoch() - 1);  // below the open step
  EXPECT_EQ(report(closed), grpc::StatusCode::FAILED_PRECONDITION);

  // Accepted: the call then waits for the barrier (cut short here).
  EXPECT_EQ(report(req), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(report(req), grpc::StatusCode::DEADLINE_EXCEEDED);  // identical: idempotent
  v1::ReportStepRequest different = req;
  different.mutable_replicas(0)->set_checksum(43);
  EXPECT_EQ(report(different), grpc::StatusCode::ALREADY_EXISTS);
}

TEST_F(StepTest, S4_Mean_BeginPlusMeanOfDeltas_ExactAndBitIdentical_VersionPlusOne) {
  Create("w", Aggregation::kMean, {10, 20, 30, 40});
  // Replica r adds (r + 1) * 6 to every element: the mean delta is 21.
  auto results = RunStep(1, [](int, StepScope& s) {
    return WriteAll(s, "w", [](int32_t r) {
      float d = static_cast<float>((r + 1) * 6);
      return Vec{10 + d, 20 + d, 30 + d, 40 + d};
    });
  });
  for (auto& r : results) {
    ASSERT_OK(r);
    ASSERT_EQ(r->changed.size(), 1u);
    EXPECT_EQ(r->changed[0].version, 2);                                 // initialize was version 1
    EXPECT_EQ(r->changed[0].checksum, results[0]->changed[0].checksum);  // one resolution
  }
  EXPECT_EQ(ReportLatencies(results[0]->epoch), 3u);
  EXPECT_EQ(ReadVec("w"), (Vec{31, 41, 51, 61}));
  auto replicas = Replicas("w");
  ASSERT_EQ(replicas.size(), 6u);
  for (const auto& [i, vc] : replicas) {
    EXPECT_EQ(vc, (std::pair<int64_t, uint64_t>{2, results[0]->changed[0].checksum})) << i;
  }
}

TEST_F(StepTest, S4_Sum_UntouchedReplicasContributeZero) {
  Create("c", Aggregation::kSum, {0, 0, 0, 0});
  // Only host 1 writes: replica 2 adds 1, replica 3 adds 2.
  auto results = RunStep(1, [](int h, StepScope& s) {
    if (h != 1) return absl::OkStatus();
    return WriteAll(s, "c", [](int32_t r) {
      float d = static_cast<float>(r - 1);
      return Vec{d, d, d, d};
    });
  });
  for (auto& r : results) ASSERT_OK(r);
  EXPECT_EQ(ReadVec("c"), (Vec{3, 3, 3, 3}));
  std::set<uint64_t> sums;
  for (const auto& [i, vc] : Replicas("c")) sums.insert(vc.second);
  EXPECT_EQ(sums.size(), 1u);
}

TEST_F(StepTest, S4_BFloat16Sum_AccumulatesInFloat32) {
  CreateZeros("h", DType::kBFloat16, 2, Aggregation::kSum);
  // Replica 0 adds 256, the five others 1 each: 261 in float32, which rounds
  // to 260 in bfloat16. Summed in bfloat16 it would stay at 256.
  auto results = RunStep(1, [](int, StepScope& s) {
    auto local = s.LocalReplicas("h");
    if (!local.ok()) return local.status();
    for (int32_t r : *local) {
      std::array<uint16_t, 2> v;
      v.fill(r == 0 ? uint16_t{0x4380} : uint16_t{0x3f80});  // 256 or 1
      absl::Status st = s.Write("h", r, std::as_bytes(std::span<const uint16_t>(v)));
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  });
  for (auto& r : results) ASSERT_OK(r);
  auto v = client_->Read("h");
  ASSERT_OK(v);
  EXPECT_EQ(v->as<uint16_t>()[0], 0x4382);  // 260
  EXPECT_EQ(v->as<uint16_t>()[1], 0x4382);
}

TEST_F(StepTest, S4_None_DivergenceReportedAndRepairedFromMajority) {
  Create("n", Aggregation::kNone);
  // Hosts 0 and 1 (4 replicas) agree on A; host 2 (2 replicas) writes B.
  auto results = RunStep(1, [](int h, StepScope& s) {
    return WriteAll(s, "n", [h](int32_t) { return h == 2 ? Vec{7, 7, 7, 7} : Vec{5, 5, 5, 5}; });
  });
  for (auto& r : results) {
    ASSERT_OK(r);
    ASSERT_EQ(r->divergences.size(), 1u);
    EXPECT_EQ(r->divergences[0].variable, "n");
    EXPECT_EQ(r->divergences[0].repaired, (std::vector<int32_t>{4, 5}));
    EXPECT_EQ(r->divergences[0].replica_checksums.size(), 6u);
  }
  EXPECT_EQ(ReadVec("n"), (Vec{5, 5, 5, 5}));
  std::set<uint64_t> sums;
  for (const auto& [i, vc] : Replicas("n")) sums.insert(vc.second);
  EXPECT_EQ(sums.size(), 1u);  // repaired everywhere
}

TEST_F(StepTest, S4_OnlyFirstReplica_PrimaryValueEverywhere) {
  Create("f", Aggregation::kOnlyFirstReplica);
  auto results = RunStep(1, [](int h, StepScope& s) {
    return WriteAll(s, "f", [h](int32_t r) {
      float x = static_cast<float>(100 * h + r);
      return Vec{x, x, x, x};
    });
  });
  for (auto& r : results) {
    ASSERT_OK(r);
    EXPECT_TRUE(r->divergences.empty());
  }
  EXPECT_EQ(ReadVec("f"), (Vec{0, 0, 0, 0}));  // replica 0 wrote 0
  std::set<uint64_t> sums;
  for (const auto& [i, vc] : Replicas("f")) sums.insert(vc.second);
  EXPECT_EQ(sums.size(), 1u);
}

TEST_F(StepTest, S4_NonFiniteLocalValue_FailsStepNamingReplica_NothingChanges) {
  Create("w", Aggregation::kMean);
  auto before = Replicas("w");
  auto results = RunStep(1, [](int h, StepScope& s) {
    return WriteAll(s, "w", [h](int32_t r) {
      float bad = (h == 1 && r == 3) ? std::numeric_limits<float>::infinity() : 1.0f;
      return Vec{bad, 1, 1, 1};
    });
  });
  for (auto& r : results) {
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kInvalidArgument, "w/3 on tpu_worker:1"));
  }
  EXPECT_EQ(Replicas("w"), before);
}

TEST_F(StepTest, S4_BarrierTimeout_NamesMissingWorker_EveryCommitGetsIt) {
  Create("w", Aggregation::kMean);
  // Host 2's trainer begins but never commits.
  auto straggler = StepScope::Begin(*client_, 1, Options(2, absl::Seconds(2)));
  ASSERT_OK(straggler);
  std::vector<StepEventInfo> events;
  std::thread watch([&] {
    (void)WatchSteps(*client_, 0, Scaled(absl::Seconds(10)), [&](const StepEventInfo& e) {
      events.push_back(e);
      return e.kind != StepEventInfo::Kind::kResolved;
    });
  });
  // The trainers hear of the stragglers while they wait in Commit.
  absl::Mutex mu;
  std::vector<StepEventInfo> heard;
  std::vector<std::thread> trainers;
  std::vector<absl::StatusOr<StepResult>> results(2, absl::UnknownError("not run"));
  for (int h = 0; h < 2; ++h) {
    trainers.emplace_back([&, h] {
      StepOptions o = Options(h, absl::Seconds(2));
      o.on_event = [&](const StepEventInfo& e) {
        absl::MutexLock lock(&mu);
        heard.push_back(e);
      };
      auto scope = StepScope::Begin(*client_, 1, o);
      if (!scope.ok()) {
        results[h] = scope.status();
        return;
      }
      results[h] = (*scope)->Commit();
    });
  }
  for (std::thread& t : trainers) t.join();
  watch.join();
  {
    absl::MutexLock lock(&mu);
    int stragglers = 0;
    for (const StepEventInfo& e : heard) {
      if (e.kind != StepEventInfo::Kind::kStragglers) continue;
      ++stragglers;
      EXPECT_EQ(e.missing, (std::vector<std::string>{"tpu_worker:2"}));
    }
    EXPECT_EQ(stragglers, 2) << "each waiting trainer is warned at half the timeout";
  }
  for (auto& r : results) {
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     "missing: tpu_worker:2 (sent no report"));
  }
  bool warned = false;
  for (const StepEventInfo& e : events) {
    if (e.kind == StepEventInfo::Kind::kStragglers) {
      warned = true;
      EXPECT_EQ(e.missing, (std::vector<std::string>{"tpu_worker:2"}));
    }
  }
  EXPECT_TRUE(warned) << "no straggler warning at half the timeout";
}

TEST_F(StepTest, S5_CrossReplicaWriteRefused_ReadsCommitted_NewVariablesJoinNextStep) {
  Create("w", Aggregation::kMean);
  auto scope = StepScope::Begin(*client_, 1, Options(0));
  ASSERT_OK(scope);
  Vec x{0, 0, 0, 0};
  EXPECT_THAT(client_->Assign<float>("w", std::span<const float>(x)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 is open"));
  ASSERT_OK((*scope)->Write<float>("w", 0, std::span<const float>(x)));
  EXPECT_EQ(ReadVec("w"), (Vec{1, 2, 3, 4}));  // the last committed value
  // A new variable may be created and initialized now; it is not in step 1.
  Create("slot", Aggregation::kMean);
  EXPECT_THAT((*scope)->LocalReplicas("slot").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "after the step began"));
  ASSERT_OK((*scope)->Abort());
  auto next = StepScope::Begin(*client_, 2, Options(0));
  ASSERT_OK(next);
  EXPECT_OK((*next)->LocalReplicas("slot"));  // joined the next step
}

TEST_F(StepTest, F1_DeadWorker_AbortsStepWithUnavailableNamingIt) {
  Create("w", Aggregation::kMean);
  auto straggler = StepScope::Begin(*client_, 1, Options(2, absl::Seconds(60)));
  ASSERT_OK(straggler);
  cluster_.worker(2).Kill(SIGSTOP);  // heartbeats stop
  auto results = RunStep(
      1, [](int, StepScope&) { return absl::OkStatus(); }, absl::Seconds(60), 2);
  cluster_.worker(2).Kill(SIGCONT);
  for (auto& r : results) {
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kUnavailable, "worker tpu_worker:2"));
  }
}

TEST_F(StepTest, S3_OneTrainerPerDevice_HostReportsWhenBothDevicesCommitted) {
  Create("w", Aggregation::kSum, {0, 0, 0, 0});
  // Six trainers: one per device, each writing only its own replica.
  std::vector<absl::StatusOr<StepResult>> out(6, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 6; ++r) {
    threads.emplace_back([&, r] {
      StepOptions o = Options(r / 2);
      o.devices = {absl::StrCat("TPU:", r % 2)};
      auto scope = StepScope::Begin(*client_, 1, o);
      if (!scope.ok()) {
        out[r] = scope.status();
        return;
      }
      Vec x{1, 1, 1, 1};
      if (absl::Status st = (*scope)->Write<float>("w", r, std::span<const float>(x)); !st.ok()) {
        out[r] = st;
        return;
      }
      out[r] = (*scope)->Commit();
    });
  }
  for (std::thread& t : threads) t.join();
  for (auto& r : out) {
    ASSERT_OK(r);
    EXPECT_EQ(r->epoch, out[0]->epoch);
  }
  EXPECT_EQ(ReportLatencies(out[0]->epoch), 3u);  // one report per host, not per trainer
  EXPECT_EQ(ReadVec("w"), (Vec{6, 6, 6, 6}));
}

TEST_F(StepTest, S3_TrainerOnAHostWithoutReplicas_GetsTheSameResolution) {
  Create("w", Aggregation::kMean);
  absl::StatusOr<StepResult> cpu_host = absl::UnknownError("not run");
  std::thread cpu([&] {
    auto scope = StepScope::Begin(*client_, 1, {.worker = "worker:0"});
    if (!scope.ok()) {
      cpu_host = scope.status();
      return;
    }
    auto local = (*scope)->LocalReplicas("w");
    EXPECT_TRUE(local.ok() && local->empty());
    cpu_host = (*scope)->Commit();
  });
  auto results = RunStep(1, [](int, StepScope& s) {
    return WriteAll(s, "w", [](int32_t) { return Vec{2, 3, 4, 5}; });
  });
  cpu.join();
  for (auto& r : results) ASSERT_OK(r);
  ASSERT_OK(cpu_host);
  EXPECT_EQ(cpu_host->epoch, results[0]->epoch);
  ASSERT_EQ(cpu_host->changed.size(), 1u);
  EXPECT_EQ(cpu_host->changed[0].checksum, results[0]->changed[0].checksum);
}

TEST_F(StepTest, F2_WorkerRestartedAfterSteps_ResyncedFromAnUpToDateReplica) {
  Create("w", Aggregation::kMean);
  for (int step = 1; step <= 2; ++step) {
    auto results = RunStep(step, [step](int, StepScope& s) {
      return WriteAll(s, "w", [step](int32_t r) {
        float x = static_cast<float>(step * 10 + r);
        return Vec{x, x, x, x};
      });
    });
    for (auto& r : results) ASSERT_OK(r);
  }
  // The committed value now exists only on the replicas (nothing has read
  // it through the coordinator yet): the resync must fetch it from one.
  auto info = client_->GetVariable("w");
  ASSERT_OK(info);
  cluster_.worker(2).Kill(SIGKILL);
  RestartAndResync(2, "w");
  auto r = Replicas("w");
  EXPECT_EQ(r[4], (std::pair<int64_t, uint64_t>{info->version, info->checksum}));
  EXPECT_EQ(r[5], (std::pair<int64_t, uint64_t>{info->version, info->checksum}));
  EXPECT_EQ(ReadVec("w"), (Vec{22.5f, 22.5f, 22.5f, 22.5f}));
  // And the restarted worker takes part in the next step.
  auto next = RunStep(3, [](int, StepScope& s) {
    return WriteAll(s, "w", [](int32_t) { return Vec{1, 1, 1, 1}; });
  });
  for (auto& res : next) ASSERT_OK(res);
  EXPECT_EQ(ReadVec("w"), (Vec{1, 1, 1, 1}));
}

TEST_F(StepTest, X2_BadInStepWrites_RefusedAndNothingChanges) {
  Create("w", Aggregation::kMean);
  auto scope = StepScope::Begin(*client_, 1, Options(0));
  ASSERT_OK(scope);
  float three[3] = {1, 2, 3};
  EXPECT_THAT((*scope)->Write("w", 0, std::as_bytes(std::span(three))),
              StatusIs(absl::StatusCode::kInvalidArgument));  // 3 floats for a float32[4]
  // A header whose checksum does not match its bytes.
  auto stub = testing::WorkerStepsStub(cluster_.worker_address(0));
  v1::StepWriteSmallRequest req;
  v1::StepWriteHeader* h = req.add_writes();
  h->set_step(1);
  h->set_epoch((*scope)->epoch());
  auto var = client_->GetVariable("w");
  ASSERT_OK(var);
  h->set_variable_id(var->id);
  h->set_replica(0);
  h->mutable_tensor()->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  h->mutable_tensor()->mutable_spec()->add_dims(4);
  h->mutable_tensor()->set_byte_size(16);
  h->mutable_tensor()->set_checksum(12345);
  h->set_inline_data(std::string(16, '\0'));
  grpc::ClientContext ctx;
  v1::StepWriteResponse resp;
  EXPECT_EQ(stub->StepWriteSmall(&ctx, req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  auto seen = (*scope)->Read("w", 0);
  ASSERT_OK(seen);
  EXPECT_EQ(seen->as<float>()[0], 1.0f);  // still the committed value

  // A stream whose second tensor is bad applies neither.
  {
    grpc::ClientContext sctx;
    v1::StepWriteResponse sresp;
    auto writer = stub->StepWrite(&sctx, &sresp);
    float good[4] = {7, 7, 7, 7};
    v1::StepWriteRequest m1;
    *m1.mutable_header() = *h;
    m1.mutable_header()->set_stream_writes(2);
    m1.mutable_header()->set_inline_data(reinterpret_cast<const char*>(good), sizeof(good));
    m1.mutable_header()->mutable_tensor()->set_checksum(
        Checksum(std::as_bytes(std::span<const float>(good))));
    v1::StepWriteRequest m2;
    *m2.mutable_header() = *h;  // the bad checksum again, for replica 1
    m2.mutable_header()->set_replica(1);
    EXPECT_TRUE(writer->Write(m1));
    writer->Write(m2);
    writer->WritesDone();
    grpc::Status finished = writer->Finish();
    EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(finished.error_message(), ::testing::HasSubstr("checksum"));
  }
  EXPECT_EQ((*scope)->Read("w", 0)->as<float>()[0], 1.0f);
  EXPECT_EQ((*scope)->Read("w", 1)->as<float>()[0], 1.0f);
}

TEST_F(StepTest, F1_WorkerKilledDuringAggregation_StepFailsNothingChanges_NextStepWorks) {
  // A big MEAN variable keeps the workers in the reduction long enough.
  const int64_t n = 8 << 20;  // 32 MiB of float32
  CreateZeros("big", DType::kFloat32, n, Aggregation::kMean);
  auto before = Replicas("big");
  std::vector<float> ones(n, 1.0f);
  auto write_all = [&](int, StepScope& s) -> absl::Status {
    auto local = s.LocalReplicas("big");
    if (!local.ok()) return local.status();
    for (int32_t r : *local) {
      absl::Status st = s.Write<float>("big", r, std::span<const float>(ones));
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  };
  std::thread killer([&] {
    // Once every host has reported, the workers are in the reduction.
    (void)WatchSteps(*client_, 0, Scaled(absl::Seconds(60)), [&](const StepEventInfo& e) {
      if (e.kind != StepEventInfo::Kind::kAggregating) return true;
      cluster_.worker(2).Kill(SIGKILL);
      return false;
    });
  });
  auto results = RunStep(1, write_all, absl::Seconds(60));
  killer.join();
  // Whoever notices first ends the step for everyone, naming the lost worker:
  // the coordinator (its heartbeats stopped: UNAVAILABLE) or the trainer on
  // that host (its worker went away mid-commit: it aborts the step).
  for (int h = 0; h < 2; ++h) {
    ASSERT_FALSE(results[h].ok()) << h;
    EXPECT_TRUE(absl::IsUnavailable(results[h].status()) || absl::IsAborted(results[h].status()))
        << results[h].status();
    EXPECT_NE(results[h].status().message().find("tpu_worker:2"), std::string::npos)
        << results[h].status();
  }
  EXPECT_FALSE(results[2].ok());                                    // its worker is gone
  auto after = Replicas("big", 2);                                  // the two live hosts
  for (int r = 0; r < 4; ++r) EXPECT_EQ(after[r], before[r]) << r;  // nothing changed
  // The worker comes back, is resynced, and the next step works with all six.
  RestartAndResync(2, "big");
  auto next = RunStep(1, write_all, absl::Seconds(20));
  for (auto& r : next) ASSERT_OK(r);
  auto v = client_->Read("big");
  ASSERT_OK(v);
  EXPECT_EQ(v->as<float>()[0], 1.0f);
  EXPECT_EQ(v->as<float>()[n - 1], 1.0f);
}

TEST_F(StepTest, RunToRun_SameStepsGiveBitIdenticalValues) {
  // The same five steps from the same start, run twice (the variable is reset
  // by a cross-replica assign in between), end bit-identical: the reduction
  // order is fixed for a fixed set of workers.
  const Vec init{0.1f, 0.2f, 0.3f, 0.4f};
  Create("a", Aggregation::kMean, init);
  std::vector<std::vector<std::byte>> runs;
  for (int run = 0; run < 2; ++run) {
    for (int i = 1; i <= 5; ++i) {
      auto results = RunStep(run * 5 + i, [i](int, StepScope& s) {
        auto local = s.LocalReplicas("a");
        if (!local.ok()) return local.status();
        for (int32_t r : *local) {
          auto cur = s.Read("a", r);
          if (!cur.ok()) return cur.status();
          Vec x;
          std::memcpy(x.data(), cur->bytes.data(), sizeof(x));
          for (float& e : x)
            e = e * 0.9f + 0.013f * static_cast<float>(i) / static_cast<float>(r + 3);
          absl::Status st = s.Write<float>("a", r, std::span<const float>(x));
          if (!st.ok()) return st;
        }
        return absl::OkStatus();
      });
      for (auto& r : results) ASSERT_OK(r);
    }
    auto v = client_->Read("a");
    ASSERT_OK(v);
    runs.push_back(v->bytes);
    ASSERT_OK(client_->Assign<float>("a", std::span<const float>(init)));
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_NE(runs[0], std::vector<std::byte>(16));
}

}  // namespace
}  // namespace repvar

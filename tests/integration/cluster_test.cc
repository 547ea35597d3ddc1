// SPDX-License-Identifier: Apache-2.0
// The contract against real processes: a coordinator, three TPU hosts with two
// devices each and one CPU-only host, all on 127.0.0.1, driven through the
// C++ client. Worker state is checked on the workers themselves.
#include "tests/testing/cluster.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "repvar/client.h"
#include "repvar/v1/coordinator.grpc.pb.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"

namespace repvar {
namespace {

using ::repvar::testing::Scaled;
using ::repvar::testing::StartedCluster;
using ::repvar::testing::StatusIs;
using ::repvar::testing::TestCluster;
using ::repvar::testing::WorkerStatus;
using ::repvar::testing::WorkerStub;

class ClusterTest : public StartedCluster {
 protected:
  VariableSpec Spec(const std::string& name, int replicas, std::vector<int64_t> shape = {4}) {
    VariableSpec s{.name = name, .dtype = DType::kFloat32, .shape = std::move(shape)};
    s.replica_count = replicas;
    return s;
  }
  // Polls until `pred` holds or the scaled deadline passes.
  template <typename P>
  bool Eventually(P pred, absl::Duration d = absl::Seconds(10)) {
    absl::Time deadline = absl::Now() + Scaled(d);
    while (absl::Now() < deadline) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return pred();
  }
};

TEST_F(ClusterTest, T3_InfeedHost_IsTheTpuJobTaskOwningOrdinalZero) {
  auto t = client_->GetTopology();
  ASSERT_OK(t);
  EXPECT_EQ(t->tasks.size(), 4u);
  ASSERT_EQ(t->accelerators.size(), 6u);
  EXPECT_EQ(t->accelerators[0].device, "/job:tpu_worker/replica:0/task:0/device:TPU:0");
  ASSERT_TRUE(t->infeed_host.has_value());
  EXPECT_EQ(t->infeed_host->job, "tpu_worker");
  EXPECT_EQ(t->infeed_host->task, 0);
  EXPECT_EQ(t->infeed_host->address, cluster_.worker_address(0));
  EXPECT_EQ(t->infeed_host->cpu_device, "/job:tpu_worker/replica:0/task:0/device:CPU:0");
}

TEST_F(ClusterTest, T4_WaitForTopology_TimeoutNamesMissingTasks) {
  testing::TestCluster partial(
      {.tpu_workers = 1, .cpu_host = false, .expected_tasks = "tpu_worker:3"});
  ASSERT_OK(partial.Start());
  auto c = Client::Connect({.coordinator_address = partial.address()});
  auto t = (*c)->WaitForTopology(absl::Milliseconds(300));
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kDeadlineExceeded, "tpu_worker:1, tpu_worker:2"));
}

TEST_F(ClusterTest, T5_KilledWorker_DeclaredDeadAndWatchersSeeTheNewVersion) {
  auto before = client_->GetTopology();
  ASSERT_OK(before);
  std::thread killer([&] { cluster_.worker(2).Kill(SIGKILL); });
  auto changed = client_->WatchTopology(before->version, Scaled(absl::Seconds(15)));
  killer.join();
  ASSERT_OK(changed);
  EXPECT_GT(changed->version, before->version);
  EXPECT_EQ(changed->tasks.size(), 3u);
  EXPECT_EQ(changed->accelerators.size(), 4u);
}

TEST_F(ClusterTest, C2_Assign_EveryWorkerHoldsTheNewVersionWhenAcked) {
  ASSERT_OK(client_->CreateVariable(Spec("w", 6)));
  std::vector<float> v = {1.5f, -2, 3, 4};
  auto ack = client_->Assign("w", std::span<const float>(v));
  ASSERT_OK(ack);
  auto info = client_->GetVariable("w");
  for (int w = 0; w < 3; ++w) {
    auto status = WorkerStatus(cluster_.worker_address(w));
    int held = 0;
    for (const auto& r : status.replicas()) {
      if (r.variable_id() != info->id) continue;
      EXPECT_EQ(r.version(), ack->version);
      EXPECT_EQ(r.checksum(), ack->checksum);
      EXPECT_EQ(r.replica() / 2, w) << "replica i lives on the host of ordinal i";
      ++held;
    }
    EXPECT_EQ(held, 2) << "worker " << w;
  }
  // The bytes on a worker are the bytes written.
  grpc::ClientContext ctx;
  v1::ReadReplicaRequest req;
  req.set_variable_id(info->id);
  req.set_replica(5);
  auto reader = WorkerStub(cluster_.worker_address(2))->ReadReplica(&ctx, req);
  v1::ReadVariableChunk chunk;
  std::string bytes;
  while (reader->Read(&chunk)) {
    if (chunk.has_chunk()) bytes += chunk.chunk().data();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(bytes.size(), 16u);
  EXPECT_EQ(std::memcmp(bytes.data(), v.data(), 16), 0);
}

TEST_F(ClusterTest, C2_Assign_DeadWorkerDoesNotBlockLiveReplicas) {
  ASSERT_OK(client_->CreateVariable(Spec("w", 6)));
  cluster_.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return client_->GetTopology()->tasks.size() == 3; }));
  std::vector<float> v = {1, 2, 3, 4};
  ASSERT_OK(client_->Assign("w", std::span<const float>(v)));
  auto info = client_->GetVariable("w");
  EXPECT_EQ(info->replicas[2].state, ReplicaState::kUnavailable);
  EXPECT_EQ(info->replicas[0].state, ReplicaState::kUpToDate);
  EXPECT_EQ(info->replicas[5].state, ReplicaState::kUpToDate);
}

TEST_F(ClusterTest, F2_RestartedWorker_ResyncedFromCommittedValue) {
  ASSERT_OK(client_->CreateVariable(Spec("w", 6)));
  std::vector<float> v = {9, 8, 7, 6};
  auto ack = client_->Assign("w", std::span<const float>(v));
  ASSERT_OK(ack);
  cluster_.worker(1).Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return client_->GetTopology()->tasks.size() == 3; }));
  ASSERT_OK(cluster_.RestartWorker(1));
  ASSERT_TRUE(Eventually([&] {
    auto info = client_->GetVariable("w");
    return info.ok() && info->replicas[2].state == ReplicaState::kUpToDate &&
           info->replicas[3].state == ReplicaState::kUpToDate;
  }));
  auto status = WorkerStatus(cluster_.worker_address(1));
  ASSERT_EQ(status.replicas_size(), 2);
  EXPECT_EQ(status.replicas(0).version(), ack->version);
  EXPECT_EQ(status.replicas(0).checksum(), ack->checksum);
}

TEST_F(ClusterTest, Ops_SigtermStopsDaemonsCleanlyEvenWithOpenWatchers) {
  auto before = client_->GetTopology();
  ASSERT_OK(before);
  // A watcher is blocked in WatchTopology while the coordinator shuts down.
  std::thread watcher([&] { (void)client_->WatchTopology(before->version, absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(100));
  absl::Time start = absl::Now();
  EXPECT_EQ(cluster_.worker(0).Stop(), 0);
  EXPECT_EQ(cluster_.coordinator().Stop(), 0);
  EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(8)));
  watcher.join();
}

TEST_F(ClusterTest, C5_ConcurrentInitialize_FirstCallerWinsOneValueEverywhere) {
  VariableSpec s = Spec("w", 6, {256});
  s.initializer = InitializerSpec::RandomNormal(0, 1, 3);
  ASSERT_OK(client_->CreateVariable(s));
  std::vector<std::thread> threads;
  std::atomic<int> winners{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      auto c = Client::Connect({.coordinator_address = cluster_.address()});
      auto r = (*c)->Initialize({"w"});
      ASSERT_OK(r);
      if ((*r)[0].initialized_now) ++winners;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
  auto state = client_->IsInitialized({"w"});
  ASSERT_OK(state);
  EXPECT_TRUE((*state)[0].initialized);
  for (const auto& r : (*state)[0].replicas) EXPECT_EQ(r.state, ReplicaState::kUpToDate);
  EXPECT_EQ(client_->Read("w")->version, 1);
}

TEST_F(ClusterTest, V4_ReplicatedScope_SetsReplicaCountAndPrefix) {
  {
    ReplicatedScope outer(6, "model");
    ReplicatedScope inner(3, "dense");
    auto v = client_->CreateVariable({.name = "kernel", .dtype = DType::kFloat32, .shape = {2}});
    ASSERT_OK(v);
    EXPECT_EQ(v->spec.name, "model/dense/kernel");
    EXPECT_EQ(v->spec.replica_count, 3);
    EXPECT_EQ(v->replicas[2].name, "model/dense/kernel/2");
  }
  auto plain = client_->CreateVariable({.name = "plain", .dtype = DType::kFloat32});
  ASSERT_OK(plain);
  EXPECT_EQ(plain->spec.replica_count, 1);
}

TEST_F(ClusterTest, V6_BatchedCreateInitializeReadAssign_ThousandVariables) {
  std::vector<VariableSpec> specs;
  for (int i = 0; i < 1000; ++i) {
    VariableSpec s = Spec(absl::StrCat("b/", i), 6, {16});
    s.initializer = InitializerSpec::Constant(i);
    specs.push_back(s);
  }
  // Answered without the replicas (6,000 here); GetVariable has them.
  auto created = client_->CreateVariables(specs, VariableDetail::kBasic);
  ASSERT_OK(created);
  ASSERT_EQ(created->size(), 1000u);
  EXPECT_TRUE((*created)[999].created);
  EXPECT_EQ((*created)[999].spec.name, "b/999");
  EXPECT_TRUE((*created)[999].replicas.empty());
  EXPECT_EQ(client_->GetVariable("b/999")->replicas.size(), 6u);
  std::vector<std::string> names;
  for (int i = 0; i < 1000; ++i) names.push_back(absl::StrCat("b/", i));
  ASSERT_OK(client_->Initialize(names));
  auto values = client_->ReadBatch(names);
  ASSERT_OK(values);
  EXPECT_EQ((*values)[777].as<float>()[15], 777.0f);
  std::vector<float> ones(16, 1.0f);
  std::vector<AssignItem> items;
  for (const auto& n : names) items.push_back({n, AssignOp::kAdd, std::as_bytes(std::span(ones))});
  auto acks = client_->AssignBatch(items);
  ASSERT_OK(acks);
  EXPECT_EQ((*acks)[5].version, 2);
  EXPECT_EQ(client_->Read("b/5")->as<float>()[0], 6.0f);
}

// A batched read of more than the coordinator answers on gRPC's callback
// thread (1 MiB) is read on a pool thread: the same values, in order, as
// each single Read gives them, the small one beside the large ones.
TEST_F(ClusterTest, V6_BatchedRead_LargerThanACallbackAnswer_EachAsReadGivesIt) {
  std::vector<VariableSpec> specs = {Spec("small", 2, {16})};
  for (int i = 0; i < 3; ++i) specs.push_back(Spec(absl::StrCat("large/", i), 2, {1 << 17}));
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].initializer = InitializerSpec::Constant(static_cast<double>(i) + 0.5);
  }
  ASSERT_OK(client_->CreateVariables(specs, VariableDetail::kBasic));
  const std::vector<std::string> names = {"large/0", "small", "large/1", "large/2"};
  ASSERT_OK(client_->Initialize(names));
  auto batch = client_->ReadBatch(names);  // 1.5 MiB
  ASSERT_OK(batch);
  ASSERT_EQ(batch->size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto single = client_->Read(names[i]);
    ASSERT_OK(single);
    EXPECT_EQ((*batch)[i].bytes, single->bytes) << names[i];
    EXPECT_EQ((*batch)[i].version, single->version) << names[i];
    EXPECT_EQ((*batch)[i].checksum, single->checksum) << names[i];
  }
  EXPECT_EQ((*batch)[2].as<float>()[(1 << 17) - 1], 2.5f);
  EXPECT_EQ((*batch)[1].as<float>()[15], 0.5f);
}

}  // namespace
}  // namespace repvar

namespace repvar {
namespace {

// docs/architecture.md: a large cross-replica write reaches one root worker, which
// broadcasts it to the others over gloo; every worker verifies the checksum.
class DataPlaneTest : public StartedCluster {
 protected:
  DataPlaneTest() : StartedCluster({.tpu_workers = 4, .tpu_per_worker = 1, .cpu_host = false}) {}
  // The groups worker `w` joined ("GROUP as rank R of N"), from its log.
  std::set<std::string> GroupsJoined(int w) {
    std::ifstream in(cluster_.worker(w).log_path());
    std::set<std::string> out;
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find("data plane: joined group ");
      if (at == std::string::npos) continue;
      const std::string rest = line.substr(at + 25);
      out.insert(rest.substr(0, rest.find(' ')) + rest.substr(rest.rfind(" of ")));
    }
    return out;
  }
  void ExpectEveryWorkerHolds(uint64_t id, const WriteAck& ack, std::vector<int> workers) {
    for (int w : workers) {
      auto status = WorkerStatus(cluster_.worker_address(w));
      bool found = false;
      for (const auto& r : status.replicas()) {
        if (r.variable_id() != id) continue;
        found = true;
        EXPECT_EQ(r.version(), ack.version) << "worker " << w;
        EXPECT_EQ(r.checksum(), ack.checksum) << "worker " << w;
      }
      EXPECT_TRUE(found) << "worker " << w;
    }
  }
};

TEST_F(DataPlaneTest, LargeAssign_RootBroadcastsOverGloo_EveryWorkerVerifies) {
  // 8 MiB of float32 and a bit: the chain's last piece is a partial one.
  const int64_t n = (2 << 20) + 77;
  auto info = client_->CreateVariable(
      {.name = "big", .dtype = DType::kFloat32, .shape = {n}, .replica_count = 4});
  ASSERT_OK(info);
  std::vector<float> v(n);
  for (int round = 0; round < 3; ++round) {
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + round) % 1001);
    auto ack = client_->Assign("big", std::span<const float>(v));
    ASSERT_OK(ack);
    ExpectEveryWorkerHolds(info->id, *ack, {0, 1, 2, 3});
  }
  std::string log;
  std::ifstream in(cluster_.worker(3).log_path());
  log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("data plane: joined group"), std::string::npos)
      << "the bytes did not travel over gloo";
}

TEST_F(DataPlaneTest, MemberDies_NextLargeAssignFormsANewGroup) {
  const int64_t n = 1 << 20;
  auto info = client_->CreateVariable(
      {.name = "big", .dtype = DType::kFloat32, .shape = {n}, .replica_count = 4});
  ASSERT_OK(info);
  std::vector<float> v(n, 1.0f);
  ASSERT_OK(client_->Assign("big", std::span<const float>(v)));
  const std::set<std::string> first = GroupsJoined(0);
  ASSERT_EQ(first.size(), 1u) << "the first write did not travel over a group of 4";
  EXPECT_TRUE(first.begin()->ends_with(" of 4")) << *first.begin();
  cluster_.worker(2).Kill(SIGKILL);
  absl::Time deadline = absl::Now() + Scaled(absl::Seconds(10));
  while (client_->GetTopology()->tasks.size() != 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(client_->GetTopology()->tasks.size(), 3u) << "the killed worker was not declared dead";
  v[0] = 2.0f;
  auto ack = client_->Assign("big", std::span<const float>(v));
  ASSERT_OK(ack);
  ExpectEveryWorkerHolds(info->id, *ack, {0, 1, 3});
  auto back = client_->Read("big");
  ASSERT_OK(back);
  EXPECT_EQ(back->as<float>()[0], 2.0f);
  // The second write went over a new group of the three survivors.
  for (int w : {0, 1, 3}) {
    std::set<std::string> joined = GroupsJoined(w);
    for (const std::string& g : first) joined.erase(g);
    ASSERT_EQ(joined.size(), 1u) << "worker " << w << " joined no new group";
    EXPECT_TRUE(joined.begin()->ends_with(" of 3")) << "worker " << w << ": " << *joined.begin();
  }
}

}  // namespace
}  // namespace repvar

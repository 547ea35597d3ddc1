// SPDX-License-Identifier: Apache-2.0
// Checkpoints against real daemons (Client::SaveCheckpoint /
// RestoreCheckpoint, repvarctl save / restore): a saved file holds every
// committed value and restores them all as the next versions; a restore that
// does not fit the cluster, or a damaged file, is refused with nothing
// written; a save is one cut even while writes keep coming.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/io/safetensors.h"
#include "repvar/client.h"
#include "repvar/step.h"
#include "tests/testing/started_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace repvar {
namespace {

using ::repvar::testing::BinaryPath;
using ::repvar::testing::StatusIs;

std::vector<float> Ramp(int n, float base) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

std::vector<float> ReadFloats(Client& client, const std::string& name) {
  auto v = client.Read(name);
  EXPECT_OK(v);
  if (!v.ok()) return {};
  auto f = v->as<float>();
  return {f.begin(), f.end()};
}

class CheckpointTest : public testing::StartedCluster {
 protected:
  void Make(const std::string& name, std::vector<int64_t> shape, int32_t replicas,
            Aggregation agg = Aggregation::kNone) {
    VariableSpec s{.name = name, .dtype = DType::kFloat32, .shape = std::move(shape)};
    s.replica_count = replicas;
    s.aggregation = agg;
    s.collections = {"ckpt"};
    ASSERT_OK(client_->CreateVariable(s));
  }
  std::vector<float> Floats(const std::string& name) { return ReadFloats(*client_, name); }
  int64_t Version(const std::string& name) {
    auto v = client_->GetVariable(name);
    EXPECT_OK(v);
    return v.ok() ? v->version : -1;
  }

  repvar::testing::TempDir dir_;
};

TEST_F(CheckpointTest, SaveThenRestore_EveryValueBack_AsTheNextVersion) {
  Make("m/kernel", {4, 3}, 6, Aggregation::kMean);
  Make("m/bias", {3}, 2);
  Make("m/unset", {2}, 1);
  ASSERT_OK(client_->Assign("m/kernel", std::span<const float>(Ramp(12, 1))));
  ASSERT_OK(client_->Assign("m/bias", std::span<const float>(Ramp(3, 100))));
  const std::string path = dir_.path() + "/m.safetensors";
  auto saved = client_->SaveCheckpoint(path);
  ASSERT_OK(saved);
  EXPECT_EQ(saved->variables, 2);
  EXPECT_EQ(saved->bytes, (12u + 3u) * 4);
  EXPECT_EQ(saved->uninitialized, std::vector<std::string>{"m/unset"});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(::getpid())));

  ASSERT_OK(client_->Assign("m/kernel", std::span<const float>(Ramp(12, -50))));
  const int64_t kernel_before = Version("m/kernel");
  const int64_t bias_before = Version("m/bias");
  std::vector<CheckpointProgress> seen;
  auto restored = client_->RestoreCheckpoint(
      path, {.progress = [&](const CheckpointProgress& p) { seen.push_back(p); }});
  ASSERT_OK(restored);
  EXPECT_EQ(restored->variables, 2);
  EXPECT_EQ(restored->created, 0);
  EXPECT_EQ(Floats("m/kernel"), Ramp(12, 1));
  EXPECT_EQ(Floats("m/bias"), Ramp(3, 100));
  // Versions move forward, never back to what the file recorded.
  EXPECT_EQ(Version("m/kernel"), kernel_before + 1);
  EXPECT_EQ(Version("m/bias"), bias_before + 1);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_EQ(seen.back().variables_done, 2);
}

TEST_F(CheckpointTest, Restore_MissingVariables_CreatedWithTheFileSpecs_OrTheGivenReplicas) {
  Make("c/w", {5}, 4, Aggregation::kSum);
  ASSERT_OK(client_->Assign("c/w", std::span<const float>(Ramp(5, 3))));
  const std::string path = dir_.path() + "/c.safetensors";
  ASSERT_OK(client_->SaveCheckpoint(path));

  ASSERT_OK(client_->DeleteVariable("c/w"));
  auto restored = client_->RestoreCheckpoint(path);
  ASSERT_OK(restored);
  EXPECT_EQ(restored->created, 1);
  auto info = client_->GetVariable("c/w");
  ASSERT_OK(info);
  EXPECT_EQ(info->spec.replica_count, 4);
  EXPECT_EQ(info->spec.aggregation, Aggregation::kSum);
  EXPECT_EQ(info->spec.collections, std::vector<std::string>{"ckpt"});
  EXPECT_EQ(Floats("c/w"), Ramp(5, 3));

  ASSERT_OK(client_->DeleteVariable("c/w"));
  // More replicas than the 6 accelerators: refused before anything is made.
  EXPECT_THAT(client_->RestoreCheckpoint(path, {.replicas = 7}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "6 accelerators"));
  EXPECT_THAT(client_->GetVariable("c/w"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(client_->RestoreCheckpoint(path, {.replicas = 2}));
  info = client_->GetVariable("c/w");
  ASSERT_OK(info);
  EXPECT_EQ(info->spec.replica_count, 2);
  EXPECT_EQ(Floats("c/w"), Ramp(5, 3));
}

TEST_F(CheckpointTest, Restore_ShapeDiffers_RefusedNamingIt_NothingWritten) {
  Make("s/a", {3}, 2);
  Make("s/b", {4}, 2);
  ASSERT_OK(client_->Assign("s/a", std::span<const float>(Ramp(3, 1))));
  ASSERT_OK(client_->Assign("s/b", std::span<const float>(Ramp(4, 1))));
  const std::string path = dir_.path() + "/s.safetensors";
  ASSERT_OK(client_->SaveCheckpoint(path));
  ASSERT_OK(client_->DeleteVariable("s/b"));
  Make("s/b", {2, 2}, 2);  // same bytes, another shape
  ASSERT_OK(client_->Assign("s/b", std::span<const float>(Ramp(4, 9))));
  ASSERT_OK(client_->Assign("s/a", std::span<const float>(Ramp(3, 9))));
  const int64_t a_before = Version("s/a");
  EXPECT_THAT(client_->RestoreCheckpoint(path), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                         "s/b is float32[2,2] in the cluster"));
  EXPECT_EQ(Version("s/a"), a_before) << "s/a fits, but nothing is written when anything fails";
  EXPECT_EQ(Floats("s/a"), Ramp(3, 9));
}

// C7 on restore: a non-finite value for a variable that does not allow
// them is refused before anything is written (the variables before it in
// the file too), as the write itself would refuse it.
TEST_F(CheckpointTest, Restore_NonFiniteNotAllowed_RefusedNamingIt_NothingWritten) {
  Make("n/a", {3}, 2);
  Make("n/b", {2}, 2);
  ASSERT_OK(client_->Assign("n/a", std::span<const float>(Ramp(3, 9))));
  const int64_t a_before = Version("n/a");
  const std::string path = dir_.path() + "/n.safetensors";
  auto w = io::SafetensorsWriter::Create(
      path, {{"n/a", DType::kFloat32, {3}}, {"n/b", DType::kFloat32, {2}}}, {});
  ASSERT_OK(w);
  const std::vector<float> data = {1, 2, 3, 4, std::numeric_limits<float>::quiet_NaN()};
  ASSERT_OK((*w)->Write(std::as_bytes(std::span(data))));
  ASSERT_OK((*w)->Commit());
  EXPECT_THAT(client_->RestoreCheckpoint(path),
              StatusIs(absl::StatusCode::kFailedPrecondition, "n/b holds a non-finite value"));
  EXPECT_EQ(Version("n/a"), a_before) << "n/a fits, but nothing is written when anything fails";
  EXPECT_EQ(Floats("n/a"), Ramp(3, 9));
  EXPECT_EQ(Version("n/b"), 0);
}

TEST_F(CheckpointTest, Restore_DamagedFile_DataLossNamingTheTensor_NothingWritten) {
  Make("d/a", {256}, 2);
  ASSERT_OK(client_->Assign("d/a", std::span<const float>(Ramp(256, 0))));
  const std::string path = dir_.path() + "/d.safetensors";
  ASSERT_OK(client_->SaveCheckpoint(path));
  ASSERT_OK(client_->Assign("d/a", std::span<const float>(Ramp(256, 1000))));
  const int64_t before = Version("d/a");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-10, std::ios::end);
    char c;
    f.read(&c, 1);
    f.seekp(-10, std::ios::end);
    c ^= 0x01;  // one bit of the data
    f.write(&c, 1);
  }
  EXPECT_THAT(client_->RestoreCheckpoint(path), StatusIs(absl::StatusCode::kDataLoss, "d/a"));
  EXPECT_EQ(Version("d/a"), before);
}

// A writer keeps assigning a = k, then z = k, with 32 MiB variables between
// them in the file: a save that was not one cut would catch z ahead of a.
// The writes are held while the cut streams, then go on: every write of a
// after the cut's value is acknowledged only after the save received half
// its bytes (gRPC's flow control keeps the coordinator from having sent the
// rest by then, so the hold was still in place), and more writes follow the
// save.
TEST_F(CheckpointTest, Save_WhileWritesContinue_IsOneCut_WritesHeldThenGoOn) {
  Make("a", {1}, 2);
  Make("z", {1}, 2);
  for (int i = 0; i < 3; ++i) {
    Make(absl::StrCat("m", i), {8 << 20}, 2);
    ASSERT_OK(client_->Assign(absl::StrCat("m", i),
                              std::span<const float>(std::vector<float>(8 << 20, 1.0f))));
  }
  ASSERT_OK(client_->Assign("a", std::span<const float>(std::vector<float>{0})));
  ASSERT_OK(client_->Assign("z", std::span<const float>(std::vector<float>{0})));
  std::atomic<bool> stop{false};
  std::atomic<int> writes{0};
  absl::Mutex mu;
  std::map<int, absl::Time> a_acknowledged;  // k -> when a = k was acknowledged
  std::thread writer([&] {
    auto own = Client::Connect({.coordinator_address = cluster_.address()});
    ASSERT_OK(own);
    for (int k = 1; k < 100000 && !stop; ++k) {
      const std::vector<float> v{static_cast<float>(k)};
      if (!(*own)->Assign("a", std::span<const float>(v)).ok()) break;
      {
        absl::MutexLock lock(&mu);
        a_acknowledged[k] = absl::Now();
      }
      if (!(*own)->Assign("z", std::span<const float>(v)).ok()) break;
      ++writes;
    }
  });
  while (writes < 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::string path = dir_.path() + "/cut.safetensors";
  absl::Time half_received = absl::InfiniteFuture();
  auto saved = client_->SaveCheckpoint(path, [&](const CheckpointProgress& p) {
    if (half_received == absl::InfiniteFuture() && 2 * p.bytes_done >= p.bytes_total) {
      half_received = absl::Now();
    }
  });
  ASSERT_OK(saved);
  const int at_save = writes;
  const absl::Time went_on_by = absl::Now() + testing::Scaled(absl::Seconds(30));
  while (writes < at_save + 3 && absl::Now() < went_on_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  writer.join();
  EXPECT_GE(writes, at_save + 3) << "writes did not go on after the save";

  // Read the pair back out of the file by restoring it into fresh names.
  ASSERT_OK(client_->DeleteVariable("a"));
  ASSERT_OK(client_->DeleteVariable("z"));
  ASSERT_OK(client_->RestoreCheckpoint(path));
  const float a = Floats("a").at(0), z = Floats("z").at(0);
  EXPECT_TRUE(z == a || z == a - 1) << "a=" << a << " z=" << z;
  ASSERT_NE(half_received, absl::InfiniteFuture());
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(a_acknowledged.contains(static_cast<int>(a) + 1)) << "no write of a after the cut";
  for (auto it = a_acknowledged.upper_bound(static_cast<int>(a)); it != a_acknowledged.end();
       ++it) {
    EXPECT_GT(it->second, half_received)
        << "a = " << it->first << " was acknowledged while the cut (a = " << a
        << ") was still streaming: the write was not held";
  }
}

// The command line: repvarctl save and restore with --json summaries.
TEST_F(CheckpointTest, Repvarctl_SaveAndRestore) {
  Make("r/w", {3}, 2);
  ASSERT_OK(client_->Assign("r/w", std::span<const float>(Ramp(3, 7))));
  const std::string path = dir_.path() + "/r.safetensors";
  const std::string ctl = absl::StrCat(BinaryPath("client/repvarctl"),
                                       " --coordinator=", cluster_.address(), " --json ");
  const std::string out = dir_.path() + "/out.json";
  ASSERT_EQ(std::system((ctl + "save " + path + " > " + out).c_str()), 0);
  std::ifstream saved(out);
  std::string line;
  std::getline(saved, line);
  EXPECT_NE(line.find("\"variables\":1"), std::string::npos) << line;
  ASSERT_OK(client_->Assign("r/w", std::span<const float>(Ramp(3, 0))));
  ASSERT_EQ(std::system((ctl + "restore " + path + " > " + out).c_str()), 0);
  EXPECT_EQ(Floats("r/w"), Ramp(3, 7));
  EXPECT_NE(std::system((ctl + "restore " + dir_.path() + "/missing > /dev/null 2>&1").c_str()), 0);
}

// --checkpoint_every_steps=2 --checkpoint_keep=2: the coordinator writes the
// cut after every second committed step and keeps the newest two; each file
// holds the values as they were after its step.
class PeriodicCheckpointTest : public testing::StartedCluster {
 protected:
  PeriodicCheckpointTest()
      : StartedCluster(testing::ClusterOptions{
            .coordinator_flags = {"--checkpoint_every_steps=2", "--checkpoint_keep=2"}}) {}

  // Every host's trainer writes `value` to each of its replicas of "w".
  void RunStep(int64_t step, float value) {
    std::vector<std::thread> trainers;
    std::vector<absl::Status> out(3);
    for (int h = 0; h < 3; ++h) {
      trainers.emplace_back([&, h] {
        auto scope = StepScope::Begin(*client_, step,
                                      {.worker = absl::StrCat("tpu_worker:", h),
                                       .barrier_timeout = testing::Scaled(absl::Seconds(20))});
        if (!scope.ok()) {
          out[h] = scope.status();
          return;
        }
        auto local = (*scope)->LocalReplicas("w");
        if (!local.ok()) {
          out[h] = local.status();
          return;
        }
        const std::vector<float> v(4, value);
        for (int32_t r : *local) {
          if (absl::Status s = (*scope)->Write<float>("w", r, v); !s.ok()) {
            out[h] = s;
            return;
          }
        }
        out[h] = (*scope)->Commit().status();
      });
    }
    for (std::thread& t : trainers) t.join();
    for (const absl::Status& s : out) ASSERT_OK(s);
  }
  std::string File(int64_t step) {
    return absl::StrCat(cluster_.coordinator_data_dir(), "/checkpoints/step-",
                        absl::Dec(step, absl::kZeroPad12), ".safetensors");
  }
  // Waits (bounded) for a file to appear.
  bool Appears(const std::string& path) {
    for (int i = 0; i < 400 && !std::filesystem::exists(path); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return std::filesystem::exists(path);
  }
};

TEST_F(PeriodicCheckpointTest, EveryTwoSteps_TheNewestTwoKept_EachHoldsItsStep) {
  VariableSpec s{.name = "w", .dtype = DType::kFloat32, .shape = {4}};
  s.replica_count = 6;
  s.initializer = InitializerSpec::Zeros();
  ASSERT_OK(client_->CreateVariable(s));
  ASSERT_OK(client_->Initialize({"w"}));
  for (int64_t step = 1; step <= 6; ++step) {
    RunStep(step, static_cast<float>(step * 10));
    // Waiting here for the file before the next step begins makes each
    // checkpoint land right after its own step.
    if (step % 2 == 0) {
      ASSERT_TRUE(Appears(File(step))) << File(step);
    }
  }
  for (int i = 0; i < 400 && std::filesystem::exists(File(2)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));  // pruned after 6 appears
  }
  EXPECT_FALSE(std::filesystem::exists(File(2))) << "only the newest two are kept";
  EXPECT_TRUE(std::filesystem::exists(File(4)));
  EXPECT_TRUE(std::filesystem::exists(File(6)));
  ASSERT_OK(client_->RestoreCheckpoint(File(4)));
  EXPECT_EQ(ReadFloats(*client_, "w"), std::vector<float>(4, 40.0f));
}

}  // namespace
}  // namespace repvar

// SPDX-License-Identifier: Apache-2.0
// repvar-example: the workload deploy/local-cluster.sh runs. It waits for the
// cluster, shows the topology and the infeed host, creates a small model's
// variables in a replicated scope, initializes them once, applies a few
// cross-replica updates (assign, assign_add, assign_sub), reads everything
// back and checks it bit for bit against values computed here.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "repvar/client.h"

ABSL_FLAG(std::string, coordinator, "", "host:port (default: $REPVAR_COORDINATOR_ADDRESS)");
ABSL_FLAG(int32_t, replicas, 0, "replicas per variable (0: every accelerator)");
ABSL_FLAG(int32_t, rounds, 5, "rounds of cross-replica updates");
ABSL_FLAG(absl::Duration, wait, absl::Seconds(60), "how long to wait for the cluster to form");

namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "example: %s failed: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// The status `s`, saying what failed.
absl::Status Failed(const std::string& what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

const std::vector<std::string> kNames = {"model/dense/kernel", "model/dense/bias",
                                         "model/global_step", "model/optimizer/learning_rate"};

// What the updates left, computed here: what the cluster must hold.
struct Expected {
  std::vector<float> kernel = std::vector<float>(12);
  std::vector<float> bias;
  int64_t step = 0;
};

absl::StatusOr<repvar::Topology> ShowTopology(repvar::Client& c) {
  std::cout << "== waiting for the cluster at " << c.coordinator_address() << "\n";
  auto topo = c.WaitForTopology(absl::GetFlag(FLAGS_wait));
  if (!topo.ok()) return Failed("wait for topology", topo.status());
  std::cout << "topology version " << topo->version << ": " << topo->tasks.size() << " tasks, "
            << topo->accelerators.size() << " accelerators\n";
  for (const auto& t : topo->tasks) {
    std::cout << "  task " << t.job << ":" << t.task << " at " << t.address << " ("
              << t.devices.size() << " devices)\n";
  }
  for (const auto& a : topo->accelerators) {
    std::cout << "  ordinal " << a.ordinal << " = " << a.device << "\n";
  }
  if (!topo->infeed_host) return absl::FailedPreconditionError("no infeed host");
  std::cout << "infeed host (owns ordinal 0): " << topo->infeed_host->job << ":"
            << topo->infeed_host->task << " at " << topo->infeed_host->address
            << "; enqueue input / dequeue output on " << topo->infeed_host->cpu_device << "\n";
  return topo;
}

// The model's variables in a replicated scope, created and initialized once.
absl::Status CreateModel(repvar::Client& c, int32_t replicas) {
  std::cout << "\n== creating the model in ReplicatedScope(" << replicas << ", \"model\")\n";
  repvar::ReplicatedScope scope(replicas, "model");
  repvar::VariableSpec kernel{
      .name = "dense/kernel", .dtype = repvar::DType::kFloat32, .shape = {4, 3}};
  kernel.initializer = repvar::InitializerSpec::RandomNormal(0.0, 0.1, 42);
  repvar::VariableSpec bias{.name = "dense/bias", .dtype = repvar::DType::kFloat32, .shape = {3}};
  bias.initializer = repvar::InitializerSpec::Zeros();
  repvar::VariableSpec steps{
      .name = "global_step", .dtype = repvar::DType::kInt64, .trainable = false};
  steps.initializer = repvar::InitializerSpec::Zeros();
  repvar::VariableSpec lr{.name = "optimizer/learning_rate",
                          .dtype = repvar::DType::kFloat32,
                          .trainable = false,
                          .collections = {"OPTIMIZER"}};
  lr.initializer = repvar::InitializerSpec::Constant(0.01);
  auto created = c.CreateVariables({kernel, bias, steps, lr});
  if (!created.ok()) return Failed("create", created.status());
  for (const auto& w : created->front().warnings) std::cout << "  warning: " << w << "\n";
  for (const auto& v : *created) {
    std::cout << "  " << v.spec.name << " " << repvar::DTypeName(v.spec.dtype)
              << Shape(v.spec.shape) << (v.created ? " created" : " already existed") << "\n";
  }
  auto init = c.Initialize(kNames);
  if (!init.ok()) return Failed("initialize", init.status());
  for (const auto& r : *init) {
    std::cout << "  initialize " << r.name << ": "
              << (r.initialized_now ? "initialized now" : "was already initialized") << ", version "
              << r.version << "\n";
  }
  return absl::OkStatus();
}

// Rounds of cross-replica updates; AssignAdd answers with the new value,
// as the seed's assign_add does.
absl::StatusOr<Expected> Update(repvar::Client& c, int rounds) {
  std::cout << "\n== " << rounds << " rounds of cross-replica updates\n";
  auto bias0 = c.Read("model/dense/bias");
  auto step0 = c.Read("model/global_step");
  if (!bias0.ok()) return Failed("read bias", bias0.status());
  if (!step0.ok()) return Failed("read step", step0.status());
  Expected e;
  e.bias.assign(bias0->as<float>().begin(), bias0->as<float>().end());
  e.step = step0->as<int64_t>()[0];
  for (int r = 0; r < rounds; ++r) {
    std::vector<float> delta = {0.5f, -0.25f, 0.125f};
    auto a = c.AssignAdd("model/dense/bias", std::span<const float>(delta));
    if (!a.ok()) return Failed("assign_add bias", a.status());
    for (int i = 0; i < 3; ++i) e.bias[i] += delta[i];
    for (int i = 0; i < 12; ++i) e.kernel[i] = static_cast<float>(r * 12 + i) / 8.0f;
    auto k = c.Assign("model/dense/kernel", std::span<const float>(e.kernel));
    if (!k.ok()) return Failed("assign kernel", k.status());
    std::vector<int64_t> one = {1};
    auto s = c.AssignAdd("model/global_step", std::span<const int64_t>(one));
    if (!s.ok()) return Failed("assign_add step", s.status());
    ++e.step;
    std::cout << "  round " << r << ": bias v" << a->version << " = ["
              << absl::StrJoin(a->value->as<float>(), ", ") << "], kernel v" << k->version
              << ", global_step v" << s->version << " = " << s->value->as<int64_t>()[0] << "\n";
  }
  std::vector<float> lr_delta = {0.005f};
  auto lr = c.AssignSub("model/optimizer/learning_rate", std::span<const float>(lr_delta));
  if (!lr.ok()) return Failed("assign_sub lr", lr.status());
  std::cout << "  learning_rate -= 0.005 -> " << lr->value->as<float>()[0] << " (version "
            << lr->version << ")\n";
  return e;
}

// Whether the cluster holds `e`, bit for bit.
absl::StatusOr<bool> ReadBack(repvar::Client& c, const Expected& e) {
  std::cout << "\n== reading back\n";
  auto values = c.ReadBatch({"model/dense/kernel", "model/dense/bias", "model/global_step"});
  if (!values.ok()) return Failed("read", values.status());
  const bool ok = std::equal(e.kernel.begin(), e.kernel.end(), (*values)[0].as<float>().begin()) &&
                  std::equal(e.bias.begin(), e.bias.end(), (*values)[1].as<float>().begin()) &&
                  (*values)[2].as<int64_t>()[0] == e.step;
  std::cout << "  bias = [" << absl::StrJoin((*values)[1].as<float>(), ", ") << "]\n";
  std::cout << "  global_step = " << (*values)[2].as<int64_t>()[0] << "\n";
  std::cout << "  values " << (ok ? "match" : "DO NOT match") << " what was written, bit for bit\n";
  return ok;
}

// Whether every replica of every variable is up to date.
absl::StatusOr<bool> ShowReplicas(repvar::Client& c) {
  std::cout << "\n== variables and their replicas\n";
  auto vars = c.ListVariables();
  if (!vars.ok()) return Failed("list", vars.status());
  bool all_up_to_date = true;
  for (const auto& v : *vars) {
    std::cout << "  " << v.spec.name << " " << repvar::DTypeName(v.spec.dtype)
              << Shape(v.spec.shape) << " version " << v.version << " collections ["
              << absl::StrJoin(v.collections, ", ") << "]\n";
    for (const auto& r : v.replicas) {
      std::cout << "    " << r.name << " on " << r.device << "  v" << r.version << " "
                << repvar::ReplicaStateName(r.state) << "\n";
      all_up_to_date &= r.state == repvar::ReplicaState::kUpToDate;
    }
  }
  return all_up_to_date;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto client = repvar::Client::Connect({.coordinator_address = absl::GetFlag(FLAGS_coordinator)});
  if (!client.ok()) return Fail("connect", client.status());
  repvar::Client& c = **client;
  auto topo = ShowTopology(c);
  if (!topo.ok()) return Fail("topology", topo.status());
  int32_t replicas = absl::GetFlag(FLAGS_replicas);
  if (replicas <= 0) replicas = static_cast<int32_t>(topo->accelerators.size());
  if (absl::Status s = CreateModel(c, replicas); !s.ok()) return Fail("the model", s);
  auto expected = Update(c, absl::GetFlag(FLAGS_rounds));
  if (!expected.ok()) return Fail("the updates", expected.status());
  auto matches = ReadBack(c, *expected);
  if (!matches.ok()) return Fail("reading back", matches.status());
  auto up_to_date = ShowReplicas(c);
  if (!up_to_date.ok()) return Fail("listing", up_to_date.status());
  const bool ok = *matches && *up_to_date;
  std::cout << "\n" << (ok ? "OK" : "FAILED") << ": every replica holds the committed version\n";
  return ok ? 0 : 1;
}

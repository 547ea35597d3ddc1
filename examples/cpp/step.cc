// SPDX-License-Identifier: Apache-2.0
// One replicated step from C++, as trainers run it: one trainer per
// accelerator host, each naming its own host's worker and touching only the
// replicas on that host. Threads here; in a job, one process on each host.
// "model/b" is MEAN-aggregated: every trainer writes its own update and the
// step commits begin + mean(update - begin) on every replica. Run with
// $REPVAR_COORDINATOR_ADDRESS (and, on a TLS cluster, $REPVAR_TLS_CA and
// $REPVAR_TOKEN_FILE) set. The same variable as examples/python/quickstart.py.
#include "repvar/step.h"

#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "repvar/client.h"

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

// One trainer: its own client, the host it runs on ("job:task").
absl::Status Train(int64_t step, const std::string& host) {
  auto client = repvar::Client::Connect({});
  if (!client.ok()) return client.status();
  auto scope = repvar::StepScope::Begin(**client, step, {.worker = host});  // this trainer's host
  if (!scope.ok()) return scope.status();
  auto local = (*scope)->LocalReplicas("model/b");  // the replicas on this host
  if (!local.ok()) return local.status();
  for (int32_t r : *local) {
    auto b = (*scope)->Read("model/b", r);  // this step's view of replica r
    if (!b.ok()) return b.status();
    std::vector<float> new_value(b->as<float>().begin(), b->as<float>().end());
    for (float& x : new_value) x -= 0.1f * static_cast<float>(r + 1);  // a made-up gradient
    auto written = (*scope)->Write<float>("model/b", r, new_value);    // a step-local copy
    if (!written.ok()) return written;
  }
  auto result = (*scope)->Commit();  // the same resolution for every trainer
  // a scope destroyed without Commit aborts the step: replicas stay as committed
  return result.status();
}

int main() {
  auto client = repvar::Client::Connect({});
  if (!client.ok()) return Fail(client.status());
  repvar::Client& c = **client;
  auto topology = c.WaitForTopology(absl::Seconds(60));
  if (!topology.ok()) return Fail(topology.status());
  std::set<std::string> hosts;  // the tasks that own accelerators
  for (const auto& a : topology->accelerators) hosts.insert(a.job + ":" + std::to_string(a.task));
  {
    repvar::ReplicatedScope scope(static_cast<int>(topology->accelerators.size()), "model");
    repvar::VariableSpec b{.name = "b", .dtype = repvar::DType::kFloat32, .shape = {1024}};
    b.aggregation = repvar::Aggregation::kMean;
    b.initializer = repvar::InitializerSpec::Zeros();
    auto created = c.CreateVariable(b);
    if (!created.ok() && !absl::IsAlreadyExists(created.status())) return Fail(created.status());
  }
  if (auto init = c.Initialize({"model/b"}); !init.ok()) return Fail(init.status());
  auto last = repvar::LastCommittedStep(c);
  if (!last.ok()) return Fail(last.status());
  const int64_t step = *last + 1;
  std::vector<absl::Status> done(hosts.size());
  std::vector<std::thread> trainers;
  int i = 0;
  for (const std::string& host : hosts) {
    trainers.emplace_back([&done, step, host, i] { done[i] = Train(step, host); });
    ++i;
  }
  for (std::thread& t : trainers) t.join();
  for (const absl::Status& s : done) {
    if (!s.ok()) return Fail(s);
  }
  auto value = c.Read("model/b");
  if (!value.ok()) return Fail(value.status());
  std::printf("step %lld committed by %zu trainers: model/b version %lld, b[0] = %g\n",
              static_cast<long long>(step), hosts.size(), static_cast<long long>(value->version),
              value->as<float>()[0]);
  return 0;
}

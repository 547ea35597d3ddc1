// SPDX-License-Identifier: Apache-2.0
// repvar-train: data-parallel training on replicated variables, the second
// workload deploy/local-cluster.sh runs.
//
// Linear regression y = X w + b on a generated data set, one shard per
// replica. Every host runs one trainer thread (as a job runs one trainer per
// host); inside each replicated step the trainer reads its host's replicas,
// computes each replica's gradient on that replica's shard, writes
// w - lr * grad to the replica's step-local copy and commits. The variables
// aggregate with MEAN, so the committed value is the full-batch SGD step and
// every replica ends bit-identical. A NONE variable ("samples seen") is kept
// in agreement; --inject_divergence=K makes one replica disagree at step K,
// and the step's resolution shows it detected and repaired from the
// majority. --runs=2 trains twice from the same start and checks the two
// results are bit-identical.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_util.h"
#include "repvar/client.h"
#include "repvar/step.h"

ABSL_FLAG(std::string, coordinator, "", "host:port (default: $REPVAR_COORDINATOR_ADDRESS)");
ABSL_FLAG(int32_t, replicas, 6, "replicas (data-parallel shards)");
ABSL_FLAG(int32_t, steps, 200, "training steps per run");
ABSL_FLAG(int32_t, runs, 2, "training runs from the same start (results must match bit for bit)");
ABSL_FLAG(int32_t, samples_per_replica, 64, "shard size");
ABSL_FLAG(double, learning_rate, 0.1, "SGD learning rate");
ABSL_FLAG(int32_t, inject_divergence, -1, "make replica R-1 disagree at this step (-1: never)");
ABSL_FLAG(std::string, prefix, "train", "variable name prefix");
ABSL_FLAG(absl::Duration, wait, absl::Seconds(60), "how long to wait for the cluster to form");

namespace {

constexpr int kFeatures = 8;

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "train: %s failed: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

struct Data {
  std::vector<float> x;  // samples x kFeatures
  std::vector<float> y;
  std::vector<float> true_w;
  float true_b = 0.5f;
};

Data Generate(int samples) {
  Data d;
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int j = 0; j < kFeatures; ++j) d.true_w.push_back(static_cast<float>(j + 1) / kFeatures);
  for (int i = 0; i < samples; ++i) {
    float y = d.true_b;
    for (int j = 0; j < kFeatures; ++j) {
      float v = u(rng);
      d.x.push_back(v);
      y += v * d.true_w[j];
    }
    d.y.push_back(y + 0.01f * u(rng));
  }
  return d;
}

// Mean squared error of (w, b) on samples [begin, end).
double Loss(const Data& d, const std::vector<float>& w, float b, int begin, int end) {
  double sum = 0;
  for (int i = begin; i < end; ++i) {
    double p = b;
    for (int j = 0; j < kFeatures; ++j) p += d.x[i * kFeatures + j] * w[j];
    sum += (p - d.y[i]) * (p - d.y[i]);
  }
  return sum / (end - begin);
}

// One SGD step on samples [begin, end): returns (w', b').
std::pair<std::vector<float>, float> Sgd(const Data& d, const std::vector<float>& w, float b,
                                         int begin, int end, float lr) {
  std::vector<float> gw(kFeatures, 0.0f);
  float gb = 0;
  for (int i = begin; i < end; ++i) {
    float p = b;
    for (int j = 0; j < kFeatures; ++j) p += d.x[i * kFeatures + j] * w[j];
    float e = 2.0f * (p - d.y[i]) / static_cast<float>(end - begin);
    for (int j = 0; j < kFeatures; ++j) gw[j] += e * d.x[i * kFeatures + j];
    gb += e;
  }
  std::vector<float> nw(kFeatures);
  for (int j = 0; j < kFeatures; ++j) nw[j] = w[j] - lr * gw[j];
  return {nw, b - lr * gb};
}

std::vector<float> Floats(const repvar::TensorValue& v) {
  std::vector<float> out(v.bytes.size() / sizeof(float));
  std::memcpy(out.data(), v.bytes.data(), v.bytes.size());
  return out;
}

// What every step of the job needs.
struct Job {
  repvar::Client& c;
  const Data& data;
  int replicas = 0;
  int shard = 0;
  float lr = 0;
  std::string w, b, seen;          // the variables' names
  std::vector<std::string> hosts;  // those holding replicas: one trainer each
};

// The hosts of the first `replicas` accelerators, in ordinal order.
std::vector<std::string> HostsOf(const repvar::Topology& topo, int replicas) {
  std::vector<std::string> hosts;
  for (int i = 0; i < replicas && i < static_cast<int>(topo.accelerators.size()); ++i) {
    std::string h = absl::StrCat(topo.accelerators[i].job, ":", topo.accelerators[i].task);
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  return hosts;
}

absl::Status CreateModel(Job& job) {
  repvar::ReplicatedScope scope(job.replicas);
  std::vector<repvar::VariableSpec> specs(3);
  specs[0] = {.name = job.w, .dtype = repvar::DType::kFloat32, .shape = {kFeatures}};
  specs[0].aggregation = repvar::Aggregation::kMean;
  specs[1] = {.name = job.b, .dtype = repvar::DType::kFloat32, .shape = {1}};
  specs[1].aggregation = repvar::Aggregation::kMean;
  specs[2] = {.name = job.seen, .dtype = repvar::DType::kFloat32, .trainable = false};
  specs[2].aggregation = repvar::Aggregation::kNone;
  for (auto& spec : specs) spec.initializer = repvar::InitializerSpec::Zeros();
  if (auto created = job.c.CreateVariables(specs); !created.ok()) return created.status();
  return job.c.Initialize({job.w, job.b, job.seen}).status();
}

// One trainer's part of `step` on `host`: each local replica's SGD step on
// its shard, then the commit. `inject`: the last replica's "samples seen"
// goes wrong.
absl::StatusOr<repvar::StepResult> TrainOnHost(const Job& job, int64_t step,
                                               const std::string& host, bool inject) {
  auto scope = repvar::StepScope::Begin(job.c, step, {.worker = host});
  if (!scope.ok()) return scope.status();
  repvar::StepScope& s = **scope;
  auto local = s.LocalReplicas(job.w);
  if (!local.ok()) return local.status();
  for (int32_t r : *local) {
    auto w = s.Read(job.w, r);
    auto b = s.Read(job.b, r);
    auto seen = s.Read(job.seen, r);
    if (!w.ok() || !b.ok() || !seen.ok()) {
      return !w.ok() ? w.status() : !b.ok() ? b.status() : seen.status();
    }
    auto [nw, nb] =
        Sgd(job.data, Floats(*w), Floats(*b)[0], r * job.shard, (r + 1) * job.shard, job.lr);
    float nseen = Floats(*seen)[0] + static_cast<float>(job.replicas * job.shard);
    if (inject && r == job.replicas - 1) nseen += 1000;  // a replica gone wrong
    REPVAR_RETURN_IF_ERROR(s.WriteBatch({{job.w, r, std::as_bytes(std::span(nw))},
                                         {job.b, r, std::as_bytes(std::span(&nb, 1))},
                                         {job.seen, r, std::as_bytes(std::span(&nseen, 1))}}));
  }
  return s.Commit();
}

// `step` on every host at once, one trainer thread each; prints the
// divergences the resolution repaired and returns how many.
absl::StatusOr<int> RunStep(const Job& job, int64_t step, bool inject) {
  std::vector<absl::StatusOr<repvar::StepResult>> results(job.hosts.size(),
                                                          absl::UnknownError("not run"));
  std::vector<std::thread> trainers;
  for (size_t h = 0; h < job.hosts.size(); ++h) {
    trainers.emplace_back([&, h] { results[h] = TrainOnHost(job, step, job.hosts[h], inject); });
  }
  for (std::thread& t : trainers) t.join();
  for (auto& r : results) {
    if (!r.ok()) return r.status();
  }
  for (const repvar::StepDivergence& d : results[0]->divergences) {
    std::cout << "   step " << step << ": DIVERGENCE in " << d.variable << ": replicas";
    for (size_t i = 0; i < d.replica_checksums.size(); ++i) {
      std::cout << absl::StrFormat(" %d=%016x", i, d.replica_checksums[i]);
    }
    std::cout << "; majority " << absl::StrFormat("%016x", d.chosen_checksum)
              << " repaired into replica(s)";
    for (int32_t r : d.repaired) std::cout << " " << r;
    std::cout << "\n";
  }
  return static_cast<int>(results[0]->divergences.size());
}

// The full-batch loss after `step`, published for the web view's curve.
absl::Status PublishLoss(const Job& job, int64_t step, int k) {
  auto w = job.c.Read(job.w);
  auto b = job.c.Read(job.b);
  if (!w.ok() || !b.ok()) return !w.ok() ? w.status() : b.status();
  const double loss = Loss(job.data, Floats(*w), Floats(*b)[0], 0, job.replicas * job.shard);
  REPVAR_RETURN_IF_ERROR(job.c.PublishScalar("train/loss", step, loss));
  if (k == 1 || k % 20 == 0) {
    std::cout << absl::StrFormat("   step %4d  loss %.6f  (w version %d)\n", step, loss,
                                 w->version);
  }
  return absl::OkStatus();
}

// Every replica of w holds the committed bits: returns them.
absl::StatusOr<std::vector<std::byte>> CheckReplicas(const Job& job) {
  REPVAR_ASSIGN_OR_RETURN(repvar::VariableInfo info, job.c.GetVariable(job.w));
  for (const repvar::ReplicaInfo& r : info.replicas) {
    if (r.checksum != info.checksum || r.state != repvar::ReplicaState::kUpToDate) {
      return absl::DataLossError(absl::StrCat(r.name, " differs from the committed value"));
    }
  }
  REPVAR_ASSIGN_OR_RETURN(repvar::TensorValue w, job.c.Read(job.w));
  std::cout << absl::StrFormat("   all %d replicas of %s bit-identical (checksum %016x)\n",
                               info.replicas.size(), job.w, info.checksum);
  std::cout << "   learned w:";
  for (float x : Floats(w)) std::cout << absl::StrFormat(" %.3f", x);
  std::cout << "\n   true    w:";
  for (float x : job.data.true_w) std::cout << absl::StrFormat(" %.3f", x);
  std::cout << "\n";
  return w.bytes;
}

// One run from the same start: its final weights.
absl::StatusOr<std::vector<std::byte>> Train(const Job& job, int run, int64_t* next_step,
                                             int* divergences) {
  // Every run starts from the same values (a cross-replica write).
  const std::vector<float> w0(kFeatures, 0.0f);
  const float zero = 0.0f;
  REPVAR_RETURN_IF_ERROR(
      job.c
          .AssignBatch({{job.w, repvar::AssignOp::kAssign, std::as_bytes(std::span(w0))},
                        {job.b, repvar::AssignOp::kAssign, std::as_bytes(std::span(&zero, 1))},
                        {job.seen, repvar::AssignOp::kAssign, std::as_bytes(std::span(&zero, 1))}})
          .status());
  const int steps = absl::GetFlag(FLAGS_steps);
  std::cout << "\n-- run " << run + 1 << " (steps " << *next_step << ".." << *next_step + steps - 1
            << ")\n";
  const absl::Time started = absl::Now();
  for (int k = 1; k <= steps; ++k, ++*next_step) {
    const bool inject = run == 0 && k == absl::GetFlag(FLAGS_inject_divergence);
    REPVAR_ASSIGN_OR_RETURN(const int diverged, RunStep(job, *next_step, inject));
    *divergences += diverged;
    if (k == 1 || k % 5 == 0) REPVAR_RETURN_IF_ERROR(PublishLoss(job, *next_step, k));
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - started);
  std::cout << absl::StrFormat("   %d steps in %.2f s (%.1f steps/s)\n", steps, secs, steps / secs);
  return CheckReplicas(job);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto client = repvar::Client::Connect({.coordinator_address = absl::GetFlag(FLAGS_coordinator)});
  if (!client.ok()) return Fail("connect", client.status());
  auto topo = (*client)->WaitForTopology(absl::GetFlag(FLAGS_wait));
  if (!topo.ok()) return Fail("wait for topology", topo.status());
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  const int replicas = absl::GetFlag(FLAGS_replicas);
  const Data data = Generate(replicas * absl::GetFlag(FLAGS_samples_per_replica));
  Job job{**client,
          data,
          replicas,
          absl::GetFlag(FLAGS_samples_per_replica),
          static_cast<float>(absl::GetFlag(FLAGS_learning_rate)),
          prefix + "/w",
          prefix + "/b",
          prefix + "/seen",
          HostsOf(*topo, replicas)};
  std::cout << "== data-parallel linear regression: " << replicas << " replicas on "
            << job.hosts.size() << " hosts, " << job.shard
            << " samples per replica, MEAN aggregation\n";
  if (absl::Status s = CreateModel(job); !s.ok()) return Fail("create", s);
  auto last = repvar::LastCommittedStep(job.c);
  if (!last.ok()) return Fail("last committed step", last.status());
  int64_t next_step = *last + 1;
  int divergences = 0;
  std::vector<std::vector<std::byte>> finals;
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    auto w = Train(job, run, &next_step, &divergences);
    if (!w.ok()) return Fail(absl::StrCat("run ", run + 1), w.status());
    finals.push_back(*std::move(w));
  }
  for (size_t i = 1; i < finals.size(); ++i) {
    if (finals[i] != finals[0]) {
      return Fail("run-to-run check", absl::DataLossError("runs ended with different weights"));
    }
  }
  if (finals.size() > 1) std::cout << "\nthe " << finals.size() << " runs are bit-identical\n";
  if (absl::GetFlag(FLAGS_inject_divergence) > 0 && divergences == 0) {
    return Fail("divergence check", absl::InternalError("the injected divergence was not seen"));
  }
  return 0;
}

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
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto client = repvar::Client::Connect({.coordinator_address = absl::GetFlag(FLAGS_coordinator)});
  if (!client.ok()) return Fail("connect", client.status());
  repvar::Client& c = **client;
  auto topo = c.WaitForTopology(absl::GetFlag(FLAGS_wait));
  if (!topo.ok()) return Fail("wait for topology", topo.status());

  const int replicas = absl::GetFlag(FLAGS_replicas);
  const int shard = absl::GetFlag(FLAGS_samples_per_replica);
  const float lr = static_cast<float>(absl::GetFlag(FLAGS_learning_rate));
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  const std::string w_name = prefix + "/w", b_name = prefix + "/b", seen_name = prefix + "/seen";
  Data data = Generate(replicas * shard);

  // The hosts that hold the replicas: one trainer per host.
  std::vector<std::string> hosts;
  for (int i = 0; i < replicas && i < static_cast<int>(topo->accelerators.size()); ++i) {
    std::string h = absl::StrCat(topo->accelerators[i].job, ":", topo->accelerators[i].task);
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  std::cout << "== data-parallel linear regression: " << replicas << " replicas on " << hosts.size()
            << " hosts, " << shard << " samples per replica, MEAN aggregation\n";

  std::vector<float> w0(kFeatures, 0.0f);
  float b0 = 0.0f, seen0 = 0.0f;
  {
    repvar::ReplicatedScope scope(replicas);
    std::vector<repvar::VariableSpec> specs(3);
    specs[0] = {.name = w_name, .dtype = repvar::DType::kFloat32, .shape = {kFeatures}};
    specs[0].aggregation = repvar::Aggregation::kMean;
    specs[0].initializer = repvar::InitializerSpec::Zeros();
    specs[1] = {.name = b_name, .dtype = repvar::DType::kFloat32, .shape = {1}};
    specs[1].aggregation = repvar::Aggregation::kMean;
    specs[1].initializer = repvar::InitializerSpec::Zeros();
    specs[2] = {.name = seen_name, .dtype = repvar::DType::kFloat32, .trainable = false};
    specs[2].aggregation = repvar::Aggregation::kNone;
    specs[2].initializer = repvar::InitializerSpec::Zeros();
    auto created = c.CreateVariables(specs);
    if (!created.ok()) return Fail("create", created.status());
  }
  if (auto s = c.Initialize({w_name, b_name, seen_name}); !s.ok())
    return Fail("initialize", s.status());

  auto last = repvar::LastCommittedStep(c);
  if (!last.ok()) return Fail("last committed step", last.status());
  int64_t next_step = *last + 1;
  std::vector<std::vector<std::byte>> finals;
  int divergences_seen = 0;

  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    // Every run starts from the same values (a cross-replica write).
    if (auto s = c.AssignBatch(
            {{w_name, repvar::AssignOp::kAssign, std::as_bytes(std::span(w0))},
             {b_name, repvar::AssignOp::kAssign, std::as_bytes(std::span(&b0, 1))},
             {seen_name, repvar::AssignOp::kAssign, std::as_bytes(std::span(&seen0, 1))}});
        !s.ok()) {
      return Fail("reset", s.status());
    }
    std::cout << "\n-- run " << run + 1 << " (steps " << next_step << ".."
              << next_step + absl::GetFlag(FLAGS_steps) - 1 << ")\n";
    absl::Time started = absl::Now();
    for (int k = 1; k <= absl::GetFlag(FLAGS_steps); ++k, ++next_step) {
      const int64_t step = next_step;
      const bool inject = run == 0 && k == absl::GetFlag(FLAGS_inject_divergence);
      std::vector<absl::StatusOr<repvar::StepResult>> results(hosts.size(),
                                                              absl::UnknownError("not run"));
      std::vector<std::thread> trainers;
      for (size_t h = 0; h < hosts.size(); ++h) {
        trainers.emplace_back([&, h] {
          auto scope = repvar::StepScope::Begin(c, step, {.worker = hosts[h]});
          if (!scope.ok()) {
            results[h] = scope.status();
            return;
          }
          repvar::StepScope& s = **scope;
          auto local = s.LocalReplicas(w_name);
          if (!local.ok()) {
            results[h] = local.status();
            return;
          }
          for (int32_t r : *local) {
            auto w = s.Read(w_name, r);
            auto b = s.Read(b_name, r);
            auto seen = s.Read(seen_name, r);
            if (!w.ok() || !b.ok() || !seen.ok()) {
              results[h] = !w.ok() ? w.status() : !b.ok() ? b.status() : seen.status();
              return;
            }
            auto [nw, nb] = Sgd(data, Floats(*w), Floats(*b)[0], r * shard, (r + 1) * shard, lr);
            float nseen = Floats(*seen)[0] + static_cast<float>(replicas * shard);
            if (inject && r == replicas - 1) nseen += 1000;  // a replica gone wrong
            absl::Status st = s.WriteBatch({{w_name, r, std::as_bytes(std::span(nw))},
                                            {b_name, r, std::as_bytes(std::span(&nb, 1))},
                                            {seen_name, r, std::as_bytes(std::span(&nseen, 1))}});
            if (!st.ok()) {
              results[h] = st;
              return;
            }
          }
          results[h] = s.Commit();
        });
      }
      for (std::thread& t : trainers) t.join();
      for (auto& r : results) {
        if (!r.ok()) return Fail(absl::StrCat("step ", step), r.status());
      }
      for (const repvar::StepDivergence& d : results[0]->divergences) {
        ++divergences_seen;
        std::cout << "   step " << step << ": DIVERGENCE in " << d.variable << ": replicas";
        for (size_t i = 0; i < d.replica_checksums.size(); ++i) {
          std::cout << absl::StrFormat(" %d=%016x", i, d.replica_checksums[i]);
        }
        std::cout << "; majority " << absl::StrFormat("%016x", d.chosen_checksum)
                  << " repaired into replica(s)";
        for (int32_t r : d.repaired) std::cout << " " << r;
        std::cout << "\n";
      }
      if (k == 1 || k % 5 == 0) {
        auto w = c.Read(w_name);
        auto b = c.Read(b_name);
        if (!w.ok() || !b.ok()) return Fail("read", !w.ok() ? w.status() : b.status());
        const double loss = Loss(data, Floats(*w), Floats(*b)[0], 0, replicas * shard);
        // The coordinator's web view draws it.
        if (absl::Status s = c.PublishScalar("train/loss", step, loss); !s.ok()) {
          return Fail("publish the loss", s);
        }
        if (k == 1 || k % 20 == 0) {
          std::cout << absl::StrFormat("   step %4d  loss %.6f  (w version %d)\n", step, loss,
                                       w->version);
        }
      }
    }
    double secs = absl::ToDoubleSeconds(absl::Now() - started);
    std::cout << absl::StrFormat("   %d steps in %.2f s (%.1f steps/s)\n",
                                 absl::GetFlag(FLAGS_steps), secs,
                                 absl::GetFlag(FLAGS_steps) / secs);

    // Every replica must hold the same bits.
    auto info = c.GetVariable(w_name);
    if (!info.ok()) return Fail("get variable", info.status());
    for (const repvar::ReplicaInfo& r : info->replicas) {
      if (r.checksum != info->checksum || r.state != repvar::ReplicaState::kUpToDate) {
        return Fail("replica check",
                    absl::DataLossError(absl::StrCat(r.name, " differs from the committed value")));
      }
    }
    auto w = c.Read(w_name);
    if (!w.ok()) return Fail("read", w.status());
    std::cout << absl::StrFormat("   all %d replicas of %s bit-identical (checksum %016x)\n",
                                 info->replicas.size(), w_name, info->checksum);
    std::vector<float> fw = Floats(*w);
    std::cout << "   learned w:";
    for (float x : fw) std::cout << absl::StrFormat(" %.3f", x);
    std::cout << "\n   true    w:";
    for (float x : data.true_w) std::cout << absl::StrFormat(" %.3f", x);
    std::cout << "\n";
    finals.push_back(w->bytes);
  }
  for (size_t i = 1; i < finals.size(); ++i) {
    if (finals[i] != finals[0]) {
      return Fail("run-to-run check", absl::DataLossError("runs ended with different weights"));
    }
  }
  if (finals.size() > 1) std::cout << "\nthe " << finals.size() << " runs are bit-identical\n";
  if (absl::GetFlag(FLAGS_inject_divergence) > 0 && divergences_seen == 0) {
    return Fail("divergence check", absl::InternalError("the injected divergence was not seen"));
  }
  return 0;
}

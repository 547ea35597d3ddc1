// SPDX-License-Identifier: Apache-2.0
// A worker's own share of a batched initialize, without the network: ROUNDS
// batches of 1,000 new float32[16] variables, each applied to one store the
// way WriteSmallReplicas applies them (ApplySmallWrites), as the batch
// figures of repvar_bench send them to each worker. Prints the median and
// the worst CPU time of one batch on this thread, so that a change to the
// worker's per-write cost can be told from the VM's noise. With `shared`,
// the writes share one value, as a batch initialized alike sends them
// (WriteSmallReplicasRequest.value_index); without, each has its own.
//   worker_apply [ROUNDS] [shared]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/core/replica_store.h"
#include "worker/core/write_sessions.h"

namespace {

double ThreadCpuUs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 250;
  const bool shared = argc > 2 && std::string_view(argv[2]) == "shared";
  constexpr int kWrites = 1000;
  repvar::TuneMallocForBulkTransfers();  // as the daemons run
  const repvar::TensorSpec spec{repvar::DType::kFloat32, {16}};
  std::vector<std::byte> value(64, std::byte{0});
  std::fill_n(reinterpret_cast<float*>(value.data()), 16, 1.0f);
  const uint64_t checksum = repvar::Checksum(value);
  repvar::worker::ReplicaStore store;
  std::vector<double> cpu;
  uint64_t id = 0;
  for (int round = 0; round < rounds; ++round) {
    // The writes as SmallWritesFromProto hands them over (not timed).
    repvar::SmallReplicaWrites writes;
    writes.incarnation = 1;
    writes.specs.push_back(spec);
    for (int i = 0; i < kWrites; ++i) {
      repvar::ReplicaWrite w;
      w.variable_id = ++id;
      w.name = absl::StrCat("batch/", round, "/", i);
      w.version = 1;
      w.replicas = {0};
      w.fence = 1;
      writes.items.push_back(
          {std::move(w), 0, checksum, shared ? 0 : static_cast<size_t>(i), value});
    }
    const double t0 = ThreadCpuUs();
    auto applied = repvar::worker::ApplySmallWrites(1, std::move(writes), &store, nullptr);
    cpu.push_back(ThreadCpuUs() - t0);
    if (!applied.ok()) {
      std::fprintf(stderr, "apply: %s\n", applied.status().ToString().c_str());
      return 1;
    }
  }
  std::vector<double> sorted = cpu;
  std::sort(sorted.begin(), sorted.end());
  double total = 0;
  for (double c : cpu) total += c;
  std::printf(
      "worker_apply writes=%d shared=%d rounds=%d cpu_p50_us=%.0f cpu_max_us=%.0f "
      "cpu_total_ms=%.1f\n",
      kWrites, shared ? 1 : 0, rounds, sorted[sorted.size() / 2], sorted.back(), total / 1e3);
  return 0;
}

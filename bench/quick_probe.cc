#include <chrono>
#include <iostream>
#include "repvar/client.h"
#include "tests/testing/cluster.h"
int main(int argc, char** argv) {
  int workers = argc > 1 ? atoi(argv[1]) : 2;
  int64_t mib = argc > 2 ? atoi(argv[2]) : 256;
  repvar::testing::TestCluster cluster({.tpu_workers = workers, .tpu_per_worker = 1, .cpu_host = false});
  if (!cluster.Start().ok()) return 1;
  auto c = *repvar::Client::Connect({.coordinator_address = cluster.address()});
  c->WaitForTopology(absl::Seconds(20)).IgnoreError();
  int64_t n = mib << 18;
  c->CreateVariable({.name = "x", .dtype = repvar::DType::kFloat32, .shape = {n}, .replica_count = workers}).IgnoreError();
  std::vector<float> v(n, 1.0f);
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto ack = c->Assign("x", std::span<const float>(v));
    auto t1 = std::chrono::steady_clock::now();
    auto r = c->Read("x");
    auto t2 = std::chrono::steady_clock::now();
    std::cout << "assign " << std::chrono::duration<double, std::milli>(t1 - t0).count() << " ms, read "
              << std::chrono::duration<double, std::milli>(t2 - t1).count() << " ms " << ack.ok() << r.ok() << "\n";
  }
}

// SPDX-License-Identifier: Apache-2.0
// A replicated variable from C++, against an installed repvar: create it with
// one replica per accelerator, initialize it once, add to every replica,
// read it back. Build: see CMakeLists.txt here (find_package) or
//   g++ quickstart.cc $(pkg-config --cflags --libs repvar)
// Run with $REPVAR_COORDINATOR_ADDRESS (and, on a TLS cluster,
// $REPVAR_TLS_CA and $REPVAR_TOKEN_FILE) set.
#include <cstdio>
#include <vector>

#include "repvar/client.h"

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

int main() {
  auto client = repvar::Client::Connect({});  // or {.coordinator_address = "host:port"}
  if (!client.ok()) return Fail(client.status());
  repvar::Client& c = **client;
  auto topology = c.WaitForTopology(absl::Seconds(60));  // every expected worker
  if (!topology.ok()) return Fail(topology.status());
  const int replicas = static_cast<int>(topology->accelerators.size());
  {
    repvar::ReplicatedScope scope(replicas, "model");  // replica count and name prefix
    repvar::VariableSpec w{.name = "w", .dtype = repvar::DType::kFloat32, .shape = {256, 256}};
    w.initializer = repvar::InitializerSpec::RandomNormal(0, 0.02, /*seed=*/1);
    auto created = c.CreateVariable(w);  // "model/w": replicas model/w/0.. on ordinals 0..
    if (!created.ok() && !absl::IsAlreadyExists(created.status())) return Fail(created.status());
  }
  // The first caller's initialize generates the value once and sends it to
  // every replica; later callers find it initialized.
  if (auto init = c.Initialize({"model/w"}); !init.ok()) return Fail(init.status());
  std::vector<float> delta(256 * 256, 0.5f);
  auto added = c.AssignAdd("model/w", std::span<const float>(delta));  // every replica
  if (!added.ok()) return Fail(added.status());
  auto value = c.Read("model/w");  // the last committed value and its version
  if (!value.ok()) return Fail(value.status());
  std::vector<float> weights(256 * 256);  // or a framework's own parameter memory
  auto into = c.ReadInto("model/w", std::as_writable_bytes(std::span<float>(weights)));
  if (!into.ok()) return Fail(into.status());
  std::printf("model/w: %d replicas, version %lld, w[0] = %f (read into: version %lld, %f)\n",
              replicas, static_cast<long long>(value->version), value->as<float>()[0],
              static_cast<long long>(into->version), weights[0]);
  return 0;
}

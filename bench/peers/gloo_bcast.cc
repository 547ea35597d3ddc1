// SPDX-License-Identifier: Apache-2.0
// Peer: a bare gloo broadcast (and ring allreduce) of the same bytes among N
// processes on loopback, FileStore rendezvous, resident buffers. Prints, on
// rank 0 (the root, timed as in ../shared/bench-peers), the median of ITERS
// broadcasts and ring allreduces per size.
//   gloo_bcast RANK SIZE STORE_DIR MIB[,MIB...] ITERS
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 6) return 2;
  int rank = std::atoi(argv[1]);
  int size = std::atoi(argv[2]);
  std::vector<size_t> mibs;
  std::stringstream ss(argv[4]);
  for (std::string s; std::getline(ss, s, ',');) mibs.push_back(std::stoul(s));
  int iters = std::atoi(argv[5]);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(store, dev);
  for (size_t mib : mibs) {
    size_t n = (mib << 20) / 4;
    std::vector<float> buf(n, rank == 0 ? 1.5f : 0.f);
    std::vector<double> bcast, allreduce;
    for (int it = 0; it < iters + 1; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      gloo::BroadcastOptions bo(ctx);
      bo.setOutput(buf.data(), n);
      bo.setRoot(0);
      gloo::broadcast(bo);
      auto t1 = std::chrono::steady_clock::now();
      gloo::AllreduceOptions ao(ctx);
      ao.setOutput(buf.data(), n);
      ao.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(ao);
      auto t2 = std::chrono::steady_clock::now();
      if (it > 0) {  // the first round warms connections and pages
        bcast.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        allreduce.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      }
    }
    std::sort(bcast.begin(), bcast.end());
    std::sort(allreduce.begin(), allreduce.end());
    if (rank == 0) {
      std::printf("gloo size=%d mib=%zu bcast_ms=%.2f allreduce_ms=%.2f\n", size, mib,
                  bcast[bcast.size() / 2], allreduce[allreduce.size() / 2]);
      std::fflush(stdout);
    }
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// Peer: a bare gloo broadcast (and ring allreduce) of the same bytes among N
// processes on loopback, FileStore rendezvous, resident buffers. Each round
// starts from a barrier and is timed on every rank until that rank holds the
// result; the round's time is the slowest rank's (the last receiver, as
// MPI's peer and repvar's assign are timed). Prints, on rank 0, the median of
// ITERS rounds per size, and the root's own time beside the broadcast's
// (what this peer printed before: the root returns once its sends are
// queued).
//   gloo_bcast RANK SIZE STORE_DIR MIB[,MIB...] ITERS
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
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

namespace {

// The largest of every rank's `ms` (each rank gets it).
double Slowest(const std::shared_ptr<gloo::Context>& ctx, double ms) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(&ms, 1);
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
  gloo::allreduce(o);
  return ms;
}

void Barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions o(ctx);
  gloo::barrier(o);
}

double Ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

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
    std::vector<double> bcast, root, allreduce;
    for (int it = 0; it < iters + 1; ++it) {
      Barrier(ctx);
      auto t0 = std::chrono::steady_clock::now();
      gloo::BroadcastOptions bo(ctx);
      bo.setOutput(buf.data(), n);
      bo.setRoot(0);
      gloo::broadcast(bo);
      const double bcast_ms = Ms(t0, std::chrono::steady_clock::now());
      const double slowest_bcast = Slowest(ctx, bcast_ms);
      Barrier(ctx);
      auto t1 = std::chrono::steady_clock::now();
      gloo::AllreduceOptions ao(ctx);
      ao.setOutput(buf.data(), n);
      ao.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(ao);
      const double slowest_allreduce = Slowest(ctx, Ms(t1, std::chrono::steady_clock::now()));
      if (it > 0) {  // the first round warms connections and pages
        bcast.push_back(slowest_bcast);
        root.push_back(bcast_ms);  // meaningful on rank 0, the root
        allreduce.push_back(slowest_allreduce);
      }
    }
    if (rank == 0) {
      std::printf("gloo size=%d mib=%zu bcast_ms=%.2f bcast_root_ms=%.2f allreduce_ms=%.2f\n", size,
                  mib, Median(bcast), Median(root), Median(allreduce));
      std::fflush(stdout);
    }
  }
  return 0;
}

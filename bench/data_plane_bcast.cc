// SPDX-License-Identifier: Apache-2.0
// The workers' data plane alone (GlooDataPlane, as repvar-worker runs it):
// SIZE processes, one per rank, broadcast MIB from rank 0, chained or by
// gloo's tree, and rank 0 prints the median over ITERS of the time until
// the last member holds the bytes. bench/netns_bcast.sh runs it in network
// namespaces joined by rate-limited links, where the algorithms part ways.
//   data_plane_bcast RANK SIZE HOST STORE_DIR MIB ITERS chain|tree
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/core/data_plane.h"

namespace {

using Clock = std::chrono::steady_clock;

// The rendezvous through files in a directory every rank sees.
class FileRendezvous final : public repvar::worker::RendezvousClient {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    const std::string path = Path(key);
    const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
    std::ofstream(tmp, std::ios::binary) << value;
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError("rename " + tmp);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const auto deadline = Clock::now() + absl::ToChronoMilliseconds(timeout);
    while (Clock::now() < deadline) {
      std::ifstream in(Path(key), std::ios::binary);
      if (in) {
        std::stringstream s;
        s << in.rdbuf();
        return s.str();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return absl::DeadlineExceededError(key);
  }

 private:
  std::string Path(const std::string& key) const {
    std::string name = key;
    std::replace(name.begin(), name.end(), '/', '_');
    return dir_ + "/" + name;
  }
  const std::string dir_;
};

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "data_plane_bcast: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: data_plane_bcast RANK SIZE HOST STORE_DIR MIB ITERS chain|tree\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  const size_t bytes = size_t{static_cast<size_t>(std::atoi(argv[5]))} << 20;
  const int iters = std::atoi(argv[6]);
  const bool chain = std::string(argv[7]) == "chain";
  repvar::worker::DataPlaneOptions options;
  options.chain_min_pieces = chain ? 0 : std::numeric_limits<size_t>::max();
  FileRendezvous store(argv[4]);
  repvar::worker::GlooDataPlane plane(argv[3], &store, options);
  std::vector<std::byte> buf(bytes, std::byte{rank == 0 ? std::byte{7} : std::byte{0}});
  std::vector<float> times(size);  // summed across ranks: each rank's own time
  uint32_t tag = 0;
  auto spec = [&] {
    return repvar::CollectiveSpec{"bench", rank, size, 0, ++tag, absl::Seconds(600)};
  };
  std::vector<double> last;
  for (int it = 0; it < iters + 1; ++it) {
    float go = 0;  // a barrier, so that every rank starts the clock together
    Check(plane.Allreduce(spec(), repvar::AccumType::kFloat32,
                          std::as_writable_bytes(std::span<float>(&go, 1))),
          "barrier");
    const auto t0 = Clock::now();
    repvar::ChecksumStream received;
    Check(plane.Broadcast(spec(), buf, &received, nullptr), "broadcast");
    std::fill(times.begin(), times.end(), 0.f);
    times[rank] = std::chrono::duration<float, std::milli>(Clock::now() - t0).count();
    Check(plane.Allreduce(spec(), repvar::AccumType::kFloat32,
                          std::as_writable_bytes(std::span<float>(times))),
          "gather times");
    if (it > 0) last.push_back(*std::max_element(times.begin(), times.end()));
  }
  std::sort(last.begin(), last.end());
  if (rank == 0) {
    std::printf("data_plane_bcast size=%d mib=%zu algo=%s last_receiver_ms=%.1f\n", size,
                bytes >> 20, chain ? "chain" : "tree", last[last.size() / 2]);
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_CORE_DATA_PLANE_H_
#define REPVAR_WORKER_CORE_DATA_PLANE_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/base/sync.h"
#include "common/model/collective.h"
#include "common/tensor/step_math.h"
#include "common/tensor/tensor.h"
#include "worker/core/coordinator_link.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace repvar::worker {

// A root's bytes that are still arriving: a broadcast may start before they
// are all there and send each part once it is.
class ArrivingBytes {
 public:
  virtual ~ArrivingBytes() = default;
  // Blocks until the bytes before `end` are in place. An error (the bytes
  // will not come) fails the broadcast.
  virtual absl::Status Await(size_t end) = 0;
};

// A SUM/MEAN step's reduction (docs/contract.md S4) in the pieces a ring works
// in: every member's contribution (the sum of its replicas' deltas), then
// begin + sum / divisor. Elements are the variables', one after the other;
// a range [lo, hi) of them is hi - lo accumulator elements in `acc` and
// `sum`.
class FoldedReduction {
 public:
  virtual ~FoldedReduction() = default;
  virtual AccumType type() const = 0;
  virtual size_t elements() const = 0;
  // Writes this member's contribution to elements [lo, hi) into `acc`.
  virtual void Contribute(size_t lo, size_t hi, std::span<std::byte> acc) = 0;
  // Applies the members' summed contributions to elements [lo, hi) into
  // result(). Errors: OUT_OF_RANGE (an integer overflows its dtype).
  virtual absl::Status Apply(size_t lo, size_t hi, std::span<const std::byte> sum) = 0;
  // The result: elements() elements of item_size() bytes.
  virtual std::span<std::byte> result() = 0;
  virtual size_t item_size() const = 0;
};

// The collectives a worker's step runs (the seam for tests).
class Collectives {
 public:
  virtual ~Collectives() = default;
  // Broadcasts `bytes` from the root to every member; on the others, fills
  // `bytes` and feeds `received` (when given) the bytes in order as they
  // arrive, so that their checksum needs no pass of its own. On the root,
  // `arriving` (when given) says how much of `bytes` is there yet. Errors:
  // UNAVAILABLE (rendezvous or transfer failed, timed out, or the root's
  // bytes did not come).
  virtual absl::Status Broadcast(const CollectiveSpec& c, std::span<std::byte> bytes,
                                 ChecksumStream* received, ArrivingBytes* arriving) = 0;
  // Sums `bytes` (elements of `type`) across the members, in place.
  virtual absl::Status Allreduce(const CollectiveSpec& c, AccumType type,
                                 std::span<std::byte> bytes) = 0;
  // Every member ends with the same result() of `r`: the members'
  // contributions summed, applied to the begin value. This one takes every
  // contribution into one buffer, Allreduces it and applies all of it
  // (what every member must do the same way for an integer dtype, whose
  // apply can fail). Errors: as Allreduce and FoldedReduction::Apply.
  virtual absl::Status ReduceApply(const CollectiveSpec& c, FoldedReduction& r);
};

// How many segments gloo's ring cuts `elements` of `element_bytes` into
// among `members`: at least two per member, at most 1 MiB each, a whole
// number per member.
size_t RingSegments(size_t elements, size_t element_bytes, size_t members);

struct DataPlaneOptions {
  // A broadcast to three members or more goes down a pipelined chain when
  // it has at least `chain_min_pieces` pieces of `piece_bytes`; a smaller
  // one goes down gloo's binomial tree. Where links are the limit the chain
  // is flat in the number of members and the tree grows with their log (the
  // root sends the value once per level); where CPUs are (one host), the
  // tree can fill faster for mid sizes. The default is for the links of a
  // cluster (bench/netns_bcast.sh measures both).
  size_t piece_bytes = 4 << 20;
  size_t chain_min_pieces = 2;
  // The chain cuts a value into about `chain_pieces` pieces, each between
  // `min_piece_bytes` and `piece_bytes` (ChainPiece): down a chain of M
  // members the last one holds the value after (pieces + M - 2) piece
  // times, where one link takes `pieces` of them, so T(M)/T(2) is about
  // 1 + (M - 2) / pieces: more pieces, a flatter chain, until a piece is
  // too small to keep a link busy.
  size_t chain_pieces = 64;
  size_t min_piece_bytes = 256 << 10;
  // A folded reduction whose sums take at most this many bytes goes down a
  // binomial tree (2 x log2(P) rounds) instead of the ring (2 x 2P rounds),
  // where each round's latency, not the bytes, is the cost: a step of
  // 1,000 float32[16] variables among 32 workers, 64 KiB of sums, took
  // 128 ring rounds of 1 KiB each.
  size_t tree_max_bytes = 256 << 10;
};

// Bulk bytes between workers over gloo (TCP transport). Holds one gloo
// context, for the current group; a collective naming another group builds a
// new one (rendezvous under "<group>/" in the coordinator's store), and any
// gloo error drops the context, since gloo leaves it unusable. gloo throws:
// this class is the only place that catches. Collectives run one at a time.
class GlooDataPlane final : public Collectives {
 public:
  // `hostname`: the address other workers reach this one at.
  GlooDataPlane(std::string hostname, RendezvousClient* store, DataPlaneOptions options = {});
  ~GlooDataPlane();

  // A pipelined chain from the root (ChainBroadcast in data_plane.cc), or
  // gloo's binomial tree for a piece or so (DataPlaneOptions).
  absl::Status Broadcast(const CollectiveSpec& c, std::span<std::byte> bytes,
                         ChecksumStream* received, ArrivingBytes* arriving) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a broadcast of `bytes` among `members` goes down the chain.
  bool Chained(size_t bytes, int members) const;
  // The size of the pieces the chain cuts `bytes` into (DataPlaneOptions).
  size_t ChainPiece(size_t bytes) const;
  // A ring allreduce (sum). A group of one is a no-op.
  absl::Status Allreduce(const CollectiveSpec& c, AccumType type,
                         std::span<std::byte> bytes) override ABSL_LOCKS_EXCLUDED(mu_);
  // For floating-point variables, the reduction folded into a ring
  // (FoldedRing in data_plane.cc): each contribution computed piece by
  // piece as the reduce-scatter sends or adds it (no pass of its own), each
  // member applying the sums of its own 1/size of the elements, and the
  // applied values gathered around the ring into every member's result. The
  // same bits as Allreduce then Apply: the sums are added in the order
  // gloo's ring adds them. A small one goes down a binomial tree instead
  // (FoldedTree; Tree()): member 0 applies the sums, added in the tree's
  // fixed order, and every member gets its bits. Integer dtypes take
  // Collectives::ReduceApply.
  absl::Status ReduceApply(const CollectiveSpec& c, FoldedReduction& r) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a folded reduction whose sums take `sum_bytes` goes down the
  // tree rather than the ring.
  bool Tree(size_t sum_bytes) const;

 private:
  absl::StatusOr<std::shared_ptr<gloo::Context>> ContextFor(const CollectiveSpec& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After gloo threw `e` in `what`: drops the context, which gloo leaves
  // unusable (the next collective builds another), and says what failed.
  absl::Status Dropped(const CollectiveSpec& c, absl::string_view what, const std::exception& e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string hostname_;
  RendezvousClient* const store_;
  const DataPlaneOptions options_;
  Mutex mu_;
  std::shared_ptr<gloo::transport::Device> device_ ABSL_GUARDED_BY(mu_);
  std::string group_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<gloo::Context> context_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_DATA_PLANE_H_

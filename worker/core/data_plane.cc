// SPDX-License-Identifier: Apache-2.0
#include "worker/core/data_plane.h"

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <exception>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/base/metrics.h"
#include "common/base/status_util.h"
#include "common/tensor/buffer.h"
#include "spdlog/spdlog.h"

namespace repvar::worker {
namespace {

// gloo's Store over the coordinator. gloo expects failures as exceptions;
// they surface in GlooDataPlane::Broadcast, which catches them.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousClient* client, absl::Duration timeout)
      : client_(client), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = client_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error("rendezvous set: " + s.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_->Get(key, timeout_);
    if (!v.ok()) throw std::runtime_error("rendezvous get: " + v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    for (const std::string& k : keys) get(k);
  }

 private:
  RendezvousClient* const client_;
  const absl::Duration timeout_;
};

// Broadcast bytes this worker received from a peer over the data plane,
// counted as each piece arrives: what an operator (and a fault test) reads
// to see a broadcast under way.
void CountBroadcastReceived(uint64_t n) {
  static Counter& received = Metrics::Global().GetCounter(
      "repvar_data_plane_bytes_total", "bytes moved over the data plane (gloo), by direction",
      {{"direction", "received"}});
  received.Add(n);
}

// The first byte of the chain broadcast's slots (gloo's own collectives use
// 0x01-0x08): prefix, then the tag, then the piece.
constexpr uint64_t kChainSlotPrefix = 0x40;

uint64_t ChainSlot(uint32_t tag, size_t piece) {
  return (kChainSlotPrefix << 56) | (uint64_t{tag} << 24) | (piece & 0xffffff);
}

void ThrowIfAborted(bool completed, const char* what) {
  if (!completed) throw std::runtime_error(std::string(what) + " was aborted");
}

void ThrowIfNotArrived(const absl::Status& s) {
  if (!s.ok()) throw std::runtime_error("the root's bytes did not come: " + s.ToString());
}

// A pipelined chain: the root, then the ranks after it in order (wrapping).
// The bytes go in pieces of `piece` bytes and every member forwards a piece
// to the next as soon as it has it, so a broadcast takes about one transfer
// of the whole plus one piece per member, whatever the number of members,
// and each member sends the bytes at most once (in gloo's binomial tree the
// root sends the whole log2(members) times, its sends sharing its link).
// The root sends a piece once `arriving` (when given) says it is there, so
// the chain runs while the root's own bytes are still coming. A receiver
// feeds `received` each piece as it arrives, while it is still in cache.
// gloo's TCP pair delivers one peer's messages in order, so the k-th
// completed receive is piece k.
void ChainBroadcast(gloo::Context& ctx, const CollectiveSpec& c, size_t piece,
                    std::span<std::byte> bytes, ChecksumStream* received, ArrivingBytes* arriving) {
  const int position = (c.rank - c.root + c.size) % c.size;
  const int prev = (c.rank - 1 + c.size) % c.size;
  const int next = (c.rank + 1) % c.size;
  const bool forwards = position < c.size - 1;
  const size_t pieces = (bytes.size() + piece - 1) / piece;
  const auto timeout = absl::ToChronoMilliseconds(c.timeout);
  auto buffer = ctx.createUnboundBuffer(bytes.data(), bytes.size());
  auto offset = [&](size_t i) { return i * piece; };
  auto length = [&](size_t i) { return std::min(piece, bytes.size() - offset(i)); };
  if (position == 0) {
    for (size_t i = 0; i < pieces; ++i) {
      if (arriving != nullptr) ThrowIfNotArrived(arriving->Await(offset(i) + length(i)));
      buffer->send(next, ChainSlot(c.tag, i), offset(i), length(i));
    }
  } else {
    for (size_t i = 0; i < pieces; ++i) {
      buffer->recv(prev, ChainSlot(c.tag, i), offset(i), length(i));
    }
    for (size_t i = 0; i < pieces; ++i) {
      ThrowIfAborted(buffer->waitRecv(timeout), "a broadcast receive");
      if (forwards) buffer->send(next, ChainSlot(c.tag, i), offset(i), length(i));
      if (received != nullptr) received->Update(bytes.subspan(offset(i), length(i)));
      CountBroadcastReceived(length(i));
    }
  }
  if (forwards) {
    for (size_t i = 0; i < pieces; ++i)
      ThrowIfAborted(buffer->waitSend(timeout), "a broadcast send");
  }
}

// The first byte of the folded ring's slots; the low byte is the phase.
constexpr uint64_t kRingSlotPrefix = 0x41;

uint64_t RingSlot(uint32_t tag, uint64_t phase) {
  return (kRingSlotPrefix << 56) | (uint64_t{tag} << 24) | phase;
}

// The folded ring's working memory (FoldedRing): P + 2 segments of partial
// sums, 2 of the member's own first contributions, 1 of scratch.
struct RingBuffers {
  Buffer slots, lead, scratch;
};

// out[i] = a[i] + b[i] for `n` accumulator elements of `type` (out may be
// b): gloo::sum's arithmetic, with the contribution first, as gloo's ring
// adds the neighbour's partial sum into it.
void Sum(AccumType type, std::byte* out, const std::byte* a, const std::byte* b, size_t n) {
  auto add = [&]<typename T>(T*) {
    T* o = reinterpret_cast<T*>(out);
    const T* x = reinterpret_cast<const T*>(a);
    const T* y = reinterpret_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  };
  switch (type) {
    case AccumType::kFloat32:
      add(static_cast<float*>(nullptr));
      break;
    case AccumType::kFloat64:
      add(static_cast<double*>(nullptr));
      break;
    case AccumType::kInt64:
      add(static_cast<int64_t*>(nullptr));
      break;
  }
}

// gloo's ring allreduce (gloo/allreduce.cc, ring()) with a step's arithmetic
// folded in. The elements are cut into segments as gloo cuts them (at least
// two per member, at most 1 MiB of accumulator each, a whole number P per
// member), and the segments go around the ring in gloo's order, two in
// flight, so every sum is added in the order gloo adds it:
//
//   reduce-scatter  a member computes its contribution to a segment just
//                   before it sends it (its first P segments) or while the
//                   neighbour's partial sum for it is arriving (the
//                   others), so the contribution costs no pass of its own;
//                   after it, member r holds the whole sums of chunk r
//   apply           member r applies those sums to the begin value, into
//                   its result, each segment just before it sends it
//   allgather       the applied values (the variable's dtype: half the
//                   bytes of the sums for float16) go around the ring into
//                   every member's result
//
// No buffer of the whole size: a partial sum received in round i is
// forwarded in round i + P, so it waits in one of P + 2 segment slots,
// where it arrived (recently, so likely still in cache), and the last P are
// the member's whole sums. Each member applies 1/size of the elements,
// where Allreduce then Apply has every member apply all of them. Throws as
// gloo does.
// The folded ring as one member runs it: the segments, the slot each
// round's partial sum arrives in and the lead slot its own contribution is
// sent from, and which segment each round moves.
struct RingGeometry {
  struct Range {
    size_t lo = 0, hi = 0;
    bool empty() const { return hi <= lo; }
    size_t count() const { return hi - lo; }
  };

  RingGeometry(const CollectiveSpec& c, size_t elements, size_t accumulator_item)
      : size(static_cast<size_t>(c.size)),
        rank(static_cast<size_t>(c.rank)),
        n(elements),
        acc_item(accumulator_item),
        recv_rank(static_cast<int>((rank + 1) % size)),
        send_rank(static_cast<int>((rank + size - 1) % size)),
        segments(RingSegments(n, acc_item, size)),
        per_rank(segments / size),
        segment((n + segments - 1) / segments),
        slots(per_rank + 2),
        rounds(segments - per_rank + 2) {}

  Range range(size_t k) const {
    const size_t lo = std::min(n, (k % segments) * segment);
    return Range{lo, std::min(n, lo + segment)};
  }
  size_t slot_at(size_t i) const { return (i % slots) * segment * acc_item; }
  size_t lead_at(size_t i) const { return (i % 2) * segment * acc_item; }
  size_t bytes(const Range& x) const { return x.count() * acc_item; }

  const size_t size, rank, n, acc_item;
  const int recv_rank, send_rank;
  const size_t segments, per_rank, segment, slots, rounds;
};

using UnboundBuffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

// Reduce-scatter: each round receives a partial sum into a slot, adds this
// member's contribution (two rounds later, while the next arrives) and
// passes it on; the last per_rank slots end with this member's whole sums.
void RingReduceScatter(const RingGeometry& g, const CollectiveSpec& c, FoldedReduction& r,
                       RingBuffers& buffers, UnboundBuffer& slots_buf, UnboundBuffer& lead_buf) {
  const auto timeout = absl::ToChronoMilliseconds(c.timeout);
  const uint64_t scatter = RingSlot(c.tag, 1);
  for (size_t i = 0; i < g.rounds; ++i) {
    if (i >= 2) {
      const size_t j = i - 2;
      const RingGeometry::Range got = g.range((g.rank + 2) * g.per_rank + j);
      if (!got.empty()) {
        std::byte* partial = buffers.slots.data() + g.slot_at(j);
        r.Contribute(got.lo, got.hi, buffers.scratch.span().first(g.bytes(got)));
        ThrowIfAborted(slots_buf->waitRecv(timeout), "a ring receive");
        Sum(r.type(), partial, buffers.scratch.data(), partial, got.count());
      }
      if (!g.range((g.rank + 1) * g.per_rank + j).empty()) {
        ThrowIfAborted((j < g.per_rank ? lead_buf : slots_buf)->waitSend(timeout), "a ring send");
      }
    }
    if (i >= g.segments - g.per_rank) continue;
    const RingGeometry::Range in = g.range((g.rank + 2) * g.per_rank + i);
    if (!in.empty()) slots_buf->recv(g.recv_rank, scatter, g.slot_at(i), g.bytes(in));
    const RingGeometry::Range out = g.range((g.rank + 1) * g.per_rank + i);
    if (out.empty()) continue;
    if (i < g.per_rank) {
      r.Contribute(out.lo, out.hi, buffers.lead.span().subspan(g.lead_at(i), g.bytes(out)));
      lead_buf->send(g.send_rank, scatter, g.lead_at(i), g.bytes(out));
    } else {
      // Received in round i - P and summed in round i - P + 2 <= i.
      slots_buf->send(g.send_rank, scatter, g.slot_at(i - g.per_rank), g.bytes(out));
    }
  }
}

// Allgather: this member applies its whole sums to the begin value, and the
// applied values go around the ring into every member's result.
void RingAllGather(const RingGeometry& g, const CollectiveSpec& c, FoldedReduction& r,
                   RingBuffers& buffers, UnboundBuffer& result_buf) {
  const auto timeout = absl::ToChronoMilliseconds(c.timeout);
  const size_t item = r.item_size();
  // Member r's whole sums: segment m of chunk r arrived in round
  // segments - 2P + m.
  auto sums = [&](size_t m, const RingGeometry::Range& x) {
    return std::span<const std::byte>(
        buffers.slots.data() + g.slot_at(g.segments - 2 * g.per_rank + m), g.bytes(x));
  };
  const uint64_t gather = RingSlot(c.tag, 2);
  for (size_t i = 0; i < g.rounds; ++i) {
    if (i >= 2) {
      if (!g.range((g.rank + 1) * g.per_rank + i - 2).empty()) {
        ThrowIfAborted(result_buf->waitRecv(timeout), "a ring receive");
      }
      if (!g.range(g.rank * g.per_rank + i - 2).empty()) {
        ThrowIfAborted(result_buf->waitSend(timeout), "a ring send");
      }
    }
    if (i >= g.segments - g.per_rank) continue;
    const RingGeometry::Range in = g.range((g.rank + 1) * g.per_rank + i);
    if (!in.empty()) result_buf->recv(g.recv_rank, gather, in.lo * item, in.count() * item);
    const RingGeometry::Range out = g.range(g.rank * g.per_rank + i);
    if (out.empty()) continue;
    if (i < g.per_rank) {
      if (absl::Status s = r.Apply(out.lo, out.hi, sums(i, out)); !s.ok()) {
        throw std::runtime_error("apply: " + s.ToString());
      }
    }
    result_buf->send(g.send_rank, gather, out.lo * item, out.count() * item);
  }
}

void FoldedRing(gloo::Context& ctx, const CollectiveSpec& c, FoldedReduction& r,
                RingBuffers& buffers) {
  const RingGeometry g(c, r.elements(), AccumSize(r.type()));
  UnboundBuffer slots_buf = ctx.createUnboundBuffer(buffers.slots.data(), buffers.slots.size());
  UnboundBuffer lead_buf = ctx.createUnboundBuffer(buffers.lead.data(), buffers.lead.size());
  std::span<std::byte> result = r.result();
  UnboundBuffer result_buf = ctx.createUnboundBuffer(result.data(), result.size());
  RingReduceScatter(g, c, r, buffers, slots_buf, lead_buf);
  RingAllGather(g, c, r, buffers, result_buf);
}

// A small reduction (DataPlaneOptions::tree_max_bytes) down a binomial
// tree: log2(size) rounds up and as many down, where the ring takes
// 2 x (2 x size) rounds whose cost is each round's latency (32 members,
// 64 KiB: 128 rounds of 1 KiB). Up: in the round of bit k, a member whose
// lowest set bit is k sends its partial sum (its contribution plus those
// it received) to rank - 2^k and is done; a member below it adds what
// rank + 2^k sends, after its own contribution, so the sums are added in
// one fixed order. Member 0 then holds the whole sums, applies them to the
// begin value, and the applied values go back down the same tree into
// every member's result: every member ends with member 0's bits. Throws as
// gloo does.
void FoldedTree(gloo::Context& ctx, const CollectiveSpec& c, FoldedReduction& r, Buffer& acc,
                Buffer& received) {
  const size_t size = static_cast<size_t>(c.size);
  const size_t rank = static_cast<size_t>(c.rank);
  const size_t n = r.elements();
  const AccumType type = r.type();
  const size_t acc_bytes = n * AccumSize(type);
  const auto timeout = absl::ToChronoMilliseconds(c.timeout);
  r.Contribute(0, n, acc.span().first(acc_bytes));
  auto acc_buf = ctx.createUnboundBuffer(acc.data(), acc_bytes);
  auto received_buf = ctx.createUnboundBuffer(received.data(), acc_bytes);
  const uint64_t up = RingSlot(c.tag, 3);
  size_t mask = 1;
  for (; mask < size; mask <<= 1) {
    if ((rank & mask) != 0) {
      acc_buf->send(static_cast<int>(rank - mask), up, 0, acc_bytes);
      ThrowIfAborted(acc_buf->waitSend(timeout), "a tree send");
      break;
    }
    if (rank + mask < size) {
      received_buf->recv(static_cast<int>(rank + mask), up, 0, acc_bytes);
      ThrowIfAborted(received_buf->waitRecv(timeout), "a tree receive");
      Sum(type, acc.data(), acc.data(), received.data(), n);
    }
  }
  std::span<std::byte> result = r.result();
  auto result_buf = ctx.createUnboundBuffer(result.data(), result.size());
  const uint64_t down = RingSlot(c.tag, 4);
  if (rank == 0) {
    if (absl::Status s = r.Apply(0, n, acc.span().first(acc_bytes)); !s.ok()) {
      throw std::runtime_error("apply: " + s.ToString());
    }
  } else {
    // `mask` is the bit this member sent up on: its parent sends down on it.
    result_buf->recv(static_cast<int>(rank - mask), down, 0, result.size());
    ThrowIfAborted(result_buf->waitRecv(timeout), "a tree receive");
  }
  size_t sends = 0;
  for (mask >>= 1; mask >= 1; mask >>= 1) {
    if (rank + mask >= size) continue;
    result_buf->send(static_cast<int>(rank + mask), down, 0, result.size());
    ++sends;
  }
  for (size_t i = 0; i < sends; ++i) ThrowIfAborted(result_buf->waitSend(timeout), "a tree send");
}

}  // namespace

size_t RingSegments(size_t elements, size_t element_bytes, size_t members) {
  constexpr size_t kMaxSegmentBytes = 1 << 20;  // gloo::AllreduceOptions' default
  const size_t max_segment = std::max<size_t>(1, kMaxSegmentBytes / element_bytes);
  const size_t wanted = std::max((elements + max_segment - 1) / max_segment, members * 2);
  return (wanted + members - 1) / members * members;
}

absl::Status Collectives::ReduceApply(const CollectiveSpec& c, FoldedReduction& r) {
  const size_t n = r.elements();
  REPVAR_ASSIGN_OR_RETURN(Buffer acc, Buffer::Allocate(n * AccumSize(r.type())));
  r.Contribute(0, n, acc.span());
  REPVAR_RETURN_IF_ERROR(Allreduce(c, r.type(), acc.span()));
  return r.Apply(0, n, acc.span());
}

GlooDataPlane::GlooDataPlane(std::string hostname, RendezvousClient* store,
                             DataPlaneOptions options)
    : hostname_(std::move(hostname)), store_(store), options_(options) {}

bool GlooDataPlane::Tree(size_t sum_bytes) const { return sum_bytes <= options_.tree_max_bytes; }

bool GlooDataPlane::Chained(size_t bytes, int members) const {
  const size_t pieces = (bytes + options_.piece_bytes - 1) / options_.piece_bytes;
  return members > 2 && pieces >= options_.chain_min_pieces;
}

size_t GlooDataPlane::ChainPiece(size_t bytes) const {
  constexpr size_t kAlign = 64 << 10;  // whole pages, whatever the count
  const size_t count = std::max<size_t>(options_.chain_pieces, 1);
  const size_t piece = ((bytes + count - 1) / count + kAlign - 1) / kAlign * kAlign;
  return std::min(options_.piece_bytes, std::max(options_.min_piece_bytes, piece));
}

GlooDataPlane::~GlooDataPlane() = default;

absl::Status GlooDataPlane::Dropped(const CollectiveSpec& c, absl::string_view what,
                                    const std::exception& e) {
  context_.reset();  // a gloo error leaves the context unusable
  group_.clear();
  return absl::UnavailableError(
      absl::StrCat("data plane: ", what, " in group ", c.group, " failed: ", e.what()));
}

absl::StatusOr<std::shared_ptr<gloo::Context>> GlooDataPlane::ContextFor(const CollectiveSpec& c) {
  if (context_ != nullptr && group_ == c.group) return context_;
  context_.reset();
  group_.clear();
  try {
    if (device_ == nullptr) {
      gloo::transport::tcp::attr attr;
      attr.hostname = hostname_;
      device_ = gloo::transport::tcp::CreateDevice(attr);
    }
    StoreAdapter adapter(store_, c.timeout);
    gloo::rendezvous::PrefixStore prefixed(c.group, adapter);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(c.rank, c.size);
    ctx->setTimeout(absl::ToChronoMilliseconds(c.timeout));
    ctx->connectFullMesh(prefixed, device_);
    context_ = ctx;
    group_ = c.group;
    spdlog::info("data plane: joined group {} as rank {} of {}", c.group, c.rank, c.size);
    return context_;
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("data plane: cannot join group ", c.group, ": ", e.what()));
  }
}

absl::Status GlooDataPlane::Broadcast(const CollectiveSpec& c, std::span<std::byte> bytes,
                                      ChecksumStream* received, ArrivingBytes* arriving) {
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size || c.root < 0 || c.root >= c.size) {
    return absl::InvalidArgumentError("malformed collective");
  }
  MutexLock lock(&mu_);
  auto ctx = ContextFor(c);
  if (!ctx.ok()) return ctx.status();
  if (bytes.empty() || c.size == 1) return absl::OkStatus();
  try {
    const bool root = c.rank == c.root;
    if (Chained(bytes.size(), c.size)) {
      ChainBroadcast(**ctx, c, ChainPiece(bytes.size()), bytes, root ? nullptr : received,
                     root ? arriving : nullptr);
      return absl::OkStatus();
    }
    if (root && arriving != nullptr) ThrowIfNotArrived(arriving->Await(bytes.size()));
    gloo::BroadcastOptions opts(*ctx);
    opts.setOutput(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
    opts.setRoot(c.root);
    opts.setTag(c.tag);
    opts.setTimeout(absl::ToChronoMilliseconds(c.timeout));
    gloo::broadcast(opts);
    if (c.rank != c.root) {
      if (received != nullptr) received->Update(bytes);
      CountBroadcastReceived(bytes.size());
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Dropped(c, "broadcast", e);
  }
}

absl::Status GlooDataPlane::Allreduce(const CollectiveSpec& c, AccumType type,
                                      std::span<std::byte> bytes) {
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
    return absl::InvalidArgumentError("malformed collective");
  }
  const size_t item = AccumSize(type);
  if (bytes.size() % item != 0) return absl::InvalidArgumentError("ragged reduction buffer");
  MutexLock lock(&mu_);
  auto ctx = ContextFor(c);
  if (!ctx.ok()) return ctx.status();
  if (bytes.empty() || c.size == 1) return absl::OkStatus();
  using Fn = void (*)(void*, const void*, const void*, size_t);
  try {
    gloo::AllreduceOptions opts(*ctx);
    const size_t n = bytes.size() / item;
    // The ring: every element is summed in one fixed order (ranks are the
    // step's participants in task order), so the result repeats run to run
    // and is the same on every member.
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    switch (type) {
      case AccumType::kFloat32:
        opts.setOutput(reinterpret_cast<float*>(bytes.data()), n);
        opts.setReduceFunction(static_cast<Fn>(&gloo::sum<float>));
        break;
      case AccumType::kFloat64:
        opts.setOutput(reinterpret_cast<double*>(bytes.data()), n);
        opts.setReduceFunction(static_cast<Fn>(&gloo::sum<double>));
        break;
      case AccumType::kInt64:
        opts.setOutput(reinterpret_cast<int64_t*>(bytes.data()), n);
        opts.setReduceFunction(static_cast<Fn>(&gloo::sum<int64_t>));
        break;
    }
    opts.setTag(c.tag);
    opts.setTimeout(absl::ToChronoMilliseconds(c.timeout));
    gloo::allreduce(opts);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Dropped(c, "allreduce", e);
  }
}

absl::Status GlooDataPlane::ReduceApply(const CollectiveSpec& c, FoldedReduction& r) {
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
    return absl::InvalidArgumentError("malformed collective");
  }
  const size_t n = r.elements();
  if (r.type() == AccumType::kInt64 || c.size == 1 || n == 0) {
    return Collectives::ReduceApply(c, r);
  }
  if (r.result().size() != n * r.item_size()) {
    return absl::InvalidArgumentError("reduction result of the wrong size");
  }
  const size_t acc_item = AccumSize(r.type());
  // The working memory, outside the lock: the tree's sums and what it
  // receives, or the ring's slots.
  const bool tree = Tree(n * acc_item);
  Buffer acc, received;
  RingBuffers ring;
  if (tree) {
    REPVAR_ASSIGN_OR_RETURN(acc, Buffer::Allocate(n * acc_item));
    REPVAR_ASSIGN_OR_RETURN(received, Buffer::Allocate(n * acc_item));
  } else {
    const size_t segments = RingSegments(n, acc_item, static_cast<size_t>(c.size));
    const size_t segment_bytes = (n + segments - 1) / segments * acc_item;
    const size_t per_rank = segments / static_cast<size_t>(c.size);
    REPVAR_ASSIGN_OR_RETURN(ring.slots, Buffer::Allocate((per_rank + 2) * segment_bytes));
    REPVAR_ASSIGN_OR_RETURN(ring.lead, Buffer::Allocate(2 * segment_bytes));
    REPVAR_ASSIGN_OR_RETURN(ring.scratch, Buffer::Allocate(segment_bytes));
  }
  MutexLock lock(&mu_);
  auto ctx = ContextFor(c);
  if (!ctx.ok()) return ctx.status();
  try {
    if (tree) {
      FoldedTree(**ctx, c, r, acc, received);
    } else {
      FoldedRing(**ctx, c, r, ring);
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Dropped(c, "reduction", e);
  }
}

}  // namespace repvar::worker

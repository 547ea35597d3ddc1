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
    }
  }
  if (forwards) {
    for (size_t i = 0; i < pieces; ++i)
      ThrowIfAborted(buffer->waitSend(timeout), "a broadcast send");
  }
}

}  // namespace

GlooDataPlane::GlooDataPlane(std::string hostname, RendezvousClient* store,
                             DataPlaneOptions options)
    : hostname_(std::move(hostname)), store_(store), options_(options) {}

bool GlooDataPlane::Chained(size_t bytes, int members) const {
  const size_t pieces = (bytes + options_.piece_bytes - 1) / options_.piece_bytes;
  return members > 2 && pieces >= options_.chain_min_pieces;
}

GlooDataPlane::~GlooDataPlane() = default;

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
  absl::MutexLock lock(&mu_);
  auto ctx = ContextFor(c);
  if (!ctx.ok()) return ctx.status();
  if (bytes.empty() || c.size == 1) return absl::OkStatus();
  try {
    const bool root = c.rank == c.root;
    if (Chained(bytes.size(), c.size)) {
      ChainBroadcast(**ctx, c, options_.piece_bytes, bytes, root ? nullptr : received,
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
    if (received != nullptr && c.rank != c.root) received->Update(bytes);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    context_.reset();  // a gloo error leaves the context unusable
    group_.clear();
    return absl::UnavailableError(
        absl::StrCat("data plane: broadcast in group ", c.group, " failed: ", e.what()));
  }
}

absl::Status GlooDataPlane::Allreduce(const CollectiveSpec& c, AccumType type,
                                      std::span<std::byte> bytes) {
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
    return absl::InvalidArgumentError("malformed collective");
  }
  const size_t item = AccumSize(type);
  if (bytes.size() % item != 0) return absl::InvalidArgumentError("ragged reduction buffer");
  absl::MutexLock lock(&mu_);
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
    context_.reset();
    group_.clear();
    return absl::UnavailableError(
        absl::StrCat("data plane: allreduce in group ", c.group, " failed: ", e.what()));
  }
}

}  // namespace repvar::worker

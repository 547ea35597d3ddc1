// SPDX-License-Identifier: Apache-2.0
#include "sim/data_plane.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace repvar::sim {
namespace {

template <typename T>
void AddInto(std::span<std::byte> sum, std::span<const std::byte> part) {
  const size_t n = sum.size() / sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T a;
    T b;
    std::memcpy(&a, sum.data() + i * sizeof(T), sizeof(T));
    std::memcpy(&b, part.data() + i * sizeof(T), sizeof(T));
    a += b;
    std::memcpy(sum.data() + i * sizeof(T), &a, sizeof(T));
  }
}

void Add(AccumType type, std::span<std::byte> sum, std::span<const std::byte> part) {
  switch (type) {
    case AccumType::kFloat32:
      return AddInto<float>(sum, part);
    case AccumType::kFloat64:
      return AddInto<double>(sum, part);
    case AccumType::kInt64:
      return AddInto<int64_t>(sum, part);
  }
}

}  // namespace

absl::Status DataPlaneHub::Meet(const CollectiveSpec& c, Kind kind, AccumType type, NodeId node,
                                std::span<std::byte> bytes) {
  if (c.size <= 0 || c.rank < 0 || c.rank >= c.size) {
    return absl::InvalidArgumentError(absl::StrCat("collective rank ", c.rank, " of ", c.size));
  }
  const auto key = std::pair{c.group, c.tag};
  MutexLock lock(&mu_);
  std::shared_ptr<Meeting>& slot = meetings_[key];
  if (slot == nullptr) {
    slot = std::make_shared<Meeting>();
    slot->kind = kind;
    slot->type = type;
    slot->buffers.resize(c.size);
    slot->nodes.resize(c.size, -1);
  }
  std::shared_ptr<Meeting> m = slot;
  if (m->done || m->nodes[c.rank] >= 0 || m->kind != kind ||
      m->buffers.size() != static_cast<size_t>(c.size) ||
      (m->arrived > 0 && m->bytes != bytes.size() && kind == Kind::kAllreduce)) {
    absl::Status refused = absl::UnavailableError(absl::StrCat(
        "data plane: collective ", c.group, "/", c.tag, " does not match rank ", c.rank, "'s"));
    if (trace_) trace_(std::string(refused.message()));
    return refused;
  }
  if (m->arrived == 0) m->bytes = bytes.size();
  m->buffers[c.rank] = bytes;
  m->nodes[c.rank] = node;
  if (++m->arrived == c.size) {
    Complete(*m, static_cast<uint32_t>(c.root));
    meetings_.erase(key);
  } else {
    auto finished = [&m]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return m->done; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&finished), s_->Now() + c.timeout)) {
      m->done = true;
      m->status = absl::UnavailableError(absl::StrCat("data plane: collective ", c.group, "/",
                                                      c.tag, " timed out at rank ", c.rank, " (",
                                                      m->arrived, " of ", c.size, " arrived)"));
      if (trace_) trace_(std::string(m->status.message()));
      if (auto it = meetings_.find(key); it != meetings_.end() && it->second == m) {
        meetings_.erase(it);
      }
    }
  }
  return m->status;
}

void DataPlaneHub::Complete(Meeting& m, uint32_t root) {
  m.done = true;
  for (NodeId a : m.nodes) {
    for (NodeId b : m.nodes) {
      if (!network_->Reachable(a, b)) {
        m.status = absl::UnavailableError("data plane: members cut from each other");
        return;
      }
    }
  }
  if (m.kind == Kind::kBroadcast) {
    const std::span<std::byte> from = m.buffers.at(root);
    for (size_t r = 0; r < m.buffers.size(); ++r) {
      if (r == root) continue;
      if (m.buffers[r].size() != from.size()) {
        m.status = absl::UnavailableError("data plane: broadcast sizes differ");
        return;
      }
      std::memcpy(m.buffers[r].data(), from.data(), from.size());
    }
    return;
  }
  std::vector<std::byte> sum(m.buffers[0].begin(), m.buffers[0].end());
  for (size_t r = 1; r < m.buffers.size(); ++r) Add(m.type, sum, m.buffers[r]);
  for (std::span<std::byte> b : m.buffers) std::memcpy(b.data(), sum.data(), sum.size());
}

absl::Status SimCollectives::Broadcast(const CollectiveSpec& c, std::span<std::byte> bytes,
                                       ChecksumStream* received, worker::ArrivingBytes* arriving) {
  const bool root = c.rank == c.root;
  if (root && arriving != nullptr) {
    if (absl::Status s = arriving->Await(bytes.size()); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("data plane: the root's bytes: ", s.message()));
    }
  }
  absl::Status s = hub_->Meet(c, DataPlaneHub::Kind::kBroadcast, AccumType::kFloat32, node_, bytes);
  if (s.ok() && !root && received != nullptr) received->Update(bytes);
  return s;
}

absl::Status SimCollectives::Allreduce(const CollectiveSpec& c, AccumType type,
                                       std::span<std::byte> bytes) {
  return hub_->Meet(c, DataPlaneHub::Kind::kAllreduce, type, node_, bytes);
}

}  // namespace repvar::sim

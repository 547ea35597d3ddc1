// SPDX-License-Identifier: Apache-2.0
#include "common/tensor/local_read_table.h"

#include <time.h>

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"

namespace repvar {
namespace {

constexpr uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

size_t SlotCount(size_t wanted) { return std::bit_ceil(std::max<size_t>(wanted, 16)); }

uint64_t SlotsOffset() { return sizeof(LocalReadHeader); }

// The writer's seqlock: odd while the slot changes.
class SlotWrite {
 public:
  explicit SlotWrite(LocalReadSlot* s) : s_(s) {
    s_->seq.store(s_->seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~SlotWrite() {
    s_->seq.store(s_->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  SlotWrite(const SlotWrite&) = delete;
  SlotWrite& operator=(const SlotWrite&) = delete;

 private:
  LocalReadSlot* const s_;
};

}  // namespace

int64_t LocalReadClockNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

uint64_t LocalReadNameHash(std::string_view name) {
  const uint64_t h = Checksum(std::as_bytes(std::span(name.data(), name.size())));
  return h == 0 ? 1 : h;
}

size_t LocalReadTableBytes(size_t slot_count, size_t arena_bytes) {
  return SlotsOffset() + SlotCount(slot_count) * sizeof(LocalReadSlot) + Align8(arena_bytes);
}

LocalReadTable::LocalReadTable(std::span<std::byte> region, size_t slot_count) : region_(region) {
  const size_t slots = SlotCount(slot_count);
  const uint64_t arena_offset = SlotsOffset() + slots * sizeof(LocalReadSlot);
  REPVAR_CHECK_MSG(region.size() >= arena_offset, "local read table region too small");
  LocalReadHeader* h = header();
  h->slot_count = slots;
  h->arena_offset = arena_offset;
  h->arena_bytes = region.size() - arena_offset;
  h->epoch.store(0, std::memory_order_relaxed);
  h->lease_until_ns.store(0, std::memory_order_relaxed);
  h->suspended.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kLocalReadMagic;
  mask_ = slots - 1;
}

LocalReadSlot* LocalReadTable::slot(size_t i) const {
  return reinterpret_cast<LocalReadSlot*>(region_.data() + SlotsOffset()) + i;
}

LocalReadSlot* LocalReadTable::SlotFor(std::string_view name, uint64_t hash) {
  const std::byte* arena = region_.data() + header()->arena_offset;
  for (size_t probe = 0; probe <= mask_; ++probe) {
    LocalReadSlot* s = slot((hash + probe) & mask_);
    const uint64_t h = s->name_hash.load(std::memory_order_relaxed);
    if (h == 0) return s;
    if (h == hash && s->name_bytes.load(std::memory_order_relaxed) == name.size() &&
        std::memcmp(arena + s->meta_offset.load(std::memory_order_relaxed), name.data(),
                    name.size()) == 0) {
      return s;
    }
  }
  return nullptr;
}

std::optional<uint64_t> LocalReadTable::Take(uint64_t bytes) {
  bytes = Align8(bytes);
  if (bytes > header()->arena_bytes - arena_used_) return std::nullopt;
  const uint64_t at = arena_used_;
  arena_used_ += bytes;
  return at;
}

bool LocalReadTable::Publish(uint64_t id, std::string_view name, int64_t version,
                             const TensorSpec& spec, uint64_t checksum,
                             std::span<const std::byte> value) {
  Invalidate(id);
  if (value.size() > kLocalReadMaxValueBytes || name.empty() ||
      name.size() > kLocalReadMaxNameBytes || version <= 0) {
    return false;
  }
  const uint64_t hash = LocalReadNameHash(name);
  LocalReadSlot* s = SlotFor(name, hash);
  if (s == nullptr) return false;
  std::byte* arena = region_.data() + header()->arena_offset;
  const bool fresh = s->name_hash.load(std::memory_order_relaxed) == 0;
  // A slot keeps its name, dims and value room for the variable's next
  // versions; another spec under the same name (a variable created again)
  // takes new room.
  bool fits = !fresh && s->rank.load(std::memory_order_relaxed) == spec.dims.size() &&
              s->value_bytes.load(std::memory_order_relaxed) == value.size();
  const uint64_t dims_at = Align8(name.size());
  if (fits) {
    const auto* dims = reinterpret_cast<const int64_t*>(
        arena + s->meta_offset.load(std::memory_order_relaxed) + dims_at);
    fits = std::equal(spec.dims.begin(), spec.dims.end(), dims);
  }
  std::optional<uint64_t> meta, room;
  if (!fits) {
    meta = Take(dims_at + spec.dims.size() * sizeof(int64_t));
    room = Take(value.size());
    if (!meta || !room) return false;
  }
  SlotWrite write(s);
  if (!fits) {
    std::memcpy(arena + *meta, name.data(), name.size());
    if (!spec.dims.empty()) {
      std::memcpy(arena + *meta + dims_at, spec.dims.data(), spec.dims.size() * sizeof(int64_t));
    }
    s->meta_offset.store(*meta, std::memory_order_relaxed);
    s->name_bytes.store(name.size(), std::memory_order_relaxed);
    s->rank.store(spec.dims.size(), std::memory_order_relaxed);
    s->value_offset.store(*room, std::memory_order_relaxed);
    s->value_bytes.store(value.size(), std::memory_order_relaxed);
    s->name_hash.store(hash, std::memory_order_relaxed);
  }
  if (!value.empty()) {
    std::memcpy(arena + s->value_offset.load(std::memory_order_relaxed), value.data(),
                value.size());
  }
  s->dtype.store(static_cast<uint64_t>(spec.dtype), std::memory_order_relaxed);
  s->variable_id.store(id, std::memory_order_relaxed);
  s->checksum.store(checksum, std::memory_order_relaxed);
  s->version.store(version, std::memory_order_relaxed);
  by_id_[id] = s;
  return true;
}

void LocalReadTable::Invalidate(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  {
    SlotWrite write(it->second);
    it->second->version.store(0, std::memory_order_relaxed);
  }
  by_id_.erase(it);
}

void LocalReadTable::Clear() {
  header()->lease_until_ns.store(0, std::memory_order_relaxed);
  const bool was_suspended = suspended_;
  if (!was_suspended) Suspend();
  for (const auto& [id, s] : by_id_) s->version.store(0, std::memory_order_relaxed);
  by_id_.clear();
  if (!was_suspended) Resume();
}

void LocalReadTable::Suspend() {
  if (suspended_) return;
  suspended_ = true;
  LocalReadHeader* h = header();
  h->suspended.store(1, std::memory_order_relaxed);
  h->epoch.store(h->epoch.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_release);  // before any slot changes
}

void LocalReadTable::Resume() {
  if (!suspended_) return;
  suspended_ = false;
  LocalReadHeader* h = header();
  h->suspended.store(0, std::memory_order_relaxed);
  h->epoch.store(h->epoch.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void LocalReadTable::SetLease(int64_t until_ns) {
  header()->lease_until_ns.store(until_ns, std::memory_order_release);
}

bool LocalReadTable::Readable(uint64_t id) const { return by_id_.contains(id); }

absl::StatusOr<LocalReadView> LocalReadView::Open(std::span<const std::byte> region) {
  if (region.size() < sizeof(LocalReadHeader)) {
    return absl::DataLossError("local read table: shorter than its header");
  }
  const auto* h = reinterpret_cast<const LocalReadHeader*>(region.data());
  const uint64_t slots = h->slot_count;
  if (h->magic != kLocalReadMagic || slots == 0 || !std::has_single_bit(slots) ||
      slots > (region.size() - SlotsOffset()) / sizeof(LocalReadSlot) ||
      h->arena_offset != SlotsOffset() + slots * sizeof(LocalReadSlot) ||
      h->arena_bytes != region.size() - h->arena_offset) {
    return absl::DataLossError("local read table: not a table, or not this size");
  }
  return LocalReadView(region);
}

LocalReadView::Snapshot LocalReadView::TakeSnapshot(std::string_view name, uint64_t hash,
                                                    LocalValue& out,
                                                    std::vector<std::byte>& bytes) const {
  const LocalReadHeader* h = header();
  const uint64_t mask = h->slot_count - 1;
  const std::byte* arena = region_.data() + h->arena_offset;
  const auto* slots = reinterpret_cast<const LocalReadSlot*>(region_.data() + SlotsOffset());
  for (uint64_t probe = 0; probe <= mask; ++probe) {
    const LocalReadSlot& s = slots[(hash + probe) & mask];
    const uint64_t seq = s.seq.load(std::memory_order_acquire);
    if (seq % 2 == 1) return Snapshot::kTorn;
    const uint64_t slot_hash = s.name_hash.load(std::memory_order_relaxed);
    if (slot_hash == 0) return Snapshot::kNotReadable;
    if (slot_hash != hash) continue;
    const uint64_t meta = s.meta_offset.load(std::memory_order_relaxed);
    const uint64_t name_bytes = s.name_bytes.load(std::memory_order_relaxed);
    const uint64_t rank = s.rank.load(std::memory_order_relaxed);
    const uint64_t at = s.value_offset.load(std::memory_order_relaxed);
    const uint64_t size = s.value_bytes.load(std::memory_order_relaxed);
    // Offsets from a torn slot may point anywhere: checked before use.
    const uint64_t dims_at = Align8(name_bytes);
    if (name_bytes > kLocalReadMaxNameBytes || rank > kMaxRank || size > kLocalReadMaxValueBytes ||
        meta > h->arena_bytes || dims_at + rank * 8 > h->arena_bytes - meta ||
        at > h->arena_bytes || size > h->arena_bytes - at) {
      return Snapshot::kTorn;
    }
    const bool named =
        name_bytes == name.size() && std::memcmp(arena + meta, name.data(), name.size()) == 0;
    out.version = s.version.load(std::memory_order_relaxed);
    out.checksum = s.checksum.load(std::memory_order_relaxed);
    out.spec.dtype = static_cast<DType>(s.dtype.load(std::memory_order_relaxed));
    out.spec.dims.resize(rank);
    if (rank > 0) std::memcpy(out.spec.dims.data(), arena + meta + dims_at, rank * sizeof(int64_t));
    bytes.resize(size);
    if (size > 0) std::memcpy(bytes.data(), arena + at, size);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq) return Snapshot::kTorn;
    if (!named) continue;
    return out.version > 0 ? Snapshot::kServed : Snapshot::kNotReadable;
  }
  return Snapshot::kNotReadable;
}

}  // namespace repvar

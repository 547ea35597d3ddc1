// SPDX-License-Identifier: Apache-2.0
// The local read table (docs/architecture.md, "Local reads"): a region of a
// worker's memory, shared with the trainers on its host, that holds the
// committed value of each variable the worker may serve without the
// coordinator. One writer (the worker), any number of readers (trainers,
// each mapping the region read-only), no lock between them:
//
//   header  magic, slot count, arena place, epoch, lease_until_ns, suspended
//   slots   one per variable, open addressing on a hash of its name;
//           each a seqlock: seq is odd while the writer changes the slot
//   arena   each slot's name, dims and value bytes
//
// A read is served only when, in one snapshot of its slot (seq even and the
// same before and after), the slot is readable (version > 0) and names the
// variable, the epoch was even and unchanged over the read (it is odd while
// the table is cleared or suspended for a step), and the reader's
// CLOCK_MONOTONIC read after the snapshot is before lease_until_ns; the
// bytes then match the slot's checksum. Everything else is "ask the
// coordinator". What makes a served read linearizable is the protocol around
// the table (the coordinator's read leases), not the table.
#ifndef REPVAR_COMMON_TENSOR_LOCAL_READ_TABLE_H_
#define REPVAR_COMMON_TENSOR_LOCAL_READ_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/base/seeded_bug.h"
#include "common/tensor/tensor.h"

namespace repvar {

inline constexpr uint64_t kLocalReadMagic = 0x3164616572'6c7672;  // "rvlread1"
// Values larger than this are not kept in the table (read through the
// coordinator).
inline constexpr uint64_t kLocalReadMaxValueBytes = 64 << 10;
inline constexpr size_t kLocalReadMaxNameBytes = 1024;

struct LocalReadHeader {
  uint64_t magic;
  uint64_t slot_count;  // a power of two
  uint64_t arena_offset;
  uint64_t arena_bytes;
  std::atomic<uint64_t> epoch;          // odd while cleared or suspended
  std::atomic<int64_t> lease_until_ns;  // CLOCK_MONOTONIC; 0: no lease
  std::atomic<uint64_t> suspended;      // nonzero: nothing served until it ends
  uint64_t reserved[1];
};
static_assert(sizeof(LocalReadHeader) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct LocalReadSlot {
  std::atomic<uint64_t> seq;        // odd while written
  std::atomic<uint64_t> name_hash;  // 0: never used
  std::atomic<uint64_t> variable_id;
  std::atomic<int64_t> version;  // 0: not readable
  std::atomic<uint64_t> checksum;
  std::atomic<uint64_t> meta_offset;  // arena: name bytes, then dims (8-aligned)
  std::atomic<uint64_t> name_bytes;
  std::atomic<uint64_t> dtype;
  std::atomic<uint64_t> rank;
  std::atomic<uint64_t> value_offset;  // arena
  std::atomic<uint64_t> value_bytes;
  uint64_t reserved[5];
};
static_assert(sizeof(LocalReadSlot) == 128);

// Bytes a table of `slot_count` slots (rounded up to a power of two) and
// `arena_bytes` of names and values takes.
size_t LocalReadTableBytes(size_t slot_count, size_t arena_bytes);

// The writer's side. Not thread-safe: its owner serializes calls.
class LocalReadTable {
 public:
  // Lays the table out over `region` (LocalReadTableBytes(slot_count, ...)
  // bytes, zeroed, 64-byte aligned); no lease, nothing readable.
  LocalReadTable(std::span<std::byte> region, size_t slot_count);

  // Makes `value` the readable value of variable `id`. False (and the
  // variable not readable) when it cannot be kept: larger than
  // kLocalReadMaxValueBytes, a name too long, or no room left.
  bool Publish(uint64_t id, std::string_view name, int64_t version, const TensorSpec& spec,
               uint64_t checksum, std::span<const std::byte> value);
  // Variable `id` is no longer readable (nothing when it is not here).
  void Invalidate(uint64_t id);
  // Nothing is readable, and no lease: the epoch moves, so a read that
  // overlapped is not served.
  void Clear();
  // Nothing is served from now until Resume, whatever the slots say, in
  // one store (the epoch stays odd); slots may change meanwhile, and a read
  // that overlapped Resume is not served.
  void Suspend();
  void Resume();
  bool suspended() const { return suspended_; }
  void SetLease(int64_t until_ns);
  int64_t lease() const { return header()->lease_until_ns.load(std::memory_order_relaxed); }
  bool Readable(uint64_t id) const;
  size_t readable() const { return by_id_.size(); }
  uint64_t arena_used() const { return arena_used_; }

 private:
  LocalReadHeader* header() const { return reinterpret_cast<LocalReadHeader*>(region_.data()); }
  LocalReadSlot* slot(size_t i) const;
  // The slot `name` has (its own from before, or a free one); nullptr when
  // the table is full.
  LocalReadSlot* SlotFor(std::string_view name, uint64_t hash);
  // `bytes` of the arena, 8-aligned; nullopt when it is used up.
  std::optional<uint64_t> Take(uint64_t bytes);

  std::span<std::byte> region_;
  size_t mask_ = 0;
  uint64_t arena_used_ = 0;
  bool suspended_ = false;
  absl::flat_hash_map<uint64_t, LocalReadSlot*> by_id_;
};

// What a served read found.
struct LocalValue {
  int64_t version = 0;
  uint64_t checksum = 0;
  TensorSpec spec;
};

// The reader's side, over a mapping of the table. Thread-safe (reads only).
class LocalReadView {
 public:
  // Errors: DATA_LOSS (not a table, or a header that does not fit `region`).
  static absl::StatusOr<LocalReadView> Open(std::span<const std::byte> region);
  enum class Outcome { kServed, kNotReadable, kNoLease, kBusy };
  // Copies the committed value of `name` into `bytes` (resized) when it can
  // be served at `now_ns`, read after the slot's snapshot through
  // `monotonic_now` (CLOCK_MONOTONIC nanoseconds).
  template <typename Now>
  Outcome Read(std::string_view name, Now&& monotonic_now, LocalValue& out,
               std::vector<std::byte>& bytes) const;

 private:
  explicit LocalReadView(std::span<const std::byte> region) : region_(region) {}
  enum class Snapshot { kServed, kNotReadable, kTorn };
  Snapshot TakeSnapshot(std::string_view name, uint64_t hash, LocalValue& out,
                        std::vector<std::byte>& bytes) const;
  const LocalReadHeader* header() const {
    return reinterpret_cast<const LocalReadHeader*>(region_.data());
  }
  std::span<const std::byte> region_;
};

// The table's clock: CLOCK_MONOTONIC in nanoseconds, the same for the
// worker and the trainers of its host.
int64_t LocalReadClockNs();

// The hash slots are found by (XXH3-64 of the name, never 0).
uint64_t LocalReadNameHash(std::string_view name);

template <typename Now>
LocalReadView::Outcome LocalReadView::Read(std::string_view name, Now&& monotonic_now,
                                           LocalValue& out, std::vector<std::byte>& bytes) const {
  const uint64_t hash = LocalReadNameHash(name);
  for (int attempt = 0; attempt < 8; ++attempt) {
    const uint64_t epoch = header()->epoch.load(std::memory_order_acquire);
    const int64_t lease = header()->lease_until_ns.load(std::memory_order_acquire);
    if (epoch % 2 == 1) {
      if (header()->suspended.load(std::memory_order_relaxed) != 0) return Outcome::kNotReadable;
      continue;
    }
    const Snapshot s = TakeSnapshot(name, hash, out, bytes);
    if (s == Snapshot::kTorn) continue;
    const int64_t now = monotonic_now();
    std::atomic_thread_fence(std::memory_order_acquire);
    if (header()->epoch.load(std::memory_order_relaxed) != epoch) continue;
    if (s == Snapshot::kNotReadable) return Outcome::kNotReadable;
    if (now >= lease && !BugSeeded(SeededBug::kLocalReadsIgnoreLease)) return Outcome::kNoLease;
    if (Checksum(bytes) != out.checksum) continue;  // torn across a reuse
    return Outcome::kServed;
  }
  return Outcome::kBusy;
}

}  // namespace repvar

#endif  // REPVAR_COMMON_TENSOR_LOCAL_READ_TABLE_H_

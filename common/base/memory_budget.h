// SPDX-License-Identifier: Apache-2.0
// A bound on memory a daemon takes on behalf of its peers: bytes of tensors
// being received or computed, charged as they are actually touched (a
// message announcing 1 GiB charges nothing until its bytes arrive) and
// released when the request ends. A charge beyond the capacity is refused
// with RESOURCE_EXHAUSTED, so an overload is an error to one caller instead
// of the kernel's OOM killer for everyone.
#ifndef REPVAR_COMMON_BASE_MEMORY_BUDGET_H_
#define REPVAR_COMMON_BASE_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/base/sync.h"

namespace repvar {

class MemoryBudget {
 public:
  // A budget within `parent` (null: none): a charge must fit both (a
  // connection's share of the daemon's budget).
  explicit MemoryBudget(uint64_t capacity, MemoryBudget* parent = nullptr,
                        std::string name = "this daemon")
      : capacity_(capacity), parent_(parent), name_(std::move(name)) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `bytes` for `what` (named in the error). Errors: RESOURCE_EXHAUSTED
  // when the used bytes would exceed the capacity (or the parent's); nothing
  // is taken then.
  absl::Status Charge(uint64_t bytes, absl::string_view what);
  void Release(uint64_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    if (parent_ != nullptr) parent_->Release(bytes);
  }

  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t capacity() const { return capacity_; }

  // The memory this process may use: the machine's physical memory, or its
  // cgroup's limit when lower (a container). Nothing larger can be received.
  static uint64_t MemoryLimit();
  // Half of it: a daemon's default capacity.
  static uint64_t HalfOfMemoryLimit() { return MemoryLimit() / 2; }
  // A cgroup's memory limit from the text of cgroup v2's memory.max or v1's
  // memory.limit_in_bytes: nullopt for "max", v1's "no limit" (>= 2^62),
  // or text that is not a number.
  static std::optional<uint64_t> ParseCgroupMemoryLimit(absl::string_view text);

 private:
  const uint64_t capacity_;
  MemoryBudget* const parent_;
  const std::string name_;
  std::atomic<uint64_t> used_{0};
};

// One budget per connection (gRPC's peer string, "ipv4:host:port"), each
// within the daemon's: one client cannot take all the memory the daemon
// lends. A connection's budget lives while a request of it holds it.
// Thread-safe.
class ConnectionBudgets {
 public:
  ConnectionBudgets(MemoryBudget* daemon, uint64_t per_connection)
      : daemon_(daemon), per_connection_(per_connection) {}
  std::shared_ptr<MemoryBudget> For(const std::string& peer);

 private:
  MemoryBudget* const daemon_;
  const uint64_t per_connection_;
  Mutex mu_;
  std::map<std::string, std::weak_ptr<MemoryBudget>> budgets_ ABSL_GUARDED_BY(mu_);
};

// Bytes charged to a budget (null: unbounded) for as long as it lives;
// movable, released on destruction.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  explicit MemoryCharge(MemoryBudget* budget) : budget_(budget) {}
  MemoryCharge(MemoryCharge&& other) noexcept
      : budget_(other.budget_), bytes_(std::exchange(other.bytes_, 0)) {}
  MemoryCharge& operator=(MemoryCharge&& other) noexcept {
    if (this != &other) {
      Reset();
      budget_ = other.budget_;
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~MemoryCharge() { Reset(); }

  // Adds `bytes` to the charge. Errors: as MemoryBudget::Charge.
  absl::Status Add(uint64_t bytes, absl::string_view what) {
    if (budget_ != nullptr && bytes > 0) {
      absl::Status s = budget_->Charge(bytes, what);
      if (!s.ok()) return s;
    }
    bytes_ += bytes;
    return absl::OkStatus();
  }
  void Reset() {
    if (budget_ != nullptr && bytes_ > 0) budget_->Release(bytes_);
    bytes_ = 0;
  }
  uint64_t bytes() const { return bytes_; }

 private:
  MemoryBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_MEMORY_BUDGET_H_
